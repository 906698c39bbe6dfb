// libFuzzer entry point for operator sequences.
//
// The bytes decode into a sequence specification: a few steps of small operators
// from the ops library with parameters from the bytes (sizes may be 0, odd or huge),
// bindings drawn from a few buffer and scalar names (whole, sliced, or malformed
// slices), buffer sizes that fit, are missing, zero or wrong, input and output lists,
// and a dispatch mode. It is compiled against one small simulated NPU shared by every
// input, and a compiled sequence is called once with scalars from the bytes.
//
// compile() and call() must answer with a sequence or a Status whose message says
// why; crashes, sanitizer reports, leaks and hangs are bugs. Since the runtime lives
// across inputs, a known-good sequence also compiles, runs and matches the host
// every kCheckPeriod inputs: an input must not leave the runtime unusable (device
// memory lost, a stream stuck, the code registry broken).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "npurt/graph/operator_sequence.h"
#include "npurt/ops/argmax.h"
#include "npurt/ops/copy.h"
#include "npurt/ops/elementwise.h"
#include "npurt/ops/gemv.h"
#include "npurt/ops/rmsnorm.h"
#include "npurt/ops/rope.h"
#include "npurt/ops/softmax.h"
#include "npurt/runtime/runtime.h"

namespace npurt::graph {
namespace {

using isa::DType;

constexpr uint64_t kCheckPeriod = 64;
constexpr size_t kMaxSteps = 4;

void check(bool ok) {
  if (!ok) std::abort();
}

// Every input shares this runtime, as every sequence of a process does.
Runtime& runtime() {
  static const std::shared_ptr<Runtime>* rt = [] {
    const hal::DeviceSpec spec{.cores = 4, .memory_bytes = 64ull << 20, .settings = {{"host_threads", "2"}}};
    StatusOr<std::shared_ptr<Runtime>> r = Runtime::create("sim", spec);
    check(r.ok());
    return new std::shared_ptr<Runtime>(std::move(r).value());  // lives until exit
  }();
  return **rt;
}

// The fuzz bytes as a stream of choices; an exhausted stream answers zeros.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> bytes) : bytes_(bytes) {}
  uint8_t byte() {
    if (bytes_.empty()) return 0;
    const uint8_t b = bytes_[0];
    bytes_ = bytes_.subspan(1);
    return b;
  }
  bool flag() { return byte() & 1; }
  uint32_t small(uint32_t limit) { return byte() % (limit + 1); }
  // A size: mostly 0..limit, sometimes one of the edges the operators must refuse
  // or survive (odd block counts, 32-bit and 64-bit overflows).
  uint64_t size(uint64_t limit) {
    static constexpr uint64_t kEdges[] = {1, 3, 31, 33, 255, 4097, 65537, 1ull << 31, (1ull << 32) + 1,
                                          1ull << 62, std::numeric_limits<uint64_t>::max()};
    const uint8_t b = byte();
    if (b < 0xF0) return b % (limit + 1);
    return kEdges[b % std::size(kEdges)];
  }
  uint32_t size32(uint32_t limit) { return static_cast<uint32_t>(std::min<uint64_t>(size(limit), UINT32_MAX)); }
  DType dtype() {
    static constexpr DType kTypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kI32,
                                       DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ6_K};
    return kTypes[byte() % std::size(kTypes)];
  }
  std::span<const uint8_t> rest() const { return bytes_; }

 private:
  std::span<const uint8_t> bytes_;
};

std::shared_ptr<const ops::Operator> decode_op(Reader& r) {
  switch (r.byte() % 8) {
    case 0:
      return std::make_shared<ops::Elementwise>(ops::ElementwiseParams{
          .kind = static_cast<ops::ElementwiseKind>(r.small(4)), .n = r.size(96), .dtype = r.dtype(),
          .tile = r.size32(8), .cores = r.small(5), .row_elems = r.flag() ? r.size(8) : 0});
    case 1:
      return std::make_shared<ops::RmsNorm>(ops::RmsNormParams{
          .rows = r.size(4), .dim = r.size32(64), .eps = 1e-6f, .weighted = r.flag(), .dtype = r.dtype(),
          .rows_per_tile = r.small(3), .cores = r.small(5), .rows_runtime = r.flag()});
    case 2: {
      ops::SoftmaxParams p{.rows = r.size(6), .cols = r.size32(40), .causal = r.flag(), .window = r.small(8)};
      if (r.flag()) p.offset = static_cast<int8_t>(r.byte());
      p.rows_per_tile = r.small(3);
      p.cores = r.small(5);
      return std::make_shared<ops::Softmax>(p);
    }
    case 3:
      return std::make_shared<ops::Gemv>(ops::GemvParams{
          .m = r.size(24), .k = r.flag() ? 32 * r.small(3) : r.size(40), .weight = r.dtype(),
          .epilogue = static_cast<ops::GemvEpilogue>(r.small(2)), .rows_per_tile = r.small(8),
          .k_tile = r.small(1) * 32, .cores = r.small(5)});
    case 4:
      return std::make_shared<ops::Copy>(ops::CopyParams{
          .n = r.size(96), .src_dtype = r.dtype(), .dst_dtype = r.dtype(), .tile = r.size32(8), .cores = r.small(5)});
    case 5:
      return std::make_shared<ops::Rope>(ops::RopeParams{
          .n_heads = r.size32(4), .head_dim = r.size32(16), .rotary_dim = r.small(16), .heads_per_tile = r.small(2),
          .cores = r.small(5), .tokens = r.small(3)});
    case 6:
      return std::make_shared<ops::Argmax>(
          ops::ArgmaxParams{.n = r.size(96), .chunk = r.size32(16), .with_value = r.flag(), .index_base = r.size(4)});
    default:
      return std::make_shared<ops::StridedCopy>(ops::StridedCopyParams{
          .rows = r.size(4), .cols = r.size32(12), .src_stride = r.size(16), .dst_stride = r.size(16),
          .dst_rows = r.size(6), .src_rows = r.size(6), .dst_row_runtime = r.flag(), .src_row_runtime = r.flag(),
          .rows_runtime = r.flag(), .src_dtype = r.dtype(), .dst_dtype = r.dtype()});
  }
}

const char* const kBuffers[] = {"a", "b", "c", "d", "e", "f"};
const char* const kScalars[] = {"pos", "rows", "base", "dst_row", "src_row"};
// Bindings compile() must refuse with a message: malformed slices, empty names,
// numbers past 64 bits.
const char* const kMalformed[] = {"a[",      "a[5:2]", "a[a:b]", "a[:3]",   "a[3:]",    "[0:4]",
                                  "a[0:4]x", "",       "a]",     "a[-1:2]", "a[0x1:2]", "a[1:2][3:4]",
                                  "a[18446744073709551616:18446744073709551617]", "a[0:18446744073709551615]"};

// What the spec builder knows of one buffer name: the element count that would fit
// every binding of it seen so far (the largest slice end or whole length).
struct NameUse {
  uint64_t fit = 0;
  bool written = false, read = false;
};

std::string decode_binding(Reader& r, const isa::ArgSpec& arg, std::map<std::string, NameUse>& uses) {
  const uint8_t sel = r.byte();
  const uint8_t kind = sel >> 5, index = sel & 7;
  if (arg.is_scalar()) {
    if (kind == 7) return kBuffers[index % std::size(kBuffers)];  // a buffer name as a scalar
    return kScalars[index % std::size(kScalars)];
  }
  std::string name = kind == 7 ? kScalars[index % std::size(kScalars)] : kBuffers[index % std::size(kBuffers)];
  std::string binding = name;
  uint64_t end = arg.elements;
  if (kind == 5) {  // a slice, usually of the right length
    const uint64_t first = r.small(63);
    const uint64_t length = r.flag() ? r.size(64) : arg.elements;
    end = first + length;
    binding = name + "[" + std::to_string(first) + ":" + std::to_string(end) + "]";
  } else if (kind == 6) {
    return kMalformed[r.byte() % std::size(kMalformed)];
  }
  NameUse& u = uses[name];
  u.fit = std::max(u.fit, end);
  u.written |= arg.writes();
  u.read |= arg.reads();
  return binding;
}

struct Spec {
  std::vector<SequenceStep> steps;
  std::vector<std::string> inputs, outputs;
  std::map<std::string, uint64_t> sizes;
  Dispatch dispatch = Dispatch::kFused;
  Scalars scalars;
};

Spec decode_spec(Reader& r) {
  Spec s;
  s.dispatch = r.flag() ? Dispatch::kSeparate : Dispatch::kFused;
  std::map<std::string, NameUse> uses;
  const size_t steps = 1 + r.small(kMaxSteps - 1);
  for (size_t i = 0; i < steps; ++i) {
    SequenceStep st{decode_op(r), {}};
    if (st.op->validate().ok()) {
      for (const isa::ArgSpec& arg : st.op->signature()) st.bindings.push_back(decode_binding(r, arg, uses));
      const uint8_t miscount = r.byte();  // 0xFF: a binding too few, 0xFE: one too many
      if (miscount == 0xFF && !st.bindings.empty()) st.bindings.pop_back();
      if (miscount == 0xFE) st.bindings.push_back("a");
    } else {
      // Its signature is meaningless; compile() must stop at validate().
      st.bindings.assign(r.small(3), "a");
    }
    s.steps.push_back(std::move(st));
  }
  for (const auto& [name, use] : uses) {
    switch (r.byte() % 8) {
      case 5:
        break;  // missing
      case 6:
        s.sizes[name] = 0;
        break;
      case 7:
        s.sizes[name] = r.size(128);
        break;
      default:
        s.sizes[name] = use.fit;
    }
  }
  if (r.byte() % 4 == 0) {  // lists from the bytes, names known or not
    for (auto* list : {&s.inputs, &s.outputs}) {
      for (uint32_t n = r.small(3); n > 0; --n) {
        const uint8_t b = r.byte();
        list->push_back(b < 0xF0 ? kBuffers[b % std::size(kBuffers)] : b % 2 ? "zz" : "");
      }
    }
  } else {  // the natural lists: read-only buffers in, some written ones out
    for (const auto& [name, use] : uses) {
      if (!use.written) s.inputs.push_back(name);
      else if (r.flag()) s.outputs.push_back(name);
    }
  }
  for (const char* name : kScalars) {
    const uint8_t b = r.byte();
    switch (b % 8) {
      case 0:
        break;  // missing
      case 1:
      case 2:
      case 3:
        s.scalars[name] = int64_t{static_cast<int8_t>(r.byte())};
        break;
      case 4:
        s.scalars[name] = static_cast<double>(static_cast<int8_t>(r.byte())) / 4;
        break;
      case 5: {
        static constexpr int64_t kEdges[] = {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                                             1ll << 31, -(1ll << 31) - 1, 1ll << 32, -1};
        s.scalars[name] = kEdges[r.byte() % std::size(kEdges)];
        break;
      }
      case 6: {
        static constexpr double kEdges[] = {std::numeric_limits<double>::quiet_NaN(),
                                            std::numeric_limits<double>::infinity(), -1e300, 1e300};
        s.scalars[name] = kEdges[r.byte() % std::size(kEdges)];
        break;
      }
      default:
        s.scalars[name] = int64_t{r.byte()};
    }
  }
  return s;
}

// Fills every input with bytes from the tail of the fuzz input (zeros when it runs
// out), so calls see arbitrary values, NaN and Inf included.
void write_inputs(CompiledSequence& seq, const Spec& s, std::span<const uint8_t> data) {
  for (const std::string& in : s.inputs) {
    StatusOr<View> v = seq.get_buffer(in);
    if (!v.ok()) continue;
    StatusOr<WriteGuard> g = runtime().memory().overwrite(*v);
    check(g.ok());
    std::span<uint8_t> bytes = g->bytes();
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = data.empty() ? 0 : data[i % data.size()];
  }
}

// A known-good two-step sequence, out = (a + b) * a, against the host.
void check_runtime_usable(Dispatch dispatch) {
  constexpr uint64_t n = 37;
  auto add = std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = ops::ElementwiseKind::kAdd, .n = n});
  auto mul = std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = ops::ElementwiseKind::kMul, .n = n});
  const OperatorSequence good("health", {{add, {"a", "b", "t"}}, {mul, {"t", "a", "out"}}}, {"a", "b"}, {"out"},
                              {{"a", n}, {"b", n}, {"t", n}, {"out", n}}, dispatch);
  StatusOr<std::unique_ptr<CompiledSequence>> seq = good.compile(runtime());
  check(seq.ok());
  std::vector<float> a(n), b(n);
  for (uint64_t i = 0; i < n; ++i) {
    a[i] = 0.5f * static_cast<float>(i) - 7.0f;
    b[i] = 3.0f - 0.25f * static_cast<float>(i);
  }
  for (const auto& [name, values] : {std::pair{"a", &a}, std::pair{"b", &b}}) {
    StatusOr<View> v = (*seq)->get_buffer(name);
    check(v.ok());
    StatusOr<WriteGuard> g = runtime().memory().overwrite(*v);
    check(g.ok() && g->bytes().size() == n * sizeof(float));
    std::memcpy(g->bytes().data(), values->data(), n * sizeof(float));
  }
  check((*seq)->call().ok());
  StatusOr<View> out = (*seq)->get_buffer("out");
  check(out.ok());
  StatusOr<ReadGuard> g = runtime().memory().read(*out);
  check(g.ok() && g->bytes().size() == n * sizeof(float));
  std::vector<float> got(n);
  std::memcpy(got.data(), g->bytes().data(), n * sizeof(float));
  for (uint64_t i = 0; i < n; ++i) {
    const float want = (a[i] + b[i]) * a[i];
    check(std::fabs(got[i] - want) <= 1e-6f * std::fabs(want));
  }
}

void fuzz_one(std::span<const uint8_t> data) {
  Reader r(data);
  const Spec s = decode_spec(r);
  const OperatorSequence seq("fuzz", s.steps, s.inputs, s.outputs, s.sizes, s.dispatch);
  StatusOr<std::unique_ptr<CompiledSequence>> compiled = seq.compile(runtime());
  if (!compiled.ok()) {
    check(!compiled.status().message().empty());  // every rejection must say why
    return;
  }
  write_inputs(**compiled, s, r.rest());
  const Status called = (*compiled)->call(s.scalars);
  check(called.ok() || !called.message().empty());
  // Any binding string resolves to a view or an error.
  const std::string probe = r.flag() ? kMalformed[r.byte() % std::size(kMalformed)]
                                     : std::string(kBuffers[r.byte() % std::size(kBuffers)]) + "[1:" +
                                           std::to_string(r.size(64)) + "]";
  StatusOr<View> v = (*compiled)->get_buffer(probe);
  check(v.ok() || !v.status().message().empty());
}

// Checks the runtime every kCheckPeriod inputs, from the first on.
void fuzz_input(std::span<const uint8_t> data) {
  static uint64_t inputs = 0;
  if (inputs % kCheckPeriod == 0) {
    check_runtime_usable(inputs / kCheckPeriod % 2 ? Dispatch::kSeparate : Dispatch::kFused);
  }
  ++inputs;
  fuzz_one(data);
}

}  // namespace
}  // namespace npurt::graph

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  npurt::graph::fuzz_input({data, size});
  return 0;
}
