#include "npurt/ops/operator.h"

#include <bit>

#include "npurt/isa/numeric.h"

namespace npurt::ops {

HostArg HostArg::f32(float v) { return {{}, std::bit_cast<uint32_t>(v), true}; }

float HostArg::as_f32() const { return std::bit_cast<float>(static_cast<uint32_t>(bits)); }

Status invalid_param(std::string_view op, std::string_view param, std::string_view why) {
  return invalid_argument(                std::string(op) + ": parameter '" + std::string(param) + "' " + std::string(why));
}

uint8_t EmitContext::arg(std::string_view name) const {
  for (size_t i = 0; i < signature.size(); ++i) {
    if (signature[i].name == name) return args[i];
  }
  NPURT_CHECK(false && "operator code asks for an argument its signature lacks");
  return 0;
}

StatusOr<Kernel> Operator::compile(const Target& target) const {
  NPURT_RETURN_IF_ERROR(validate());
  if (target.cores == 0) return invalid_param(name(), "target.cores", "must be > 0");
  isa::KernelBuilder b(name());
  EmitContext ctx{b, target, signature(), {}};
  for (const isa::ArgSpec& a : ctx.signature) {
    ctx.args.push_back(a.is_scalar() ? b.arg_scalar(a.name, a.dtype) : b.arg_buffer(a.name, a.access, a.dtype));
  }
  NPURT_ASSIGN_OR_RETURN_CTX(const uint32_t grid, emit(ctx), "compiling " + name());
  if (grid == 0) return internal_error(name() + ": empty grid");
  b.exit();
  NPURT_ASSIGN_OR_RETURN_CTX(isa::Image image, b.build(target.local_bytes), "compiling " + name());
  return Kernel{std::move(image), grid, std::move(ctx.signature)};
}

Status Operator::reference(std::span<const HostArg> args) const {
  NPURT_RETURN_IF_ERROR(validate());
  const std::vector<isa::ArgSpec> sig = signature();
  if (args.size() != sig.size()) {
    return invalid_argument(name() + ": reference needs " + std::to_string(sig.size()) +
                                                    " arguments, got " + std::to_string(args.size()));
  }
  for (size_t i = 0; i < sig.size(); ++i) {
    if (args[i].is_scalar != sig[i].is_scalar()) {
      return invalid_argument(name() + ": argument '" + sig[i].name + "' must be a " +
                                                      (sig[i].is_scalar() ? "scalar" : "buffer"));
    }
    if (!sig[i].is_scalar() && args[i].bytes.size() != sig[i].bytes()) {
      return invalid_argument(                    name() + ": argument '" + sig[i].name + "' needs " + std::to_string(sig[i].bytes()) +
                        " bytes, got " + std::to_string(args[i].bytes.size()));
    }
  }
  return reference_checked(args);
}

std::vector<float> read_f32(const HostArg& arg, isa::DType dtype) { return isa::to_f32(arg.bytes, dtype); }

void write_f32(const HostArg& arg, isa::DType dtype, std::span<const float> values) {
  isa::from_f32(values.data(), dtype, arg.bytes.data(), values.size());
}

}  // namespace npurt::ops
