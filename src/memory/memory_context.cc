// MemoryContext's calls: each checks, plans (Planner) and executes (PlanExecutor)
// under the core's mutex.
#include "npurt/memory/memory_context.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "memory/memory_core.h"

namespace npurt {

using memory_detail::BufferState;
using memory_detail::MemoryCore;
using memory_detail::Plan;

namespace {

// A synchronous transfer of the stale bytes of `view` (checked first), for `what`.
// The caller holds the core's mutex.
Status sync_view(MemoryCore& core, const View& view, bool upload, const char* what) {
  NPURT_RETURN_IF_ERROR(core.check_view(view).with_context(what));
  core.buffers.reap_deferred_frees();
  BufferState& b = *MemoryCore::state_of(view);
  const ByteRange r{view.offset(), view.end()};
  Status s = core.planner.transfer(core.plan, b, r, upload);
  if (s.ok()) s = core.executor.transfer(core.plan);
  if (s.ok()) return s;
  return s.with_context(std::string(what) + " of " + memory_detail::buffer_text(b) + " " +
                        memory_detail::range_text(r));
}

}  // namespace

StatusOr<std::unique_ptr<MemoryContext>> MemoryContext::create(std::shared_ptr<hal::Device> device,
                                                               MemoryOptions options) {
  if (!device) return invalid_argument("MemoryContext: no device");
  auto core = std::make_shared<MemoryCore>(std::move(device), options);
  NPURT_RETURN_IF_ERROR(core->open().with_context("creating the memory context's transfer streams"));
  return std::unique_ptr<MemoryContext>(new MemoryContext(std::move(core)));
}

MemoryContext::MemoryContext(std::shared_ptr<MemoryCore> core) : core_(std::move(core)) {}

MemoryContext::~MemoryContext() { close(); }

void MemoryContext::close() { core_->close(); }

const MemoryOptions& MemoryContext::options() const { return core_->options; }
hal::Device& MemoryContext::device() const { return *core_->device; }

StatusOr<Buffer> MemoryContext::create_buffer(uint64_t bytes, BufferOptions options) {
  std::shared_ptr<BufferState> state;
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    NPURT_ASSIGN_OR_RETURN(state, core_->buffers.create(core_, options.name, bytes, options.alignment));
  }
  Buffer buffer = MemoryCore::buffer_of(state);
  if (!options.track_writes) return buffer;
  if (Status s = buffer.enable_tracking(options.mechanism); !s.ok()) {
    buffer.free().ignore();
    return s.with_context("create_buffer '" + options.name + "'");
  }
  return buffer;
}

// ---- host access -------------------------------------------------------------------------

StatusOr<ReadGuard> MemoryContext::read(const View& view) {
  std::lock_guard<std::mutex> lock(core_->mu);
  NPURT_RETURN_IF_ERROR(sync_view(*core_, view, /*upload=*/false, "read"));
  return MemoryCore::read_guard(view);
}

StatusOr<WriteGuard> MemoryContext::write(const View& view) {
  std::lock_guard<std::mutex> lock(core_->mu);
  NPURT_RETURN_IF_ERROR(sync_view(*core_, view, /*upload=*/false, "write"));
  return core_->open_write_guard(view, "write");
}

StatusOr<WriteGuard> MemoryContext::overwrite(const View& view) {
  std::lock_guard<std::mutex> lock(core_->mu);
  NPURT_RETURN_IF_ERROR(core_->check_view(view).with_context("overwrite"));
  core_->buffers.reap_deferred_frees();
  return core_->open_write_guard(view, "overwrite");
}

Status MemoryContext::mark_host_written(const View& view) {
  std::lock_guard<std::mutex> lock(core_->mu);
  NPURT_RETURN_IF_ERROR(core_->check_view(view).with_context("mark_host_written"));
  core_->coherence->on_host_write(*MemoryCore::state_of(view), {view.offset(), view.end()});
  return ok_status();
}

Status MemoryContext::to_device(const View& view) {
  std::lock_guard<std::mutex> lock(core_->mu);
  return sync_view(*core_, view, /*upload=*/true, "to_device");
}

Status MemoryContext::to_host(const View& view) {
  std::lock_guard<std::mutex> lock(core_->mu);
  return sync_view(*core_, view, /*upload=*/false, "to_host");
}

Status MemoryContext::drop_host_copy(const View& view) {
  constexpr const char* kWhat = "drop_host_copy";
  MemoryCore& core = *core_;
  std::lock_guard<std::mutex> lock(core.mu);
  NPURT_RETURN_IF_ERROR(sync_view(core, view, /*upload=*/true, kWhat));
  BufferState& b = *MemoryCore::state_of(view);
  const ByteRange r{view.offset(), view.end()};
  // A launch's upload of these bytes may still be in flight: once the host forgets
  // them, the device's copy must be good. Wait for the writers, then sync again so an
  // upload that failed is sent anew (Planner: failed uploads are resent).
  std::vector<memory_detail::FenceRef> writers;
  b.deps.for_each_in(r.begin, r.end, [&](uint64_t, uint64_t, const memory_detail::DepState& d) {
    if (d.writer.valid() && !core.fences.known_done(d.writer)) writers.push_back(d.writer);
  });
  if (!writers.empty()) {
    for (const memory_detail::FenceRef& w : writers) (void)core.fences.host_wait(w);  // a failure is resent
    NPURT_RETURN_IF_ERROR(sync_view(core, view, /*upload=*/true, kWhat));
  }
  const uint64_t first = memory_detail::ceil_to(r.begin, core.page);
  const uint64_t last = r.end == b.size ? b.mirror_bytes : memory_detail::floor_to(r.end, core.page);
  if (first >= last) return ok_status();
  const std::string what = std::string(kWhat) + " of " + memory_detail::buffer_text(b);
  if (madvise(b.mirror + first, last - first, MADV_DONTNEED) != 0) {
    const int err = errno;
    return internal_error(what + " " + memory_detail::range_text(first, last) + ": madvise: " + std::strerror(err));
  }
  core.coherence->on_host_dropped(b, {first, std::min(last, b.size)});
  core.stats.host_bytes_dropped += last - first;
  // Tracked mode: the fresh pages are protected like the ones they replace, so a raw
  // write to them is caught (and, where the device holds newer bytes, loses to them).
  if (b.tracker) NPURT_RETURN_IF_ERROR_CTX(b.tracker->clear(first, last), what);
  return ok_status();
}

Status MemoryContext::retain_until_exit(const View& view) {
  const BufferState* b = MemoryCore::state_of(view);
  if (b == nullptr) return failed_precondition("retain_until_exit: view is not attached to a buffer");
  if (b->core != core_) return invalid_argument("retain_until_exit: the view belongs to another memory context");
  // No core mutex: a stream's host function may call this while close() holds it.
  core_->buffers.retain_until_exit(*b);
  return ok_status();
}

// ---- device work -------------------------------------------------------------------------

StatusOr<LaunchPlan> MemoryContext::plan_launch(hal::StreamId stream, const isa::Image& image, uint32_t grid,
                                                std::span<const LaunchArg> args) {
  std::lock_guard<std::mutex> lock(core_->mu);
  const Plan& plan = core_->plan;
  NPURT_RETURN_IF_ERROR(core_->planner.kernel(core_->plan, stream, image, grid, args));
  LaunchPlan out;
  for (const Plan::Move& m : plan.moves) out.uploads.push_back({m.buffer->name, m.range});
  for (const Plan::Binding& bd : plan.bindings) out.bindings.push_back({bd.buffer->name, bd.range, bd.access});
  out.waits = plan.waits.size();
  return out;
}

Status MemoryContext::launch(hal::StreamId stream, const exec::CodeHandle& code, uint32_t grid,
                             std::span<const LaunchArg> args) {
  if (!code) return invalid_argument("launch: the code handle is empty (unregistered or moved from)");
  MemoryCore& core = *core_;
  std::lock_guard<std::mutex> lock(core.mu);
  core.buffers.reap_deferred_frees();
  core.executor.release_finished();
  NPURT_RETURN_IF_ERROR(core.planner.kernel(core.plan, stream, *code.image(), grid, args));
  return core.executor.launch(core.plan, code, grid, args);
}

Status MemoryContext::enqueue_command(hal::StreamId stream, std::string_view name, std::span<const CommandArg> args,
                                      const EnqueueCommand& enqueue) {
  MemoryCore& core = *core_;
  std::lock_guard<std::mutex> lock(core.mu);
  core.buffers.reap_deferred_frees();
  NPURT_RETURN_IF_ERROR(core.planner.command(core.plan, stream, name, args));
  return core.executor.command(core.plan, name, args, enqueue);
}

MemoryContext::RawWriteScan::RawWriteScan(std::shared_ptr<MemoryCore> core) : core_(std::move(core)) {
  if (!core_->raw_writes.begin_scan_once()) core_.reset();
}

MemoryContext::RawWriteScan::~RawWriteScan() {
  if (core_) core_->raw_writes.end_scan_once();
}

MemoryContext::RawWriteScan MemoryContext::scan_raw_writes_once() { return RawWriteScan(core_); }

Status MemoryContext::synchronize() {
  MemoryCore& core = *core_;
  std::lock_guard<std::mutex> lock(core.mu);
  NPURT_RETURN_IF_ERROR(core.buffers.check_open().with_context("synchronize"));
  Status s = core.fences.wait_all();
  core.buffers.reap_deferred_frees();
  core.executor.release_finished();
  return s;
}

MemoryStats MemoryContext::stats() const {
  const MemoryCore& core = *core_;
  std::lock_guard<std::mutex> lock(core.mu);
  MemoryStats s = core.stats;
  const memory_detail::FenceStats f = core.fences.stats();
  s.fences_recorded = f.fences_recorded;
  s.events_created = f.events_created;
  s.events_live = f.events_live;
  s.device_waits = f.device_waits;
  s.host_waits = f.host_waits;
  s.buffers_live = core.buffers.live();
  s.pending_frees = core.buffers.pending_frees();
  s.retained_bytes = core.buffers.retained_bytes();
  return s;
}

}  // namespace npurt
