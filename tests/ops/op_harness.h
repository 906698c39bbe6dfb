// OpHarness: runs one operator on a fresh simulated device and its host reference on
// the same inputs, for the operator tests.
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
#include <random>
#include <string>
#include <vector>

#include "npurt/hal/sim_device.h"
#include "npurt/isa/numeric.h"
#include "npurt/ops/operator.h"
#include "ops/random_inputs.h"

namespace npurt::testing {

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
    auto dev = hal::create_sim_device(options_);
    if (!dev.ok()) return dev.status();
    dev_ = std::move(dev).value();
    auto kernel = op_.compile(ops::Target::of(dev_->info()));
    if (!kernel.ok()) return kernel.status();
    grid_ = kernel->grid;
    sig_ = kernel->args;
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
    NPURT_RETURN_IF_ERROR(run_device(*kernel));
    reference_ = initial_;
    std::vector<ops::HostArg> host;
    for (size_t i = 0; i < sig_.size(); ++i) {
      host.push_back(sig_[i].is_scalar() ? scalars_[sig_[i].name] : ops::HostArg::buffer(reference_[i]));
    }
    return op_.reference(host);
  }

  std::vector<float> device_f32(const std::string& name) const { return decode(name, device_); }
  std::vector<float> reference_f32(const std::string& name) const { return decode(name, reference_); }
  const Bytes& device_bytes(const std::string& name) const { return device_[index(name)]; }
  const Bytes& reference_bytes(const std::string& name) const { return reference_[index(name)]; }
  const Bytes& input_bytes(const std::string& name) const { return initial_[index(name)]; }
  uint32_t grid() const { return grid_; }

  // ||device - reference|| / ||reference|| over output `name`. Elements the reference
  // leaves as poison (NaN) must be NaN on the device too; otherwise +inf.
  double rel_l2(const std::string& name) const {
    const auto got = device_f32(name), want = reference_f32(name);
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

  Status run_device(const ops::Kernel& k) {
    hal::Device& d = *dev_;
    NPURT_ASSIGN_OR_RETURN(hal::DeviceAddr code, d.allocate(k.image.bytes().size()));
    NPURT_RETURN_IF_ERROR(d.upload_code(code, k.image));
    NPURT_ASSIGN_OR_RETURN(hal::StreamId s, d.create_stream());
    hal::LaunchParams p{code, k.grid, {}};
    std::vector<hal::DeviceAddr> addrs(sig_.size(), 0);
    for (size_t i = 0; i < sig_.size(); ++i) {
      const isa::ArgSpec& a = sig_[i];
      if (a.is_scalar()) {
        p.args.push_back(hal::KernelArg{true, 0, 0, scalars_[a.name].bits});
        continue;
      }
      NPURT_ASSIGN_OR_RETURN(addrs[i], d.allocate(std::max<uint64_t>(a.bytes(), 1)));
      NPURT_RETURN_IF_ERROR(d.copy_to_device(s, addrs[i], initial_[i].data(), a.bytes()));
      p.args.push_back(hal::KernelArg::buffer(addrs[i], a.bytes()));
    }
    NPURT_RETURN_IF_ERROR(d.launch(s, p));
    device_ = initial_;
    for (size_t i = 0; i < sig_.size(); ++i) {
      if (!sig_[i].is_scalar() && sig_[i].writes()) {
        NPURT_RETURN_IF_ERROR(d.copy_to_host(s, device_[i].data(), addrs[i], sig_[i].bytes()));
      }
    }
    return d.stream_synchronize(s);
  }

  const ops::Operator& op_;
  std::mt19937 rng_;
  hal::SimOptions options_;
  std::unique_ptr<hal::Device> dev_;
  std::map<std::string, Bytes> inputs_;
  std::map<std::string, ops::HostArg> scalars_;
  std::vector<isa::ArgSpec> sig_;
  std::vector<Bytes> initial_, device_, reference_;
  uint32_t grid_ = 0;
};

// One compiled operator resident on a fresh simulated device, its stream created after
// the upload: for tests that bind the arguments themselves (in-place runs, say).
struct LoadedOp {
  std::unique_ptr<hal::Device> dev;
  ops::Kernel kernel;
  hal::DeviceAddr code = 0;
  hal::StreamId stream = 0;
};

inline StatusOr<LoadedOp> load_op(const ops::Operator& op) {
  NPURT_ASSIGN_OR_RETURN(std::unique_ptr<hal::Device> dev, hal::create_sim_device());
  NPURT_ASSIGN_OR_RETURN(ops::Kernel kernel, op.compile(ops::Target::of(dev->info())));
  NPURT_ASSIGN_OR_RETURN(hal::DeviceAddr code, dev->allocate(kernel.image.bytes().size()));
  NPURT_RETURN_IF_ERROR(dev->upload_code(code, kernel.image));
  NPURT_ASSIGN_OR_RETURN(hal::StreamId stream, dev->create_stream());
  return LoadedOp{std::move(dev), std::move(kernel), code, stream};
}

inline bool message_has(const Status& s, std::string_view text) {
  return s.message().find(text) != std::string::npos;
}

}  // namespace npurt::testing
