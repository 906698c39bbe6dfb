#include "npurt/exec/stream_pool.h"

#include <utility>

#include "npurt/base/hazards.h"
#include "npurt/isa/builder.h"

namespace npurt::exec {

namespace {

// One image for every pool, so content dedup keeps one resident copy per registry.
StatusOr<isa::Image> prime_image() {
  isa::KernelBuilder b("npurt.prime");
  b.exit();
  return b.build();
}

}  // namespace

StatusOr<std::unique_ptr<StreamPool>> StreamPool::make(FactoryKey, std::string name,
                                                       std::shared_ptr<hal::Device> device,
                                                       std::shared_ptr<CodeRegistry> registry,
                                                       StreamPoolOptions options) {
  if (!device) return invalid_argument(name + ": no device");
  if (registry && &registry->device() != device.get()) {
    return invalid_argument(name + ": the code registry belongs to another device");
  }
  std::unique_ptr<StreamPool> pool(
      new StreamPool(std::move(name), std::move(device), std::move(registry), options));
  hal::Device* dev = pool->device_.get();
  StreamOps ops{[dev]() -> StatusOr<StreamHandle> {
                  NPURT_ASSIGN_OR_RETURN(hal::StreamId s, dev->create_stream());
                  return StreamHandle{s};
                },
                [dev](StreamHandle s) { return dev->destroy_stream(s); }};
  const ReusePolicy policy =
      hazard_on(Hazard::kNaiveStreamReuse) ? ReusePolicy::kNaiveLastImage : ReusePolicy::kPublicationAware;
  NPURT_ASSIGN_OR_RETURN(pool->slots_, StreamSlots::make(std::move(ops), options.slots, policy));
  if (pool->registry_ && !hazard_on(Hazard::kUnprimedStreams)) {
    NPURT_ASSIGN_OR_RETURN(isa::Image image, prime_image());
    StatusOr<CodeHandle> prime = pool->registry_->register_image(image);
    if (!prime.ok()) return prime.status().with_context(pool->name_ + ": registering the priming kernel");
    pool->prime_ = *std::move(prime);
  }
  return pool;
}

StreamPool::StreamPool(std::string name, std::shared_ptr<hal::Device> device,
                       std::shared_ptr<CodeRegistry> registry, StreamPoolOptions options)
    : name_(std::move(name)),
      device_(std::move(device)),
      registry_(std::move(registry)),
      options_(options) {}

StreamPool::~StreamPool() { close(); }

void StreamPool::close() {
  {
    std::unique_lock lock(mu_);
    if (closed_ || closing_) return;
    closing_ = true;
  }
  {
    // Uses in flight end first: their streams must outlive them.
    std::unique_lock lock(leases_mu_);
    leases_cv_.wait_for(lock, kCloseWait, [&] { return leases_out_ <= 0; });
  }
  std::unique_lock lock(mu_);
  closed_ = true;
  if (!slots_) return;  // make() failed before the slots existed
  final_stats_ = slots_->stats();
  slots_.reset();  // destroys every stream after its queued work
  prime_.reset();
}

StatusOr<SlotLease> StreamPool::acquire(uint32_t slot, uint64_t image_id) {
  std::shared_lock lock(mu_);
  if (closed_ || closing_) return failed_precondition(name_ + ": its streams are closed");
  // Without code there is nothing to go stale: the epoch stays 0.
  const uint64_t epoch = registry_ ? registry_->publication_epoch() : 0;
  StatusOr<SlotLease> lease = slots_->begin(slot, epoch, image_id);
  if (!lease.ok()) return lease.status().with_context(name_);
  if (!lease->fresh_stream && !device_->stream_query(lease->stream).ok()) {
    // In error although its last use ended clean: aborted since (a device reset).
    slots_->retire(*lease, RunOutcome::kFailed).ignore();
    lease = slots_->begin(slot, epoch, image_id);
    if (!lease.ok()) return lease.status().with_context(name_);
  }
  if (lease->fresh_stream && prime_.valid()) {
    Status primed = device_->launch(lease->stream, {prime_.address(), device_->info().num_cores, {}});
    if (!primed.ok()) {
      slots_->retire(*lease, RunOutcome::kFailed).ignore();
      return primed.with_context(name_ + ": priming a fresh stream");
    }
    prime_launches_.fetch_add(1, std::memory_order_relaxed);
  }
  std::lock_guard count(leases_mu_);
  ++leases_out_;
  return lease;
}

Status StreamPool::release(const SlotLease& lease, RunOutcome outcome) {
  Status s;
  {
    std::shared_lock lock(mu_);
    // Once closed, close() destroyed the stream already.
    if (!closed_) s = slots_->retire(lease, outcome).with_context(name_);
  }
  {
    std::lock_guard count(leases_mu_);
    --leases_out_;
  }
  leases_cv_.notify_all();
  return s;
}

Status StreamPool::observe_complete(const SlotLease& lease) {
  std::shared_lock lock(mu_);
  if (closed_) return ok_status();
  return slots_->mark_polled_complete(lease);
}

StatusOr<SlotState> StreamPool::slot_state(uint32_t slot) const {
  std::shared_lock lock(mu_);
  if (closed_) return failed_precondition(name_ + ": its streams are closed");
  return slots_->slot_state(slot);
}

StreamSlotStats StreamPool::stats() const {
  std::shared_lock lock(mu_);
  return closed_ ? final_stats_ : slots_->stats();
}

Status StreamPool::finish(const SlotLease& lease) {
  Status s = device_->stream_synchronize(lease.stream);
  Status released = release(lease, s.ok() ? RunOutcome::kComplete : RunOutcome::kFailed);
  return s.ok() ? released : s;
}

}  // namespace npurt::exec
