#include "cli/soak_workloads.h"

#include <algorithm>
#include <cstring>

#include "npurt/isa/numeric.h"
#include "npurt/ops/rmsnorm.h"
#include "npurt/ops/softmax.h"

namespace npurt::cli::soak {

using isa::DType;

namespace {

// Small shapes: the soak is about many device operations, not about big ones.
constexpr uint64_t kHidden = 256;   // rmsnorm width, gemv columns
constexpr uint64_t kProjRows = 128;  // rows of the bf16 projection
constexpr uint64_t kRunRows = 64;    // rows of the f32 gemv (sequence and Worker runs)
constexpr uint64_t kSoftmaxRows = 8, kSoftmaxCols = 64;

struct WeightShape {
  const char* name;
  DType dtype;
  uint64_t elements;
};
constexpr WeightShape kWeights[] = {
    {"w_norm", DType::kF32, kHidden},
    {"w_proj", DType::kBF16, kProjRows * kHidden},
    {"w_f32", DType::kF32, kRunRows * kHidden},
    {"bias", DType::kF32, kRunRows},
};

StatusOr<SharedWeight> make_weight(MemoryContext& memory, const WeightShape& shape, std::mt19937_64& rng) {
  SharedWeight w{shape.name, shape.dtype, shape.elements, random_values(rng, shape.dtype, shape.elements), {}};
  NPURT_ASSIGN_OR_RETURN(w.buffer, memory.create_buffer(w.host.size(), {.name = w.name}));
  NPURT_ASSIGN_OR_RETURN(WriteGuard guard, memory.overwrite(w.buffer.view()));
  std::memcpy(guard.bytes().data(), w.host.data(), w.host.size());
  return w;
}

// rmsnorm -> bf16 gemv -> add: the shape of a transformer block's projection.
SequenceWorkload mlp_workload(graph::Dispatch dispatch) {
  auto norm = std::make_shared<ops::RmsNorm>(ops::RmsNormParams{.rows = 1, .dim = kHidden});
  auto proj = std::make_shared<ops::Gemv>(ops::GemvParams{.m = kProjRows, .k = kHidden, .weight = DType::kBF16});
  auto add = std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = ops::ElementwiseKind::kAdd, .n = kProjRows});
  const bool fused = dispatch == graph::Dispatch::kFused;
  SequenceWorkload w;
  w.name = fused ? "mlp fused" : "mlp separate";
  w.spec = std::make_unique<graph::OperatorSequence>(
      w.name, std::vector<graph::SequenceStep>{{norm, {"x", "w_norm", "h"}}, {proj, {"w_proj", "h", "y"}}, {add, {"y", "r", "out"}}},
      std::vector<std::string>{"x", "r"}, std::vector<std::string>{"out"},
      std::map<std::string, uint64_t>{{"x", kHidden}, {"w_norm", kHidden}, {"h", kHidden}, {"w_proj", kProjRows * kHidden},
                                      {"y", kProjRows}, {"r", kProjRows}, {"out", kProjRows}},
      dispatch);
  w.inputs = {{"x", kHidden}, {"r", kProjRows}};
  w.output = "out";
  w.output_elements = kProjRows;
  w.weights = {"w_norm", "w_proj"};
  return w;
}

SequenceWorkload softmax_workload() {
  auto softmax = std::make_shared<ops::Softmax>(ops::SoftmaxParams{.rows = kSoftmaxRows, .cols = kSoftmaxCols});
  constexpr uint64_t n = kSoftmaxRows * kSoftmaxCols;
  SequenceWorkload w;
  w.name = "softmax";
  w.spec = std::make_unique<graph::OperatorSequence>(
      w.name, std::vector<graph::SequenceStep>{{softmax, {"x", "out"}}}, std::vector<std::string>{"x"},
      std::vector<std::string>{"out"}, std::map<std::string, uint64_t>{{"x", n}, {"out", n}}, graph::Dispatch::kFused);
  w.inputs = {{"x", n}};
  w.output = "out";
  w.output_elements = n;
  return w;
}

SequenceWorkload gemv_f32_workload() {
  auto gemv = std::make_shared<ops::Gemv>(ops::GemvParams{.m = kRunRows, .k = kHidden});
  SequenceWorkload w;
  w.name = "gemv f32";
  w.spec = std::make_unique<graph::OperatorSequence>(
      w.name, std::vector<graph::SequenceStep>{{gemv, {"w_f32", "x", "out"}}}, std::vector<std::string>{"x"},
      std::vector<std::string>{"out"},
      std::map<std::string, uint64_t>{{"w_f32", kRunRows * kHidden}, {"x", kHidden}, {"out", kRunRows}},
      graph::Dispatch::kSeparate);
  w.inputs = {{"x", kHidden}};
  w.output = "out";
  w.output_elements = kRunRows;
  w.weights = {"w_f32"};
  return w;
}

Status compile_workload(Runtime& runtime, const SharedWeights& weights, SequenceWorkload& w) {
  graph::CompileOptions options;
  for (const std::string& name : w.weights) options.shared.emplace(name, weights.get(name).buffer.view());
  NPURT_ASSIGN_OR_RETURN(w.compiled, w.spec->compile(runtime, options));
  return ok_status();
}

// References take mutable spans for every argument but only write their outputs.
std::span<uint8_t> mutable_span(const Bytes& b) { return {const_cast<uint8_t*>(b.data()), b.size()}; }

}  // namespace

Bytes random_values(std::mt19937_64& rng, DType dtype, uint64_t n) {
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  std::vector<float> values(n);
  for (float& v : values) v = uniform(rng);
  Bytes bytes(isa::dtype_bytes(dtype, n));
  isa::from_f32(values.data(), dtype, bytes.data(), n);
  return bytes;
}

StatusOr<SharedWeights> SharedWeights::make(MemoryContext& memory, std::mt19937_64& rng) {
  SharedWeights weights;
  for (const WeightShape& shape : kWeights) {
    NPURT_ASSIGN_OR_RETURN(SharedWeight w, make_weight(memory, shape, rng));
    weights.weights_.push_back(std::move(w));
  }
  return weights;
}

const SharedWeight& SharedWeights::get(const std::string& name) const {
  auto it = std::find_if(weights_.begin(), weights_.end(), [&](const SharedWeight& w) { return w.name == name; });
  NPURT_CHECK(it != weights_.end());  // the names are the soak's own
  return *it;
}

StatusOr<std::vector<SequenceWorkload>> make_sequences(Runtime& runtime, const SharedWeights& weights) {
  std::vector<SequenceWorkload> all;
  all.push_back(mlp_workload(graph::Dispatch::kFused));
  all.push_back(mlp_workload(graph::Dispatch::kSeparate));
  all.push_back(softmax_workload());
  all.push_back(gemv_f32_workload());
  for (SequenceWorkload& w : all) NPURT_RETURN_IF_ERROR(compile_workload(runtime, weights, w));
  return all;
}

StatusOr<Bytes> sequence_reference(const SequenceWorkload& w, const SharedWeights& weights,
                                   const HostBuffers& inputs) {
  HostBuffers buffers = inputs;
  for (const std::string& name : w.weights) buffers[name] = weights.get(name).host;
  NPURT_RETURN_IF_ERROR(w.spec->run_reference(buffers));
  return buffers[w.output];
}

StatusOr<RunKernels> RunKernels::make(Runtime& runtime) {
  ops::Gemv gemv({.m = kRunRows, .k = kHidden});
  ops::Elementwise add({.kind = ops::ElementwiseKind::kAdd, .n = kRunRows});
  const ops::Target target = ops::Target::of(runtime.device().info());
  NPURT_ASSIGN_OR_RETURN(ops::Kernel gemv_kernel, gemv.compile(target));
  NPURT_ASSIGN_OR_RETURN(ops::Kernel add_kernel, add.compile(target));
  RunKernels k(std::move(gemv), std::move(add), std::move(gemv_kernel), std::move(add_kernel));
  for (const ops::Kernel* kernel : {&k.gemv_kernel_, &k.add_kernel_}) {
    NPURT_ASSIGN_OR_RETURN(exec::CodeHandle code, runtime.registry().register_image(kernel->image));
    k.code_.push_back(std::move(code));
  }
  return k;
}

Status RunKernels::launch(MemoryContext& memory, exec::RunContext& ctx, const SharedWeights& weights, const View& x,
                          const View& h, const View& y) const {
  const LaunchArg gemv_args[] = {LaunchArg::input(weights.get("w_f32").buffer.view()), LaunchArg::input(x),
                                 LaunchArg::output(h)};
  NPURT_RETURN_IF_ERROR(memory.launch(ctx.stream(), code_[0], gemv_kernel_.grid, gemv_args));
  const LaunchArg add_args[] = {LaunchArg::input(h), LaunchArg::input(weights.get("bias").buffer.view()),
                                LaunchArg::output(y)};
  return memory.launch(ctx.stream(), code_[1], add_kernel_.grid, add_args);
}

StatusOr<Bytes> RunKernels::reference(const SharedWeights& weights, const Bytes& x) const {
  Bytes h(output_elements() * sizeof(float)), y(h.size());
  const ops::HostArg gemv_args[] = {ops::HostArg::buffer(mutable_span(weights.get("w_f32").host)),
                                    ops::HostArg::buffer(mutable_span(x)), ops::HostArg::buffer(h)};
  NPURT_RETURN_IF_ERROR(gemv_.reference(gemv_args));
  const ops::HostArg add_args[] = {ops::HostArg::buffer(h), ops::HostArg::buffer(mutable_span(weights.get("bias").host)),
                                   ops::HostArg::buffer(y)};
  NPURT_RETURN_IF_ERROR(add_.reference(add_args));
  return y;
}

}  // namespace npurt::cli::soak
