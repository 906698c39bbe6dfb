#include "memory/rules.h"

#include <algorithm>

#include "memory/buffer_state.h"

namespace npurt::memory_detail {
namespace {

using isa::Access;
using State = CoherenceState;

// The rules of MemoryContext (memory_context.h): exactly the stale bytes move.
class ExactCoherence final : public CoherenceRules {
 public:
  bool sees_raw_writes() const override { return true; }

  void plan_moves(Plan& p) const override {
    const State stale = p.upload ? State::kHostNewer : State::kDeviceNewer;
    for (const Plan::Binding& bd : p.bindings) {
      if (p.upload && bd.access == Access::kOut) continue;
      const ByteRange r = bd.range;
      bd.buffer->map.for_each_in(r.begin, r.end, [&](uint64_t b, uint64_t e, State s) {
        if (s == stale) p.moves.push_back({bd.buffer, {b, e}});
      });
    }
  }

  void commit(const Plan& p) const override {
    for (const Plan::Move& m : p.moves) m.buffer->map.mark_synced(m.range.begin, m.range.end);
    for (const Plan::Binding& bd : p.bindings) {
      if (p.launch && bd.access != Access::kIn) {
        bd.buffer->map.device_written(bd.range.begin, bd.range.end);
      }
    }
  }

  void on_host_write(BufferState& b, ByteRange r) const override {
    b.map.host_written(r.begin, r.end);
  }

  void on_host_dropped(BufferState& b, ByteRange r) const override {
    bool any = false;
    b.map.for_each_in(r.begin, r.end, [&](uint64_t, uint64_t, State s) { any |= s == State::kBothValid; });
    if (any) b.map.update(r.begin, r.end, [](State& s) { s = s == State::kBothValid ? State::kDeviceNewer : s; });
  }
};

// Hazard::kNaiveCoherence, WRONG on purpose (memory_context.h).
class NaiveResidencyFlags final : public CoherenceRules {
 public:
  bool sees_raw_writes() const override { return false; }

  void plan_moves(Plan& p) const override {
    for (const Plan::Binding& bd : p.bindings) {
      if (p.upload && bd.access == Access::kOut) continue;
      BufferState& b = *bd.buffer;
      NaiveFlags& f = flags_after(p, b);  // as earlier bindings of the plan left them
      ByteRange move;
      if (!p.upload) {
        if (f.readback_pending) move = {0, b.size};
        f.read_back_once |= std::exchange(f.readback_pending, false);
      } else if (!f.resident) {
        f.resident = true;
        move = {0, b.size};
      } else if (f.dirty) {
        move = bd.range;
      }
      if (p.upload) f.dirty = false;
      if (!move.empty()) p.moves.push_back({&b, move});
    }
  }

  void commit(const Plan& p) const override {
    for (const auto& [b, flags] : p.naive) b->naive = flags;
    for (const Plan::Binding& bd : p.bindings) {
      NaiveFlags& f = bd.buffer->naive;
      if (p.launch && bd.access != Access::kIn && !f.read_back_once) f.readback_pending = true;
    }
  }

  void on_host_write(BufferState& b, ByteRange) const override { b.naive.dirty = true; }
  // Even the flags must fetch what the host no longer has.
  void on_host_dropped(BufferState& b, ByteRange) const override { b.naive.readback_pending = true; }

 private:
  static NaiveFlags& flags_after(Plan& p, BufferState& b) {
    for (auto& [buffer, flags] : p.naive) {
      if (buffer == &b) return flags;
    }
    return p.naive.emplace_back(&b, b.naive).second;
  }
};

// Waits for the writers of every byte a plan touches and for the readers of every
// byte it writes (a launch's outputs, the device bytes an upload replaces).
class ExactOrdering final : public OrderingRules {
 public:
  explicit ExactOrdering(const FenceTable& fences) : fences_(fences) {}

  void plan_waits(Plan& p) const override {
    p.waits.clear();
    for (const Plan::Binding& bd : p.bindings) {
      if (p.launch) collect(*bd.buffer, bd.range, bd.access != Access::kIn, p.waits);
    }
    for (const Plan::Move& m : p.moves) collect(*m.buffer, m.range, p.upload, p.waits);
    if (p.waits.empty()) return;
    std::sort(p.waits.begin(), p.waits.end());
    p.waits.erase(std::unique(p.waits.begin(), p.waits.end()), p.waits.end());
    // On the device, finished work and work on the launch's own stream need no wait.
    if (p.launch) {
      std::erase_if(p.waits, [&](FenceRef f) {
        const hal::StreamId s = fences_.stream_of(f);
        return !s || s == p.stream;
      });
    }
  }

 private:
  void collect(const BufferState& b, ByteRange r, bool writes, std::vector<FenceRef>& out) const {
    b.deps.for_each_in(r.begin, r.end, [&](uint64_t, uint64_t, const DepState& s) {
      // A failed writer is done, but its bytes are garbage: readers must hear of it.
      if (!fences_.known_done(s.writer) || !fences_.failure(s.writer).ok()) {
        out.push_back(s.writer);
      }
      for (uint8_t i = 0; writes && i < s.num_readers; ++i) {
        if (!fences_.known_done(s.readers[i])) out.push_back(s.readers[i]);
      }
    });
  }

  const FenceTable& fences_;
};

// Hazard::kUnorderedConflicts, WRONG on purpose: no waits.
class NoOrdering final : public OrderingRules {
 public:
  void plan_waits(Plan& p) const override { p.waits.clear(); }
};

}  // namespace

std::unique_ptr<CoherenceRules> make_coherence_rules(bool naive) {
  if (!naive) return std::make_unique<ExactCoherence>();
  return std::make_unique<NaiveResidencyFlags>();
}

std::unique_ptr<OrderingRules> make_ordering_rules(bool order_conflicting_work,
                                                   const FenceTable& fences) {
  if (!order_conflicting_work) return std::make_unique<NoOrdering>();
  return std::make_unique<ExactOrdering>(fences);
}

}  // namespace npurt::memory_detail
