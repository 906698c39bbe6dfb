// Plans and the rules they are made by. Every sync and launch is planned first
// (Plan), changing no state, then executed, then its effects committed to the maps.
// CoherenceRules decide which bytes move and what a completed plan means for the
// coherence state, OrderingRules what it waits for; the context picks them from
// MemoryOptions at creation. Each is called once per plan, never per byte range.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "memory/fence_table.h"
#include "npurt/memory/coherence_map.h"
#include "npurt/memory/memory_context.h"

namespace npurt::memory_detail {

struct BufferState;

// The emulated production runtime's flags (Hazard::kNaiveCoherence).
struct NaiveFlags {
  bool resident = false;          // the whole-buffer initial upload happened
  bool dirty = false;             // one shared "host wrote something" mark
  bool readback_pending = false;  // the next fetch downloads the whole buffer
  bool read_back_once = false;    // launches no longer set readback_pending
};

struct Plan {
  struct Binding {
    BufferState* buffer;
    ByteRange range;
    isa::Access access;
  };
  struct Move {
    BufferState* buffer;
    ByteRange range;
  };

  bool upload = true;        // moves go host -> device, else device -> host
  bool launch = false;       // bindings: a kernel's buffer arguments, else one view to sync
  hal::StreamId stream{};  // a launch's stream: its own fences need no wait
  std::vector<Binding> bindings;
  std::vector<Move> moves;      // by buffer, then offset; a byte at most once
  std::vector<FenceRef> waits;  // sorted, distinct
  std::vector<std::pair<BufferState*, NaiveFlags>> naive;  // flags once the plan ran

  void reset(bool is_upload, bool is_launch, hal::StreamId on) {
    upload = is_upload;
    launch = is_launch;
    stream = on;
    bindings.clear();
    moves.clear();
    waits.clear();
    naive.clear();
  }
};

class CoherenceRules {
 public:
  virtual ~CoherenceRules() = default;
  // Whether tracked mode's raw writes are seen (enable_tracking arms a tracker).
  virtual bool sees_raw_writes() const = 0;
  // Appends to plan.moves the stale bytes of plan.bindings: for an upload those
  // the bindings read, for a download all of them. Changes no state.
  virtual void plan_moves(Plan& plan) const = 0;
  // The plan ran: its moves made both sides agree, a launch wrote its outputs.
  virtual void commit(const Plan& plan) const = 0;
  // The host wrote `range` (a write guard, mark_host_written).
  virtual void on_host_write(BufferState& b, ByteRange range) const = 0;
  // The host gave up its copy of `range` (drop_host_copy), which the device holds.
  virtual void on_host_dropped(BufferState& b, ByteRange range) const = 0;
};
// Exact per-range rules, or the naive flags (Hazard::kNaiveCoherence).
std::unique_ptr<CoherenceRules> make_coherence_rules(bool naive);

class OrderingRules {
 public:
  virtual ~OrderingRules() = default;
  // Sets plan.waits: the unfinished work the plan's moves and kernel conflict with.
  virtual void plan_waits(Plan& plan) const = 0;
};
std::unique_ptr<OrderingRules> make_ordering_rules(bool order_conflicting_work,
                                                   const FenceTable& fences);

}  // namespace npurt::memory_detail
