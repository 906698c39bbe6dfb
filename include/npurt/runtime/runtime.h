// Runtime: one device and everything npurt keeps on it, with one owner.
//
//   StatusOr<std::shared_ptr<Runtime>> rt = Runtime::create("sim", {.cores = 8});
//   StatusOr<Buffer> x = (*rt)->memory().create_buffer(4096);
//   auto seq = graph::OperatorSequence(...).compile(**rt);      // keeps *rt alive
//   auto worker = (*rt)->make_worker();
//
// A runtime owns the device (shared), its memory context (coherent buffers and their
// transfer streams), its code registry (the one place code reaches the device) and
// knows every worker and stream pool made through it. Everything made from a runtime
// keeps what it uses alive: buffers their memory core and device, code handles their
// registry and device, compiled sequences and workers the runtime or its parts. So
// objects may be destroyed in any order.
//
// close() releases the device's resources now, in the one safe order: workers drain
// and stop, stream pools destroy their streams, the memory context waits for its
// work and frees every buffer. Afterwards every call through an object of the runtime
// fails with kFailedPrecondition naming the object; nothing crashes. The destructor
// closes too.
//
// Threading: every method is thread-safe, close() included: it may run while other
// threads call sequences, workers, the memory context and the registry. Each such call
// finishes first (a stream pool waits for the uses in flight before it destroys their
// streams) or fails by name; tests/runtime/runtime_test.cc,
// "CloseMayRaceWithCallsOnEveryObject".
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "npurt/base/status.h"
#include "npurt/exec/code_registry.h"
#include "npurt/exec/stream_pool.h"
#include "npurt/exec/worker.h"
#include "npurt/hal/device.h"
#include "npurt/hal/driver.h"
#include "npurt/memory/memory_context.h"

namespace npurt {

struct RuntimeOptions {
  MemoryOptions memory = {};
  exec::CodeRegistryOptions code = {};
};

class Runtime : public std::enable_shared_from_this<Runtime> {
 public:
  static StatusOr<std::shared_ptr<Runtime>> create(std::shared_ptr<hal::Device> device,
                                                   RuntimeOptions options = {});
  // A runtime on a device of its own, made by the driver named `driver` (hal/driver.h;
  // "sim": the simulated NPU) for `spec`.
  static StatusOr<std::shared_ptr<Runtime>> create(std::string_view driver, const hal::DeviceSpec& spec = {},
                                                   RuntimeOptions options = {});
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  hal::Device& device() const { return *device_; }
  const std::shared_ptr<hal::Device>& shared_device() const { return device_; }
  MemoryContext& memory() const { return *memory_; }
  exec::CodeRegistry& registry() const { return *registry_; }
  const std::shared_ptr<exec::CodeRegistry>& shared_registry() const { return registry_; }

  // A pipelined Worker on the device; close() closes it.
  StatusOr<std::shared_ptr<exec::Worker>> make_worker(exec::WorkerOptions options = {});
  // Streams for one user (a sequence's calls); close() closes them.
  StatusOr<std::shared_ptr<exec::StreamPool>> make_stream_pool(std::string name,
                                                               exec::StreamPoolOptions options = {});

  // See the file comment. Idempotent.
  void close();
  bool closed() const;
  // OK while open; otherwise kFailedPrecondition "<what>: its runtime is closed".
  Status check_open(std::string_view what) const;

 private:
  Runtime(std::shared_ptr<hal::Device> device, std::shared_ptr<exec::CodeRegistry> registry);

  const std::shared_ptr<hal::Device> device_;
  const std::shared_ptr<exec::CodeRegistry> registry_;
  std::unique_ptr<MemoryContext> memory_;

  mutable std::mutex mu_;
  bool closed_ = false;                                     // guarded by mu_
  std::vector<std::weak_ptr<exec::Worker>> workers_;        // guarded by mu_
  std::vector<std::weak_ptr<exec::StreamPool>> pools_;      // guarded by mu_
};

}  // namespace npurt
