#include "npurt/runtime/runtime.h"

#include <utility>

namespace npurt {

namespace {

// Drops the entries whose objects are gone, so long-lived runtimes do not grow.
template <typename T>
void remember(std::vector<std::weak_ptr<T>>& list, const std::shared_ptr<T>& object) {
  std::erase_if(list, [](const std::weak_ptr<T>& w) { return w.expired(); });
  list.push_back(object);
}

}  // namespace

StatusOr<std::shared_ptr<Runtime>> Runtime::create(std::shared_ptr<hal::Device> device,
                                                   RuntimeOptions options) {
  if (!device) return invalid_argument("Runtime: no device");
  auto registry = std::make_shared<exec::CodeRegistry>(exec::FactoryKey(), device, std::move(options.code));
  std::shared_ptr<Runtime> rt(new Runtime(device, std::move(registry)));
  NPURT_ASSIGN_OR_RETURN(rt->memory_, MemoryContext::create(std::move(device), options.memory));
  return rt;
}

StatusOr<std::shared_ptr<Runtime>> Runtime::create(std::string_view driver, const hal::DeviceSpec& spec,
                                                   RuntimeOptions options) {
  NPURT_ASSIGN_OR_RETURN(std::shared_ptr<hal::Device> device, hal::create_device(driver, spec));
  return create(std::move(device), std::move(options));
}

Runtime::Runtime(std::shared_ptr<hal::Device> device, std::shared_ptr<exec::CodeRegistry> registry)
    : device_(std::move(device)), registry_(std::move(registry)) {}

Runtime::~Runtime() { close(); }

StatusOr<std::shared_ptr<exec::Worker>> Runtime::make_worker(exec::WorkerOptions options) {
  NPURT_RETURN_IF_ERROR(check_open("make_worker"));
  NPURT_ASSIGN_OR_RETURN(std::shared_ptr<exec::Worker> worker,
                         exec::Worker::make(exec::FactoryKey(), registry_, options));
  std::lock_guard lock(mu_);
  remember(workers_, worker);
  return worker;
}

StatusOr<std::shared_ptr<exec::StreamPool>> Runtime::make_stream_pool(std::string name,
                                                                      exec::StreamPoolOptions options) {
  NPURT_RETURN_IF_ERROR(check_open(name));
  NPURT_ASSIGN_OR_RETURN(std::shared_ptr<exec::StreamPool> pool,
                         exec::StreamPool::make(exec::FactoryKey(), std::move(name), device_, registry_, options));
  std::lock_guard lock(mu_);
  remember(pools_, pool);
  return pool;
}

void Runtime::close() {
  std::vector<std::weak_ptr<exec::Worker>> workers;
  std::vector<std::weak_ptr<exec::StreamPool>> pools;
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
    closed_ = true;
    workers.swap(workers_);
    pools.swap(pools_);
  }
  // Runs first (they launch on pools and use buffers), then the streams, then memory.
  for (auto& w : workers) {
    if (auto worker = w.lock()) worker->close();
  }
  for (auto& p : pools) {
    if (auto pool = p.lock()) pool->close();
  }
  if (memory_) memory_->close();
  registry_->close();
}

bool Runtime::closed() const {
  std::lock_guard lock(mu_);
  return closed_;
}

Status Runtime::check_open(std::string_view what) const {
  if (!closed()) return ok_status();
  return failed_precondition(std::string(what) + ": its runtime is closed");
}

}  // namespace npurt
