#include "memory/memory_core.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "npurt/base/hazards.h"
#include "npurt/base/math.h"

namespace npurt::memory_detail {
namespace {

uint64_t floor_to(uint64_t v, uint64_t page) { return v & ~(page - 1); }
uint64_t ceil_to(uint64_t v, uint64_t page) { return (v + page - 1) & ~(page - 1); }

std::string range_text(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

std::string buffer_text(const BufferState& b) { return "buffer '" + b.name + "'"; }

}  // namespace

// ---- BufferState -------------------------------------------------------------------

BufferState::~BufferState() {
  tracker.reset();  // unprotects the mirror before it goes
  munmap(mirror, mirror_bytes);
}

// ---- MemoryCore: lifetime ------------------------------------------------------------

MemoryCore::MemoryCore(std::shared_ptr<hal::Device> device, MemoryOptions options)
    : device_(std::move(device)),
      options_(options),
      page_(PageWriteTracker::page_size()),
      naive_coherence_(hazard_on(Hazard::kNaiveCoherence)),
      resend_failed_uploads_(!hazard_on(Hazard::kNoResendOfFailedUploads)),
      hold_launched_code_(!hazard_on(Hazard::kLaunchesDropTheirCode)),
      fences_(*device_),
      coherence_(make_coherence_rules(naive_coherence_)),
      ordering_(make_ordering_rules(!hazard_on(Hazard::kUnorderedConflicts), fences_)) {}

Status MemoryCore::open() {
  std::lock_guard<std::mutex> lock(mu_);
  // Transfers run no code: a pool without a registry, replaced only after a failure.
  NPURT_ASSIGN_OR_RETURN(transfers_, exec::StreamPool::make(exec::FactoryKey(), "memory context transfers", device_, nullptr));
  return ok_status();
}

void MemoryCore::close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  closed_ = true;
  fences_.wait_all().ignore();
  for (BufferState* b : live_) {
    b->freed = true;
    b->freed_reason = "its memory context is closed";
    free_device_block(b->device_addr).ignore();
  }
  live_.clear();
  for (const DeferredFree& d : deferred_) free_device_block(d.addr).ignore();
  deferred_.clear();
  pending_staging_.clear();
  held_code_.clear();
  staging_pool_.clear();
  pooled_staging_bytes_ = 0;
  fences_.destroy();
  transfers_->close();
}

Status MemoryCore::check_open() const {
  if (closed_) return failed_precondition("its memory context is closed");
  return ok_status();
}

Status MemoryCore::free_device_block(hal::DeviceAddr addr) {
  {
    std::lock_guard<std::mutex> lock(retained_mu_);
    if (std::find(retained_.begin(), retained_.end(), addr) != retained_.end()) return ok_status();
  }
  return device_->free(addr);
}

Status MemoryCore::retain_until_exit(const View& view) {
  if (view.buffer_ == nullptr) return failed_precondition("retain_until_exit: view is not attached to a buffer");
  const BufferState& b = *view.buffer_;
  if (b.core.get() != this) return invalid_argument("retain_until_exit: the view belongs to another memory context");
  {
    std::lock_guard<std::mutex> lock(retained_mu_);
    if (std::find(retained_.begin(), retained_.end(), b.device_addr) != retained_.end()) return ok_status();
    retained_.push_back(b.device_addr);
    retained_bytes_ += b.size;
  }
  // The device's memory must outlive every object that could release it.
  static std::mutex keep_mu;
  static auto* kept = new std::vector<std::shared_ptr<hal::Device>>();
  std::lock_guard<std::mutex> lock(keep_mu);
  if (std::find(kept->begin(), kept->end(), device_) == kept->end()) kept->push_back(device_);
  return ok_status();
}

Status MemoryCore::check_view(const View& view) const {
  if (view.buffer_ == nullptr) return failed_precondition("view is not attached to a buffer");
  const BufferState& b = *view.buffer_;
  auto what = [&] {
    return "view " + range_text(view.offset(), view.end()) + " of " + buffer_text(b);
  };
  if (b.core.get() != this) return invalid_argument(what() + " belongs to another memory context");
  if (b.freed) return failed_precondition(what() + ": " + b.freed_reason);
  NPURT_RETURN_IF_ERROR_CTX(check_open(), what());
  return ok_status();
}

// ---- buffers -------------------------------------------------------------------------

StatusOr<Buffer> MemoryCore::create_buffer(uint64_t bytes, const BufferOptions& options) {
  const std::string what = "create_buffer '" + options.name + "'";
  if (bytes == 0) return invalid_argument(what + ": size must be > 0");
  const uint64_t align = options.alignment;
  if (!is_pow2(align) || align > 4096) {
    return invalid_argument(what + ": alignment " + std::to_string(align) +
                            " is not a power of two <= 4096");
  }
  if (bytes > std::numeric_limits<uint64_t>::max() - page_) {
    return invalid_argument(what + ": size " + std::to_string(bytes) + " is too large");
  }
  const uint64_t mirror_bytes = ceil_to(bytes, page_);
  void* mirror = mmap(nullptr, mirror_bytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mirror == MAP_FAILED) {
    return resource_exhausted(what + ": host mirror of " + std::to_string(mirror_bytes) +
                              " bytes: " + std::strerror(errno));
  }
  std::shared_ptr<BufferState> state;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Status open = check_open();
    if (open.ok()) reap_deferred_frees();
    StatusOr<hal::DeviceAddr> addr =
        open.ok() ? device_->allocate(bytes, align) : StatusOr<hal::DeviceAddr>(open);
    if (!addr.ok()) {
      munmap(mirror, mirror_bytes);
      return addr.status().with_context(what + " (" + std::to_string(bytes) + " bytes)");
    }
    state = std::make_shared<BufferState>(shared_from_this(), options.name, bytes,
                                          static_cast<uint8_t*>(mirror), mirror_bytes, *addr);
    state->live_index = live_.size();
    live_.push_back(state.get());
    ++stats_.buffers_created;
  }
  Buffer buffer(state);
  if (options.track_writes) {
    if (Status s = enable_tracking(*state, options.mechanism); !s.ok()) {
      buffer.free().ignore();
      return s.with_context(what);
    }
  }
  return buffer;
}

Status MemoryCore::free_buffer(BufferState& b) {
  std::lock_guard<std::mutex> lock(mu_);
  if (b.freed) return ok_status();
  b.freed = true;
  b.freed_reason = "the buffer was freed";
  live_[b.live_index] = live_.back();
  live_[b.live_index]->live_index = b.live_index;
  live_.pop_back();

  fences_.poll();
  std::vector<FenceRef> pending;
  b.deps.for_each_in(0, b.size, [&](uint64_t, uint64_t, const DepState& s) {
    if (!fences_.known_done(s.writer)) pending.push_back(s.writer);
    for (uint8_t i = 0; i < s.num_readers; ++i) {
      if (!fences_.known_done(s.readers[i])) pending.push_back(s.readers[i]);
    }
  });
  if (pending.empty()) {
    NPURT_RETURN_IF_ERROR_CTX(free_device_block(b.device_addr),
                              "freeing the device memory of " + buffer_text(b));
    return ok_status();
  }
  std::sort(pending.begin(), pending.end());
  pending.erase(std::unique(pending.begin(), pending.end()), pending.end());
  deferred_.push_back({b.device_addr, std::move(pending)});
  ++stats_.deferred_frees;
  return ok_status();
}

void MemoryCore::reap_deferred_frees() {
  if (deferred_.empty()) return;
  fences_.poll();
  std::erase_if(deferred_, [&](const DeferredFree& d) {
    for (const FenceRef& f : d.fences) {
      if (!fences_.known_done(f)) return false;
    }
    // The work is done; a failing free leaves nothing to retry.
    free_device_block(d.addr).ignore();
    return true;
  });
}

Status MemoryCore::enable_tracking(BufferState& b, WriteTrackingMechanism mechanism) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string what = "enable_tracking for " + buffer_text(b);
  NPURT_RETURN_IF_ERROR(check_open().with_context(what));
  if (b.freed) return failed_precondition(what + ": " + b.freed_reason);
  if (!coherence_->sees_raw_writes()) {
    b.tracked = true;
    return ok_status();
  }
  if (b.tracker) return ok_status();
  auto tracker = PageWriteTracker::create(b.mirror, b.mirror_bytes, {mechanism});
  if (!tracker.ok()) return tracker.status().with_context(what);
  NPURT_RETURN_IF_ERROR(tracker->arm().with_context(what));
  b.tracker.emplace(std::move(tracker).value());
  b.tracked = true;
  return ok_status();
}

// ---- tracked mode --------------------------------------------------------------------

Status MemoryCore::absorb_dirty(BufferState& b, uint64_t begin, uint64_t end) {
  if (!b.tracker || begin >= end) return ok_status();
  const uint64_t first = floor_to(begin, page_);
  const uint64_t last = std::min(ceil_to(end, page_), b.mirror_bytes);
  dirty_.clear();
  Status s = b.tracker->take_dirty(first, last, &dirty_);
  for (const ByteRange& r : dirty_) {
    stats_.tracked_pages_collected += r.size() / page_;
    record_raw_write(b, r.begin, std::min(r.end, b.size));
  }
  NPURT_RETURN_IF_ERROR_CTX(s, "collecting raw writes to " + buffer_text(b));
  return ok_status();
}

void MemoryCore::record_raw_write(BufferState& b, uint64_t begin, uint64_t end) {
  if (begin >= end) return;
  pieces_.clear();
  uint64_t counted = 0;  // pages below this one were counted as conflicts
  b.map.for_each_in(begin, end, [&](uint64_t s, uint64_t e, CoherenceState state) {
    if (state == CoherenceState::kDeviceNewer) {
      const uint64_t first = std::max(floor_to(s, page_), counted);
      counted = ceil_to(e, page_);
      if (first < counted) stats_.tracked_conflict_pages += (counted - first) / page_;
    } else if (state != CoherenceState::kHostNewer) {
      pieces_.push_back({s, e});
    }
  });
  for (const ByteRange& r : pieces_) b.map.host_written(r.begin, r.end);
}

void MemoryCore::resend_failed_uploads(BufferState& b, ByteRange r) {
  // The naive flags keep no ranges; the hazard switch shows what this prevents.
  if (naive_coherence_ || !resend_failed_uploads_) return;
  pieces_.clear();
  b.deps.for_each_in(r.begin, r.end, [&](uint64_t db, uint64_t de, const DepState& d) {
    if (fences_.failure(d.writer).ok()) return;
    b.map.for_each_in(db, de, [&](uint64_t s, uint64_t e, CoherenceState st) {
      if (st == CoherenceState::kBothValid) pieces_.push_back({s, e});
    });
  });
  for (const ByteRange& p : pieces_) b.map.host_written(p.begin, p.end);
}

void MemoryCore::record_changed_bytes(BufferState& b, uint64_t begin,
                                      std::span<const uint8_t> before) {
  const uint8_t* now = b.mirror + begin;
  for (size_t i = 0; i < before.size(); ++i) {
    if (now[i] == before[i]) continue;
    size_t j = i + 1;
    while (j < before.size() && now[j] != before[j]) ++j;
    b.map.host_written(begin + i, begin + j);
    i = j;  // now[j] == before[j], or the end
  }
}

// ---- synchronous transfers: plan, execute ------------------------------------------------

Status MemoryCore::plan_transfer(BufferState& b, ByteRange r, bool upload) {
  if (upload) {
    NPURT_RETURN_IF_ERROR(absorb_dirty(b, r.begin, r.end));
    resend_failed_uploads(b, r);
  } else if (b.tracker) {
    // Raw writes on the pages a download lands on are recorded first: the
    // download's own writes into the mirror are forgotten afterwards.
    for (const ByteRange& d : b.map.ranges_to_download(r.begin, r.end)) {
      NPURT_RETURN_IF_ERROR(absorb_dirty(b, d.begin, d.end));
    }
  }
  plan_.reset(upload, /*is_launch=*/false, hal::StreamId{});
  plan_.bindings.push_back({&b, r, isa::Access::kIn});
  coherence_->plan_moves(plan_);
  ordering_->plan_waits(plan_);
  return ok_status();
}

Status MemoryCore::execute_transfer(BufferState& b) {
  const Plan& p = plan_;
  if (p.moves.empty()) return ok_status();
  auto what = [&] { return (p.upload ? "uploading " : "fetching ") + buffer_text(b); };
  for (const FenceRef& w : p.waits) {
    // Failed work is over: overwriting the bytes it touched needs no error.
    if (Status s = fences_.host_wait(w); !s.ok() && !p.upload) {
      return s.with_context(what() + ": the device work writing it failed");
    }
  }
  NPURT_ASSIGN_OR_RETURN(exec::SlotLease lease, transfers_->acquire());
  Status enqueued;
  for (const Plan::Move& m : p.moves) {
    uint8_t* host = b.mirror + m.range.begin;
    const hal::DeviceAddr dev = b.device_addr + m.range.begin;
    const uint64_t n = m.range.size();
    enqueued = p.upload ? device_->copy_to_device(lease.stream, dev, host, n)
                        : device_->copy_to_host(lease.stream, host, dev, n);
    if (!enqueued.ok()) break;
    (p.upload ? stats_.h2d_bytes : stats_.d2h_bytes) += n;
    ++(p.upload ? stats_.h2d_copies : stats_.d2h_copies);
  }
  // Waits for the copies; the pool replaces a stream that failed.
  Status finished = transfers_->finish(lease);
  NPURT_RETURN_IF_ERROR_CTX(enqueued, what());
  NPURT_RETURN_IF_ERROR_CTX(finished, what());
  commit(FenceRef{});  // complete: nothing left to wait for
  if (p.upload || !b.tracker) return ok_status();
  for (const Plan::Move& m : p.moves) {
    NPURT_RETURN_IF_ERROR_CTX(b.tracker->clear(m.range.begin, m.range.end),
                              "re-protecting " + buffer_text(b));
  }
  return ok_status();
}

void MemoryCore::commit(FenceRef fence) {
  const Plan& p = plan_;
  for (const Plan::Move& m : p.moves) {
    p.upload ? set_writer(*m.buffer, m.range, fence) : forget_writer(*m.buffer, m.range);
  }
  if (p.launch) {
    for (const Plan::Binding& bd : p.bindings) {
      if (bd.access != isa::Access::kOut && fence.valid()) {
        add_reader(*bd.buffer, bd.range, fence, p.stream);
      }
    }
    for (const Plan::Binding& bd : p.bindings) {
      if (bd.access != isa::Access::kIn) set_writer(*bd.buffer, bd.range, fence);
    }
  }
  coherence_->commit(p);
}

Status MemoryCore::sync_view(const View& view, bool upload, const char* what) {
  NPURT_RETURN_IF_ERROR(check_view(view).with_context(what));
  reap_deferred_frees();
  BufferState& b = *view.buffer_;
  Status s = plan_transfer(b, {view.offset(), view.end()}, upload);
  if (s.ok()) s = execute_transfer(b);
  if (s.ok()) return s;
  return s.with_context(std::string(what) + " of " + buffer_text(b) + " " +
                        range_text(view.offset(), view.end()));
}

// ---- dependencies ------------------------------------------------------------------------

void MemoryCore::prune(DepState& s) const {
  // A failed writer stays: its bytes are garbage, or its uploads must be sent again.
  if (fences_.known_done(s.writer) && fences_.failure(s.writer).ok()) s.writer = FenceRef{};
  uint8_t kept = 0;
  for (uint8_t i = 0; i < s.num_readers; ++i) {
    if (!fences_.known_done(s.readers[i])) s.readers[kept++] = s.readers[i];
  }
  for (uint8_t i = kept; i < s.num_readers; ++i) s.readers[i] = FenceRef{};
  s.num_readers = kept;
}

void MemoryCore::set_writer(BufferState& b, ByteRange r, FenceRef f) {
  b.deps.update(r.begin, r.end, [&](DepState& s) {
    s = DepState{};
    s.writer = f;
  });
}

void MemoryCore::forget_writer(BufferState& b, ByteRange r) {
  b.deps.update(r.begin, r.end, [&](DepState& s) {
    prune(s);
    s.writer = FenceRef{};
  });
}

void MemoryCore::add_reader(BufferState& b, ByteRange r, FenceRef f, hal::StreamId stream) {
  b.deps.update(r.begin, r.end, [&](DepState& s) {
    prune(s);
    // One reader per stream: the new one completes after any older one there.
    uint8_t n = 0;
    for (uint8_t i = 0; i < s.num_readers; ++i) {
      if (fences_.stream_of(s.readers[i]) != stream) s.readers[n++] = s.readers[i];
    }
    if (n == DepState::kMaxReaders) {
      // More streams read these bytes at once than a segment records: wait for one
      // of them to make room (rare: it takes kMaxReaders concurrent streams).
      fences_.host_wait(s.readers[0]).ignore();
      std::move(s.readers.begin() + 1, s.readers.begin() + n, s.readers.begin());
      --n;
    }
    s.readers[n++] = f;
    std::sort(s.readers.begin(), s.readers.begin() + n);
    for (uint8_t i = n; i < DepState::kMaxReaders; ++i) s.readers[i] = FenceRef{};
    s.num_readers = n;
  });
}

// ---- staging for launch uploads ----------------------------------------------------------

void MemoryCore::recycle_staging() {
  while (!pending_staging_.empty() && fences_.known_done(pending_staging_.front().fence)) {
    Staging s = std::move(pending_staging_.front().staging);
    pending_staging_.pop_front();
    if (pooled_staging_bytes_ + s.capacity > options_.max_pooled_staging_bytes) continue;
    pooled_staging_bytes_ += s.capacity;
    staging_pool_.push_back(std::move(s));
  }
}

void MemoryCore::release_finished_code() {
  // Fences of one stream complete in order; across streams the front may wait for a
  // slower stream, which only holds the others a little longer.
  while (!held_code_.empty() && fences_.known_done(held_code_.front().fence)) held_code_.pop_front();
}

MemoryCore::Staging MemoryCore::take_staging(uint64_t bytes) {
  recycle_staging();
  if (staging_pool_.empty() && !pending_staging_.empty()) {
    fences_.poll();
    recycle_staging();
  }
  size_t best = staging_pool_.size();
  for (size_t i = 0; i < staging_pool_.size(); ++i) {
    if (staging_pool_[i].capacity >= bytes &&
        (best == staging_pool_.size() ||
         staging_pool_[i].capacity < staging_pool_[best].capacity)) {
      best = i;
    }
  }
  if (best != staging_pool_.size()) {
    Staging s = std::move(staging_pool_[best]);
    staging_pool_[best] = std::move(staging_pool_.back());
    staging_pool_.pop_back();
    pooled_staging_bytes_ -= s.capacity;
    return s;
  }
  Staging s;
  s.capacity = bytes;
  s.data = std::make_unique_for_overwrite<uint8_t[]>(bytes);
  return s;
}

// ---- host access -------------------------------------------------------------------------

StatusOr<ReadGuard> MemoryCore::read(const View& view) {
  std::lock_guard<std::mutex> lock(mu_);
  NPURT_RETURN_IF_ERROR(sync_view(view, /*upload=*/false, "read"));
  return ReadGuard(view);
}

StatusOr<WriteGuard> MemoryCore::write(const View& view, bool fetch_first) {
  const char* what = fetch_first ? "write" : "overwrite";
  std::lock_guard<std::mutex> lock(mu_);
  if (fetch_first) {
    NPURT_RETURN_IF_ERROR(sync_view(view, /*upload=*/false, what));
  } else {
    NPURT_RETURN_IF_ERROR(check_view(view).with_context(what));
    reap_deferred_frees();
  }
  BufferState& b = *view.buffer_;
  WriteGuard guard(view);
  if (b.tracker) {
    // Raw writes made so far are recorded now, so that pages dirtied while the
    // guard is held are explained by the guard (its view) and by the margins'
    // byte differences only.
    NPURT_RETURN_IF_ERROR_CTX(
        absorb_dirty(b, view.offset(), view.end()),
        std::string(what) + " of " + buffer_text(b) + " " + range_text(view.offset(), view.end()));
    guard.twinned_ = true;
    guard.head_begin_ = floor_to(view.offset(), page_);
    guard.tail_end_ = std::min(ceil_to(view.end(), page_), b.size);
    guard.head_.assign(b.mirror + guard.head_begin_, b.mirror + view.offset());
    if (view.end() < guard.tail_end_) {
      guard.tail_.assign(b.mirror + view.end(), b.mirror + guard.tail_end_);
    }
  }
  guard.active_ = true;
  return guard;
}

void MemoryCore::release(WriteGuard& guard) {
  std::lock_guard<std::mutex> lock(mu_);
  BufferState& b = *guard.view_.buffer_;
  if (closed_ || b.freed) return;
  const uint64_t begin = guard.view_.offset();
  const uint64_t end = guard.view_.end();
  if (b.tracker) {
    const uint64_t first = floor_to(begin, page_);
    const uint64_t last = std::min(ceil_to(end, page_), b.mirror_bytes);
    dirty_.clear();
    if (!b.tracker->take_dirty(first, last, &dirty_).ok()) {
      // Cannot tell what was written around the view: assume everything was.
      record_raw_write(b, first, std::min(last, b.size));
    } else if (!guard.twinned_) {
      // Tracking was turned on while the guard was held: no copy to compare with.
      for (const ByteRange& r : dirty_) record_raw_write(b, r.begin, std::min(r.end, b.size));
    } else {
      const uint64_t tail_page = floor_to(end, page_);
      for (const ByteRange& r : dirty_) {
        if (!guard.head_.empty() && r.begin <= guard.head_begin_ && guard.head_begin_ < r.end) {
          record_changed_bytes(b, guard.head_begin_, guard.head_);
        }
        if (!guard.tail_.empty() && r.begin <= tail_page && tail_page < r.end) {
          record_changed_bytes(b, end, guard.tail_);
        }
      }
    }
  }
  coherence_->on_host_write(b, {begin, end});
}

Status MemoryCore::mark_host_written(const View& view) {
  std::lock_guard<std::mutex> lock(mu_);
  NPURT_RETURN_IF_ERROR(check_view(view).with_context("mark_host_written"));
  coherence_->on_host_write(*view.buffer_, {view.offset(), view.end()});
  return ok_status();
}

Status MemoryCore::to_device(const View& view) {
  std::lock_guard<std::mutex> lock(mu_);
  return sync_view(view, /*upload=*/true, "to_device");
}

Status MemoryCore::to_host(const View& view) {
  std::lock_guard<std::mutex> lock(mu_);
  return sync_view(view, /*upload=*/false, "to_host");
}

Status MemoryCore::drop_host_copy(const View& view) {
  constexpr const char* kWhat = "drop_host_copy";
  std::lock_guard<std::mutex> lock(mu_);
  NPURT_RETURN_IF_ERROR(sync_view(view, /*upload=*/true, kWhat));
  BufferState& b = *view.buffer_;
  const ByteRange r{view.offset(), view.end()};
  // A launch's upload of these bytes may still be in flight: once the host forgets
  // them, the device's copy must be good. Wait for the writers, then sync again so an
  // upload that failed is sent anew (resend_failed_uploads).
  std::vector<FenceRef> writers;
  b.deps.for_each_in(r.begin, r.end, [&](uint64_t, uint64_t, const DepState& d) {
    if (d.writer.valid() && !fences_.known_done(d.writer)) writers.push_back(d.writer);
  });
  if (!writers.empty()) {
    for (const FenceRef& w : writers) (void)fences_.host_wait(w);  // a failure is handled by the resend
    NPURT_RETURN_IF_ERROR(sync_view(view, /*upload=*/true, kWhat));
  }
  const uint64_t first = ceil_to(r.begin, page_);
  const uint64_t last = r.end == b.size ? b.mirror_bytes : floor_to(r.end, page_);
  if (first >= last) return ok_status();
  if (madvise(b.mirror + first, last - first, MADV_DONTNEED) != 0) {
    const int err = errno;
    return internal_error(std::string(kWhat) + " of " + buffer_text(b) + " " + range_text(first, last) +
                          ": madvise: " + std::strerror(err));
  }
  coherence_->on_host_dropped(b, {first, std::min(last, b.size)});
  stats_.host_bytes_dropped += last - first;
  // Tracked mode: the fresh pages are protected like the ones they replace, so a raw
  // write to them is caught (and, where the device holds newer bytes, loses to them).
  if (b.tracker) NPURT_RETURN_IF_ERROR_CTX(b.tracker->clear(first, last), std::string(kWhat) + " of " + buffer_text(b));
  return ok_status();
}

Status MemoryCore::synchronize() {
  std::lock_guard<std::mutex> lock(mu_);
  NPURT_RETURN_IF_ERROR(check_open().with_context("synchronize"));
  Status s = fences_.wait_all();
  reap_deferred_frees();
  recycle_staging();
  release_finished_code();
  return s;
}

MemoryStats MemoryCore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  MemoryStats s = stats_;
  const FenceStats f = fences_.stats();
  s.fences_recorded = f.fences_recorded;
  s.events_created = f.events_created;
  s.events_live = f.events_live;
  s.device_waits = f.device_waits;
  s.host_waits = f.host_waits;
  s.buffers_live = live_.size();
  s.pending_frees = deferred_.size();
  std::lock_guard<std::mutex> retained(retained_mu_);
  s.retained_bytes = retained_bytes_;
  return s;
}

}  // namespace npurt::memory_detail
