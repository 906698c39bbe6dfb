// OpRunner: one compiled operator resident on a simulated device with random
// inputs, launched and waited for on each run(): what the operator benchmarks time.
#pragma once

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "must.h"
#include "npurt/hal/sim/sim_device.h"
#include "npurt/ops/operator.h"
#include "npurt/runtime/runtime.h"
#include "ops/random_inputs.h"

namespace npurt::bench {

class OpRunner {
 public:
  // Scalars the operator declares are bound from `scalars` by name (raw launch bits).
  OpRunner(const ops::Operator& op, std::map<std::string, uint64_t> scalars = {}, hal::SimOptions options = {}) {
    dev_ = std::move(hal::create_sim_device(options)).value();
    runtime_ = std::move(Runtime::create(dev_)).value();
    kernel_ = std::make_unique<ops::Kernel>(std::move(op.compile(ops::Target::of(dev_->info()))).value());
    code_ = std::move(runtime_->registry().register_image(kernel_->image)).value();
    stream_ = dev_->create_stream().value();  // created after publishing: no stale lines
    std::mt19937 rng(7);
    params_ = {code_.address(), kernel_->grid, {}};
    for (const isa::ArgSpec& a : kernel_->args) {
      if (a.is_scalar()) {
        params_.args.push_back(hal::KernelArg{true, hal::DeviceAddr{}, 0, scalars.at(a.name)});
        continue;
      }
      const auto bytes = testing::random_bytes_for(a, rng);
      const hal::DeviceAddr addr = dev_->allocate(bytes.size()).value();
      must(dev_->copy_to_device(stream_, addr, bytes.data(), bytes.size()));
      must(dev_->stream_synchronize(stream_));  // the copy reads `bytes` asynchronously
      params_.args.push_back(hal::KernelArg::buffer(addr, bytes.size()));
    }
  }

  void run() {
    must(dev_->launch(stream_, params_));
    must(dev_->stream_synchronize(stream_));
  }
  uint32_t grid() const { return kernel_->grid; }
  hal::Device& device() { return *dev_; }

 private:
  std::shared_ptr<hal::Device> dev_;
  std::shared_ptr<Runtime> runtime_;  // its registry publishes the code
  std::unique_ptr<ops::Kernel> kernel_;
  exec::CodeHandle code_;
  hal::StreamId stream_{};
  hal::LaunchParams params_;
};

}  // namespace npurt::bench
