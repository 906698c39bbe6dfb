#include "memory/fence_table.h"

#include <algorithm>

namespace npurt::memory_detail {

uint32_t FenceTable::track_for(hal::StreamId stream) {
  uint32_t idle = static_cast<uint32_t>(tracks_.size());
  for (uint32_t i = 0; i < tracks_.size(); ++i) {
    if (tracks_[i].stream == stream) return i;
    if (idle == tracks_.size() && tracks_[i].pending.empty()) idle = i;
  }
  if (idle == tracks_.size()) tracks_.emplace_back();
  Track& t = tracks_[idle];
  t.stream = stream;
  t.recorded = 0;
  t.done = 0;
  return idle;
}

StatusOr<uint32_t> FenceTable::take_slot() {
  if (free_.empty()) poll();
  if (!free_.empty()) {
    const uint32_t slot = free_.back();
    free_.pop_back();
    return slot;
  }
  NPURT_ASSIGN_OR_RETURN(hal::EventId event, device_->create_event());
  ++stats_.events_created;
  ++stats_.events_live;
  Slot s;
  s.event = event;
  slots_.push_back(std::move(s));
  return static_cast<uint32_t>(slots_.size() - 1);
}

StatusOr<FenceRef> FenceTable::record(hal::StreamId stream) {
  NPURT_ASSIGN_OR_RETURN(uint32_t slot, take_slot());
  Slot& s = slots_[slot];
  if (Status st = device_->record_event(stream, s.event); !st.ok()) {
    free_.push_back(slot);  // never recorded under this generation: still reusable
    return st;
  }
  const uint32_t track = track_for(stream);
  Track& t = tracks_[track];
  s.track = track;
  s.seq = ++t.recorded;
  s.state = SlotState::kPending;
  t.pending.push_back(slot);
  ++stats_.fences_recorded;
  return FenceRef{slot, s.generation};
}

FenceRef FenceTable::failed(Status failure) {
  Slot s;  // no event: it is never waited for on the device, and never reused
  slots_.push_back(std::move(s));
  const auto slot = static_cast<uint32_t>(slots_.size() - 1);
  fail(slot, std::move(failure));
  return FenceRef{slot, slots_[slot].generation};
}

bool FenceTable::known_done(FenceRef f) const {
  if (!f.valid()) return true;
  const Slot& s = slots_[f.slot];
  if (s.generation != f.generation) return true;
  switch (s.state) {
    case SlotState::kFree:
    case SlotState::kFailed: return true;
    case SlotState::kPending: return tracks_[s.track].done >= s.seq;
  }
  return true;
}

Status FenceTable::failure(FenceRef f) const {
  if (!f.valid()) return ok_status();
  const Slot& s = slots_[f.slot];
  if (s.generation != f.generation || s.state != SlotState::kFailed) return ok_status();
  return s.failure;
}

hal::StreamId FenceTable::stream_of(FenceRef f) const {
  if (known_done(f)) return hal::StreamId{};
  return tracks_[slots_[f.slot].track].stream;
}

Status FenceTable::device_wait(hal::StreamId stream, FenceRef f) {
  if (known_done(f)) return ok_status();
  const Slot& s = slots_[f.slot];
  if (tracks_[s.track].stream == stream) return ok_status();  // FIFO order suffices
  ++stats_.device_waits;
  return device_->wait_event(stream, s.event);
}

Status FenceTable::host_wait(FenceRef f) {
  if (!f.valid()) return ok_status();
  Slot& s = slots_[f.slot];
  if (s.generation != f.generation) return ok_status();
  if (s.state == SlotState::kFailed) return s.failure;
  if (known_done(f)) return ok_status();
  ++stats_.host_waits;
  Status result = device_->event_synchronize(s.event);
  learn(f.slot, result);
  return result;
}

void FenceTable::learn(uint32_t slot, const Status& result) {
  Slot& s = slots_[slot];
  if (s.state != SlotState::kPending) return;
  Track& t = tracks_[s.track];
  if (!result.ok()) {
    // The stream's earlier fences completed too, but a failure proves nothing about
    // how: each one not yet learned is asked (their events are still theirs), so that
    // one which failed is never taken for a success.
    for (uint32_t p : t.pending) {
      Slot& e = slots_[p];
      if (e.state != SlotState::kPending || e.seq <= t.done || e.seq >= s.seq) continue;
      StatusOr<bool> complete = device_->event_query(e.event);
      if (!complete.ok()) fail(p, complete.status());
    }
    fail(slot, result);
  }
  // A success proves every earlier fence of the stream succeeded: a stream's error
  // fails everything after it.
  t.done = std::max(t.done, s.seq);
}

void FenceTable::fail(uint32_t slot, Status failure) {
  Slot& s = slots_[slot];
  s.state = SlotState::kFailed;
  s.failure = std::move(failure);
  ++stats_.fences_failed;
}

void FenceTable::recycle(uint32_t slot) {
  Slot& s = slots_[slot];
  if (++s.generation == 0) s.generation = 1;
  s.state = SlotState::kFree;
  free_.push_back(slot);
}

void FenceTable::poll() {
  for (Track& t : tracks_) {
    while (!t.pending.empty()) {
      const uint32_t slot = t.pending.front();
      Slot& s = slots_[slot];
      if (s.state == SlotState::kPending && s.seq > t.done) {
        StatusOr<bool> complete = device_->event_query(s.event);
        if (complete.ok() && !*complete) break;
        t.done = s.seq;
        if (!complete.ok()) fail(slot, complete.status());
      }
      t.pending.pop_front();
      if (s.state == SlotState::kFailed) {
        // Kept (with its error) for readers of the bytes it should have produced;
        // its event is no longer needed.
        if (s.event) {
          device_->destroy_event(s.event).ignore();
          s.event = hal::EventId{};
          --stats_.events_live;
        }
      } else {
        recycle(slot);
      }
    }
  }
}

Status FenceTable::wait_all() {
  Status first;
  for (Track& t : tracks_) {
    if (t.pending.empty()) continue;
    const uint32_t last = t.pending.back();
    Status s = host_wait(FenceRef{last, slots_[last].generation});
    if (first.ok() && !s.ok()) first = s;
  }
  poll();
  return first;
}

void FenceTable::destroy() {
  for (Slot& s : slots_) {
    if (!s.event) continue;
    device_->destroy_event(s.event).ignore();
    s.event = hal::EventId{};
  }
  stats_.events_live = 0;
  slots_.clear();
  free_.clear();
  tracks_.clear();
}

}  // namespace npurt::memory_detail
