#include "memory/plan_executor.h"

#include <algorithm>
#include <cstring>

#include "memory/memory_core.h"

namespace npurt::memory_detail {

// ---- synchronous transfers ---------------------------------------------------------------

Status PlanExecutor::transfer(const Plan& p) {
  if (p.moves.empty()) return ok_status();
  BufferState& b = *p.bindings.front().buffer;
  auto what = [&] { return (p.upload ? "uploading " : "fetching ") + buffer_text(b); };
  for (const FenceRef& w : p.waits) {
    // Failed work is over: overwriting the bytes it touched needs no error.
    if (Status s = fences_->host_wait(w); !s.ok() && !p.upload) {
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
    (p.upload ? stats_->h2d_bytes : stats_->d2h_bytes) += n;
    ++(p.upload ? stats_->h2d_copies : stats_->d2h_copies);
  }
  // Waits for the copies; the pool replaces a stream that failed.
  Status finished = transfers_->finish(lease);
  NPURT_RETURN_IF_ERROR_CTX(enqueued, what());
  NPURT_RETURN_IF_ERROR_CTX(finished, what());
  commit(p, FenceRef{});  // complete: nothing left to wait for
  if (p.upload || !b.tracker) return ok_status();
  for (const Plan::Move& m : p.moves) {
    NPURT_RETURN_IF_ERROR_CTX(b.tracker->clear(m.range.begin, m.range.end), "re-protecting " + buffer_text(b));
  }
  return ok_status();
}

// ---- launches and commands ---------------------------------------------------------------

Status PlanExecutor::launch(const Plan& p, const exec::CodeHandle& code, uint32_t grid,
                            std::span<const LaunchArg> args) {
  const auto work = [&](hal::StreamId stream) {
    params_.image = code.address();
    params_.grid = grid;
    params_.args.clear();
    for (const LaunchArg& a : args) {
      if (a.kind() == LaunchArg::Kind::kView) {
        const View& v = a.view();
        params_.args.push_back(hal::KernelArg::buffer(MemoryCore::state_of(v)->device_addr + v.offset(), v.size()));
      } else {
        params_.args.push_back(hal::KernelArg{true, hal::DeviceAddr{}, 0, a.scalar_bits()});
      }
    }
    return device_->launch(stream, params_);
  };
  return run(p, [&] { return "launch of '" + code.image()->name() + "'"; }, work, &code);
}

Status PlanExecutor::command(const Plan& p, std::string_view name, std::span<const MemoryContext::CommandArg> args,
                             const MemoryContext::EnqueueCommand& enqueue) {
  const auto work = [&](hal::StreamId stream) {
    params_.args.clear();
    for (const MemoryContext::CommandArg& a : args) {
      const View& v = a.view;
      params_.args.push_back(hal::KernelArg::buffer(MemoryCore::state_of(v)->device_addr + v.offset(), v.size()));
    }
    return enqueue(stream, params_.args);
  };
  return run(p, [&] { return std::string(name); }, work, nullptr);
}

Status PlanExecutor::run(const Plan& p, const std::function<std::string()>& what,
                         const std::function<Status(hal::StreamId)>& work, const exec::CodeHandle* code) {
  for (const FenceRef& w : p.waits) {
    NPURT_RETURN_IF_ERROR_CTX(fences_->device_wait(p.stream, w), what() + ": waiting for earlier work");
  }
  // The uploads copy from a snapshot of the stale host bytes: the mirror is free
  // again when we return.
  uint64_t staged = 0;
  for (const Plan::Move& m : p.moves) staged += m.range.size();
  Staging staging = staged != 0 ? take_staging(staged) : Staging{};
  Status s;
  size_t copies = 0;
  for (uint64_t off = 0; const Plan::Move& m : p.moves) {
    uint8_t* snapshot = staging.data.get() + off;
    std::memcpy(snapshot, m.buffer->mirror + m.range.begin, m.range.size());
    s = device_->copy_to_device(p.stream, m.buffer->device_addr + m.range.begin, snapshot, m.range.size());
    if (!s.ok()) break;
    ++copies;
    off += m.range.size();
  }
  if (s.ok()) s = work(p.stream);
  if (!s.ok()) {
    // Copies already enqueued read the staging memory; it must outlive them.
    if (copies != 0) device_->stream_synchronize(p.stream).ignore();
    return s.with_context(what());
  }
  StatusOr<FenceRef> recorded = fences_->record(p.stream);
  FenceRef fence = recorded.ok() ? *recorded : FenceRef{};
  Status untracked;
  if (!recorded.ok()) {
    // Enqueued but untrackable: nothing could order later work after it, and waiting
    // for it here could wait forever (a hung kernel). So it is stopped: its stream is
    // aborted (which returns once the stream is idle) and the work counts as failed.
    device_->abort_stream(p.stream).ignore();
    untracked = device_->stream_synchronize(p.stream);
    fence = fences_->failed(recorded.status());
  }
  stats_->h2d_bytes += staged;
  stats_->h2d_copies += copies;
  stats_->staging_bytes += staged;
  ++stats_->launches;
  commit(p, fence);
  if (staged != 0) pending_staging_.push_back({fence, std::move(staging)});
  if (recorded.ok()) {
    if (code != nullptr && hold_launched_code_) held_code_.push_back({fence, *code});
    return ok_status();
  }
  Status failed = recorded.status().with_context(what() + ": recording its completion");
  // The stream's own error, when an earlier command on it failed, is told as well.
  if (untracked.ok() || untracked.code() == StatusCode::kAborted) return failed;
  return Status(failed.code(), failed.message() + "; its stream had failed: " + untracked.to_string());
}

void PlanExecutor::commit(const Plan& p, FenceRef fence) {
  for (const Plan::Move& m : p.moves) {
    p.upload ? set_writer(*m.buffer, m.range, fence) : forget_writer(*m.buffer, m.range);
  }
  if (p.launch) {
    for (const Plan::Binding& bd : p.bindings) {
      if (bd.access != isa::Access::kOut && fence.valid()) add_reader(*bd.buffer, bd.range, fence, p.stream);
    }
    for (const Plan::Binding& bd : p.bindings) {
      if (bd.access != isa::Access::kIn) set_writer(*bd.buffer, bd.range, fence);
    }
  }
  coherence_->commit(p);
}

// ---- dependencies ------------------------------------------------------------------------

void PlanExecutor::prune(DepState& s) const {
  // A failed writer stays: its bytes are garbage, or its uploads must be sent again.
  if (fences_->known_done(s.writer) && fences_->failure(s.writer).ok()) s.writer = FenceRef{};
  uint8_t kept = 0;
  for (uint8_t i = 0; i < s.num_readers; ++i) {
    if (!fences_->known_done(s.readers[i])) s.readers[kept++] = s.readers[i];
  }
  for (uint8_t i = kept; i < s.num_readers; ++i) s.readers[i] = FenceRef{};
  s.num_readers = kept;
}

void PlanExecutor::set_writer(BufferState& b, ByteRange r, FenceRef f) {
  b.deps.update(r.begin, r.end, [&](DepState& s) {
    s = DepState{};
    s.writer = f;
  });
}

void PlanExecutor::forget_writer(BufferState& b, ByteRange r) {
  b.deps.update(r.begin, r.end, [&](DepState& s) {
    prune(s);
    s.writer = FenceRef{};
  });
}

void PlanExecutor::add_reader(BufferState& b, ByteRange r, FenceRef f, hal::StreamId stream) {
  b.deps.update(r.begin, r.end, [&](DepState& s) {
    prune(s);
    // One reader per stream: the new one completes after any older one there.
    uint8_t n = 0;
    for (uint8_t i = 0; i < s.num_readers; ++i) {
      if (fences_->stream_of(s.readers[i]) != stream) s.readers[n++] = s.readers[i];
    }
    if (n == DepState::kMaxReaders) {
      // More streams read these bytes at once than a segment records: wait for one
      // of them to make room (rare: it takes kMaxReaders concurrent streams).
      fences_->host_wait(s.readers[0]).ignore();
      std::move(s.readers.begin() + 1, s.readers.begin() + n, s.readers.begin());
      --n;
    }
    // The others are still sorted: the new one moves down to its place.
    uint8_t j = n++;
    s.readers[j] = f;
    for (; j > 0 && s.readers[j] < s.readers[j - 1]; --j) std::swap(s.readers[j], s.readers[j - 1]);
    for (uint8_t i = n; i < DepState::kMaxReaders; ++i) s.readers[i] = FenceRef{};
    s.num_readers = n;
  });
}

// ---- what queued work holds --------------------------------------------------------------

void PlanExecutor::release_finished() {
  recycle_staging();
  // Fences of one stream complete in order; across streams the front may wait for a
  // slower stream, which only holds the others a little longer.
  while (!held_code_.empty() && fences_->known_done(held_code_.front().fence)) held_code_.pop_front();
}

void PlanExecutor::close() {
  pending_staging_.clear();
  held_code_.clear();
  staging_pool_.clear();
  pooled_staging_bytes_ = 0;
  if (transfers_) transfers_->close();
}

void PlanExecutor::recycle_staging() {
  while (!pending_staging_.empty() && fences_->known_done(pending_staging_.front().fence)) {
    Staging s = std::move(pending_staging_.front().staging);
    pending_staging_.pop_front();
    if (pooled_staging_bytes_ + s.capacity > max_pooled_staging_bytes_) continue;
    pooled_staging_bytes_ += s.capacity;
    staging_pool_.push_back(std::move(s));
  }
}

PlanExecutor::Staging PlanExecutor::take_staging(uint64_t bytes) {
  recycle_staging();
  if (staging_pool_.empty() && !pending_staging_.empty()) {
    fences_->poll();
    recycle_staging();
  }
  size_t best = staging_pool_.size();
  for (size_t i = 0; i < staging_pool_.size(); ++i) {
    if (staging_pool_[i].capacity >= bytes &&
        (best == staging_pool_.size() || staging_pool_[i].capacity < staging_pool_[best].capacity)) {
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

}  // namespace npurt::memory_detail
