// OpHarness: runs one operator on a fresh simulated device and its host reference on
// the same inputs, for the operator tests; and the checks those tests share.
//
// Inputs not set explicitly get fresh random data from the seed: plain types uniform
// in [-1, 1), quantized types random blocks with small finite scales. Every output
// buffer is poisoned (all bytes 0xFF: NaN for float types, -1 for i32) on both sides
// before the run, so an element the kernel never writes shows up as NaN.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "npurt/base/math.h"
#include "npurt/hal/sim/sim_device.h"
#include "npurt/isa/numeric.h"
#include "npurt/ops/operator.h"
#include "ops/random_inputs.h"

namespace npurt::testing {

// ||got - want|| / ||want|| where elements the reference leaves as poison (NaN) must be
// NaN in `got` too (otherwise +inf) and are left out of the sums.
inline double poisoned_rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i])) {
      if (!std::isnan(got[i])) return INFINITY;
      continue;
    }
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  if (den == 0) return num == 0 ? 0 : INFINITY;
  return std::sqrt(num / den);
}

// A launch argument of LoadedOp::launch: one of the buffers passed (several arguments
// may share one), or a scalar.
struct Bind {
  size_t buffer = 0;
  std::optional<hal::KernelArg> scalar;
  static Bind to(size_t buffer) { return {buffer, std::nullopt}; }
  static Bind value(hal::KernelArg scalar) { return {0, scalar}; }
};

// One compiled operator resident on a fresh simulated device, its stream created after
// the upload: for tests that bind the arguments themselves (in-place runs, say).
struct LoadedOp {
  std::shared_ptr<hal::Device> dev;
  ops::Kernel kernel;
  hal::DeviceAddr code{};
  hal::StreamId stream{};

  // Uploads `buffers` to fresh device buffers, launches with kernel argument i bound
  // as args[i] says, and returns the buffers with what the kernel wrote through its
  // out and inout arguments copied back; the device buffers are freed again.
  StatusOr<std::vector<Bytes>> launch(std::vector<Bytes> buffers, const std::vector<Bind>& args) {
    hal::Device& d = *dev;
    std::vector<hal::DeviceAddr> addrs;
    for (const Bytes& b : buffers) {
      NPURT_ASSIGN_OR_RETURN(hal::DeviceAddr a, d.allocate(std::max<uint64_t>(b.size(), 1)));
      NPURT_RETURN_IF_ERROR(d.copy_to_device(stream, a, b.data(), b.size()));
      addrs.push_back(a);
    }
    hal::LaunchParams p{code, kernel.grid, {}};
    for (const Bind& a : args) {
      p.args.push_back(a.scalar ? *a.scalar : hal::KernelArg::buffer(addrs[a.buffer], buffers[a.buffer].size()));
    }
    NPURT_RETURN_IF_ERROR(d.launch(stream, p));
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i].scalar || !kernel.args[i].writes()) continue;
      Bytes& b = buffers[args[i].buffer];
      NPURT_RETURN_IF_ERROR(d.copy_to_host(stream, b.data(), addrs[args[i].buffer], b.size()));
    }
    NPURT_RETURN_IF_ERROR(d.stream_synchronize(stream));
    for (hal::DeviceAddr a : addrs) NPURT_RETURN_IF_ERROR(d.free(a));
    return buffers;
  }
};

inline StatusOr<LoadedOp> load_op(const ops::Operator& op, hal::SimOptions options = {}) {
  NPURT_ASSIGN_OR_RETURN(std::shared_ptr<hal::Device> dev, hal::create_sim_device(options));
  NPURT_ASSIGN_OR_RETURN(ops::Kernel kernel, op.compile(ops::Target::of(dev->info())));
  NPURT_ASSIGN_OR_RETURN(hal::DeviceAddr code, dev->allocate(kernel.image.bytes().size()));
  NPURT_RETURN_IF_ERROR(dev->upload_code(code, kernel.image));
  NPURT_ASSIGN_OR_RETURN(hal::StreamId stream, dev->create_stream());
  return LoadedOp{std::move(dev), std::move(kernel), code, stream};
}

class OpHarness {
 public:
  explicit OpHarness(const ops::Operator& op, uint32_t seed = 1, hal::SimOptions options = {})
      : op_(op), rng_(seed), options_(options) {}

  void set_bytes(const std::string& name, Bytes b) { inputs_[name] = std::move(b); }
  void set_f32(const std::string& name, const std::vector<float>& v) {
    const isa::ArgSpec a = arg(name);
    Bytes b(a.bytes());
    isa::from_f32(v.data(), a.dtype, b.data(), v.size());
    inputs_[name] = std::move(b);
  }
  void set_scalar(const std::string& name, ops::HostArg v) { scalars_[name] = v; }

  // Compiles for the device's target, runs on the device and the reference.
  Status run() {
    NPURT_ASSIGN_OR_RETURN(LoadedOp loaded, load_op(op_, options_));
    grid_ = loaded.kernel.grid;
    sig_ = loaded.kernel.args;
    initial_.clear();
    for (const isa::ArgSpec& a : sig_) {
      if (a.is_scalar()) {
        if (!scalars_.count(a.name)) return Status(StatusCode::kInvalidArgument, "test sets no scalar " + a.name);
        initial_.emplace_back();
      } else if (inputs_.count(a.name)) {
        initial_.push_back(inputs_[a.name]);
      } else if (a.access == isa::Access::kOut) {
        initial_.emplace_back(a.bytes(), 0xFF);
      } else {
        initial_.push_back(random_bytes_for(a, rng_));
      }
    }
    // Device buffers for the buffer arguments only, in argument order.
    std::vector<Bytes> buffers;
    std::vector<Bind> binds;
    for (size_t i = 0; i < sig_.size(); ++i) {
      if (sig_[i].is_scalar()) {
        binds.push_back(Bind::value(hal::KernelArg{true, hal::DeviceAddr{}, 0, scalars_[sig_[i].name].bits}));
      } else {
        binds.push_back(Bind::to(buffers.size()));
        buffers.push_back(initial_[i]);
      }
    }
    NPURT_ASSIGN_OR_RETURN(const std::vector<Bytes> after, loaded.launch(std::move(buffers), binds));
    device_ = initial_;
    for (size_t i = 0; i < sig_.size(); ++i) {
      if (!sig_[i].is_scalar()) device_[i] = after[binds[i].buffer];
    }
    reference_ = initial_;
    std::vector<ops::HostArg> host;
    for (size_t i = 0; i < sig_.size(); ++i) {
      host.push_back(sig_[i].is_scalar() ? scalars_[sig_[i].name] : ops::HostArg::buffer(reference_[i]));
    }
    return op_.reference(host);
  }

  // run() as a gtest assertion that shows the status: ASSERT_TRUE(h.runs()).
  ::testing::AssertionResult runs() {
    const Status s = run();
    if (s.ok()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << op_.name() << ": " << s.to_string();
  }

  std::vector<float> device_f32(const std::string& name) const { return decode(name, device_); }
  std::vector<float> reference_f32(const std::string& name) const { return decode(name, reference_); }
  const Bytes& device_bytes(const std::string& name) const { return device_[index(name)]; }
  const Bytes& reference_bytes(const std::string& name) const { return reference_[index(name)]; }
  const Bytes& input_bytes(const std::string& name) const { return initial_[index(name)]; }
  uint32_t grid() const { return grid_; }

  // The device's output `name` against the reference's (poisoned_rel_l2).
  double rel_l2(const std::string& name) const { return poisoned_rel_l2(device_f32(name), reference_f32(name)); }

  // rel_l2(name) <= tolerance as a gtest assertion that names the operator and its
  // grid; the error is also recorded as the test's property "rel_l2".
  ::testing::AssertionResult close_to_reference(const std::string& name, double tolerance) const {
    const double err = rel_l2(name);
    ::testing::Test::RecordProperty("rel_l2", ::testing::PrintToString(err));
    if (err <= tolerance) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << op_.name() << " grid " << grid_ << ": rel-L2 of '" << name << "' is "
                                         << err << ", above " << tolerance;
  }

 private:
  isa::ArgSpec arg(const std::string& name) const {
    for (const isa::ArgSpec& a : op_.signature()) {
      if (a.name == name) return a;
    }
    ADD_FAILURE() << op_.name() << " has no argument " << name;
    return {};
  }
  size_t index(const std::string& name) const {
    for (size_t i = 0; i < sig_.size(); ++i) {
      if (sig_[i].name == name) return i;
    }
    ADD_FAILURE() << op_.name() << " has no argument " << name;
    return 0;
  }
  std::vector<float> decode(const std::string& name, const std::vector<Bytes>& side) const {
    const size_t i = index(name);
    return isa::to_f32(side[i], sig_[i].dtype);
  }

  const ops::Operator& op_;
  std::mt19937 rng_;
  hal::SimOptions options_;
  std::map<std::string, Bytes> inputs_;
  std::map<std::string, ops::HostArg> scalars_;
  std::vector<isa::ArgSpec> sig_;
  std::vector<Bytes> initial_, device_, reference_;
  uint32_t grid_ = 0;
};

// The whole of a plain MatchesReference test: runs `op` on random inputs from `seed`
// and expects output `out` within `tolerance` of the reference.
inline void expect_matches_reference(const ops::Operator& op, uint32_t seed, const std::string& out,
                                     double tolerance) {
  OpHarness h(op, seed);
  ASSERT_TRUE(h.runs());
  EXPECT_TRUE(h.close_to_reference(out, tolerance));
}

inline bool message_has(const Status& s, std::string_view text) {
  return s.message().find(text) != std::string::npos;
}

// Expects compiling `op` for `target` to fail with kInvalidArgument naming `param`
// (quoted, as invalid_param writes it).
inline void expect_rejects(const ops::Operator& op, std::string_view param, const ops::Target& target = {}) {
  const Status s = op.compile(target).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << param << ": " << s.to_string();
  EXPECT_TRUE(message_has(s, "'" + std::string(param) + "'")) << s.to_string();
}

// The same for an `Op` with parameters `p`: expect_rejects<RmsNorm>({.rows = 0}, "rows").
template <typename Op>
void expect_rejects(const typename Op::Params& p, std::string_view param, const ops::Target& target = {}) {
  expect_rejects(Op(p), param, target);
}

// The rel-L2 bound of a result computed in f32 and stored in (or read from) the plain
// type `t`: f32 rounding, or one rounding to a 16-bit type.
inline double tolerance(isa::DType t) { return t == isa::DType::kF32 ? 1e-5 : 1e-2; }

}  // namespace npurt::testing

// The operator tests are written in npurt::ops; the names they all use.
namespace npurt::ops {
using isa::DType;
using testing::expect_matches_reference;
using testing::expect_rejects;
using testing::OpHarness;
using testing::tolerance;
}  // namespace npurt::ops
