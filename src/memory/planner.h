// Planner: checks a synchronous transfer, a kernel launch or a command and writes
// its Plan (rules.h): the stale bytes to move, the earlier work to wait for, what
// the work does with each view.
//
// Planning enqueues nothing and decides nothing it does not put in the plan. The
// caller owns the plan and hands it to the PlanExecutor; planning into the same Plan
// object again reuses its memory, so steady state allocates nothing. The only state
// it changes is what happened before the call: raw writes tracked mode caught in the
// bytes concerned are recorded (RawWrites), and bytes whose upload belonged to work
// that failed become host-newer again (they are sent anew). Bad input is a Status
// naming the problem.
//
// Not thread-safe: the core's mutex serializes every call.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "memory/buffer_table.h"
#include "memory/raw_writes.h"
#include "memory/rules.h"
#include "npurt/isa/image.h"
#include "npurt/memory/launch_arg.h"
#include "npurt/memory/memory_context.h"

namespace npurt::memory_detail {

class Planner {
 public:
  // `resend_failed_uploads` false: Hazard::kNoResendOfFailedUploads (or the naive
  // coherence flags, which keep no ranges).
  Planner(const BufferTable& buffers, FenceTable& fences, RawWrites& raw_writes, const CoherenceRules& coherence,
          const OrderingRules& ordering, bool resend_failed_uploads)
      : buffers_(&buffers),
        fences_(&fences),
        raw_writes_(&raw_writes),
        coherence_(&coherence),
        ordering_(&ordering),
        resend_failed_uploads_(resend_failed_uploads) {}
  Planner(const Planner&) = delete;
  Planner& operator=(const Planner&) = delete;

  // Each sets `plan` to the plan of: a synchronous transfer of the stale bytes `r` of
  // `b` (a checked view), host to device when `upload`, else device to host;
  Status transfer(Plan& plan, BufferState& b, ByteRange r, bool upload);
  // a launch of `image` on `stream`, its arguments checked against the image;
  Status kernel(Plan& plan, hal::StreamId stream, const isa::Image& image, uint32_t grid,
                std::span<const LaunchArg> args);
  // device work other than a launch (MemoryContext::enqueue_command).
  // On an error the plan holds nothing to execute.
  Status command(Plan& plan, hal::StreamId stream, std::string_view name,
                 std::span<const MemoryContext::CommandArg> args);

 private:
  struct PlannedView {
    const View* view;
    isa::Access access;
    size_t index;  // the argument's position, for errors
  };

  Status validate_launch(const isa::Image& image, uint32_t grid, std::span<const LaunchArg> args) const;
  // The device work of views_ (a launch's buffer arguments or a command's views);
  // label(i) names argument i in errors.
  Status plan_views(Plan& p, const std::function<std::string(size_t)>& label);
  // Bytes of `r` that both sides hold, as far as committed work says, but whose
  // upload belonged to work that failed: the device copy may be garbage, the host's
  // is still right, so they become host-newer again and are sent with the next sync.
  void resend_failed_uploads(BufferState& b, ByteRange r);
  Status check_view(const View& view) const;

  const BufferTable* const buffers_;
  FenceTable* const fences_;
  RawWrites* const raw_writes_;
  const CoherenceRules* const coherence_;
  const OrderingRules* const ordering_;
  const bool resend_failed_uploads_;

  std::vector<PlannedView> views_;
  std::vector<ByteRange> pieces_;
};

}  // namespace npurt::memory_detail
