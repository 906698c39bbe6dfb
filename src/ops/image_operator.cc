#include "npurt/ops/image_operator.h"

#include <optional>

namespace npurt::ops {
namespace {

using isa::Insn;
using isa::Opcode;

bool is_op(const Insn& in, Opcode op) { return in.op == static_cast<uint8_t>(op); }

// Instructions whose operand b is an argument index (or kConstArg).
bool addresses_memory(const Insn& in) {
  return is_op(in, Opcode::kTld) || is_op(in, Opcode::kTst) || is_op(in, Opcode::kTldq) ||
         is_op(in, Opcode::kTgather) || is_op(in, Opcode::kTmv);
}

bool names_argument(const Insn& in) {
  return is_op(in, Opcode::kSpecial) && (in.sub == static_cast<uint8_t>(isa::Special::kArgValue) ||
                                         in.sub == static_cast<uint8_t>(isa::Special::kArgBytes));
}

// The code without a final EXIT: the caller of emit() ends the kernel.
std::span<const Insn> body_of(const isa::Image& image) {
  std::span<const Insn> code = image.code();
  if (!code.empty() && is_op(code.back(), Opcode::kExit)) code = code.first(code.size() - 1);
  return code;
}

// A constant load of the replayed code, whose offset register was computed for the
// image's own section at 0 and must be moved to the section's place in this kernel.
Status emit_rebased(isa::KernelBuilder& b, const Insn& in, uint32_t pc, uint32_t base) {
  if (is_op(in, Opcode::kTgather) || in.c == in.d) {
    return unimplemented("instruction " + std::to_string(pc) +
                         " reads constants without an offset register of its own, so the constant "
                         "section cannot move; fuse this kernel before any step with constants, or "
                         "dispatch it separately");
  }
  const isa::Reg offset{in.c};
  b.alui(isa::AluOp::kAdd, offset, offset, base);
  b.emit(in);
  b.alui(isa::AluOp::kSub, offset, offset, base);
  return ok_status();
}

}  // namespace

std::string ImageOperator::name() const { return p_.image.name(); }

Status ImageOperator::validate() const {
  const std::string op = "kernel '" + name() + "'";
  if (p_.grid == 0) return invalid_param(op, "grid", "must be at least 1");
  std::span<const Insn> body = body_of(p_.image);
  for (size_t pc = 0; pc < body.size(); ++pc) {
    if (is_op(body[pc], Opcode::kExit)) {
      return invalid_argument(op + ": instruction " + std::to_string(pc) +
                              " (exit) ends the block before the code does; an operator's code runs to "
                              "its end (skip work with a loop of count 0 or 1 instead)");
    }
  }
  for (const isa::ArgSpec& a : p_.image.args()) {
    if (a.is_scalar()) continue;
    const auto it = p_.elements.find(a.name);
    if (it == p_.elements.end() || it->second == 0) {
      return invalid_param(op, "elements", "needs the element count of buffer argument '" + a.name + "'");
    }
    if (it->second % isa::dtype_block_elems(a.dtype) != 0) {
      return invalid_param(op, "elements", "of '" + a.name + "' must be whole " +
                                               std::string(isa::dtype_name(a.dtype)) + " blocks of " +
                                               std::to_string(isa::dtype_block_elems(a.dtype)));
    }
  }
  for (const auto& [arg_name, count] : p_.elements) {
    bool known = false;
    for (const isa::ArgSpec& a : p_.image.args()) known |= (!a.is_scalar() && a.name == arg_name);
    if (!known) return invalid_param(op, "elements", "names '" + arg_name + "', which is no buffer argument");
  }
  return ok_status();
}

std::vector<isa::ArgSpec> ImageOperator::signature() const {
  std::vector<isa::ArgSpec> sig = p_.image.args();
  for (isa::ArgSpec& a : sig) {
    const auto it = p_.elements.find(a.name);
    if (!a.is_scalar() && it != p_.elements.end()) a.elements = it->second;
  }
  return sig;
}

StatusOr<uint32_t> ImageOperator::emit(EmitContext& ctx) const {
  isa::KernelBuilder& b = ctx.builder;
  const std::span<const uint8_t> constants = p_.image.constants();
  const uint32_t base = constants.empty() ? 0 : b.add_constants(constants);
  b.reserve_local(p_.image.layout().local_bytes);
  const std::span<const Insn> body = body_of(p_.image);
  for (uint32_t pc = 0; pc < body.size(); ++pc) {
    Insn in = body[pc];
    if (is_op(in, Opcode::kLoop)) {
      b.loop_begin(isa::Reg{in.a});
      continue;
    }
    if (is_op(in, Opcode::kEndLoop)) {
      b.loop_end();
      continue;
    }
    if (names_argument(in)) in.imm = ctx.args.at(static_cast<size_t>(in.imm));
    if (addresses_memory(in) && in.b != isa::kConstArg) in.b = ctx.args.at(in.b);
    if (addresses_memory(in) && in.b == isa::kConstArg && base != 0) {
      NPURT_RETURN_IF_ERROR(emit_rebased(b, in, pc, base).with_context("kernel '" + name() + "'"));
      continue;
    }
    b.emit(in);
  }
  return p_.grid;
}

// reference() goes through reference_checked(), which reports what the supplied
// function says; this is the same call for callers of the plain hook.
void ImageOperator::compute_reference(std::span<const HostArg> args) const { (void)reference_checked(args); }

Status ImageOperator::reference_checked(std::span<const HostArg> args) const {
  if (!p_.reference) return unimplemented("kernel '" + name() + "' was given no host reference");
  return p_.reference(args).with_context("reference of kernel '" + name() + "'");
}

}  // namespace npurt::ops
