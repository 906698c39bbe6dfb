#include "memory/planner.h"

#include <algorithm>

#include "memory/memory_core.h"

namespace npurt::memory_detail {
namespace {

std::string access_text(isa::Access a) { return "'" + std::string(isa::access_name(a)) + "'"; }
std::string launch_text(const isa::Image& image) { return "launch of '" + image.name() + "'"; }

// Merges moves of one buffer that overlap or touch: a byte bound twice is moved once.
void merge_moves(std::vector<Plan::Move>& moves) {
  if (moves.size() <= 1) return;
  std::sort(moves.begin(), moves.end(), [](const Plan::Move& a, const Plan::Move& b) {
    return a.buffer != b.buffer ? std::less<>()(a.buffer, b.buffer) : a.range.begin < b.range.begin;
  });
  size_t kept = 0;
  for (size_t i = 1; i < moves.size(); ++i) {
    Plan::Move& last = moves[kept];
    if (moves[i].buffer == last.buffer && moves[i].range.begin <= last.range.end) {
      last.range.end = std::max(last.range.end, moves[i].range.end);
    } else {
      moves[++kept] = moves[i];
    }
  }
  moves.resize(kept + 1);
}

}  // namespace

Status Planner::check_view(const View& view) const {
  return buffers_->check_view(MemoryCore::state_of(view), {view.offset(), view.end()});
}

Status Planner::transfer(Plan& p, BufferState& b, ByteRange r, bool upload) {
  p.reset(upload, /*is_launch=*/false, hal::StreamId{});
  if (upload) {
    NPURT_RETURN_IF_ERROR(raw_writes_->absorb(b, r));
    resend_failed_uploads(b, r);
  } else if (b.tracker) {
    // Raw writes on the pages a download lands on are recorded first: the
    // download's own writes into the mirror are forgotten afterwards.
    for (const ByteRange& d : b.map.ranges_to_download(r.begin, r.end)) {
      NPURT_RETURN_IF_ERROR(raw_writes_->absorb(b, d));
    }
  }
  p.bindings.push_back({&b, r, isa::Access::kIn});
  coherence_->plan_moves(p);
  ordering_->plan_waits(p);
  return ok_status();
}

Status Planner::kernel(Plan& p, hal::StreamId stream, const isa::Image& image, uint32_t grid,
                       std::span<const LaunchArg> args) {
  p.reset(/*is_upload=*/true, /*is_launch=*/true, stream);
  NPURT_RETURN_IF_ERROR_CTX(buffers_->check_open(), launch_text(image));
  NPURT_RETURN_IF_ERROR(validate_launch(image, grid, args));
  const std::vector<isa::ArgSpec>& specs = image.args();
  views_.clear();
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].kind != isa::ArgKind::kBuffer) continue;
    views_.push_back({&args[i].view(), args[i].is_written_first() ? isa::Access::kOut : specs[i].access, i});
  }
  return plan_views(p, [&](size_t i) {
    return launch_text(image) + ": argument " + std::to_string(i) + " ('" + specs[i].name + "')";
  });
}

Status Planner::command(Plan& p, hal::StreamId stream, std::string_view name,
                        std::span<const MemoryContext::CommandArg> args) {
  p.reset(/*is_upload=*/true, /*is_launch=*/true, stream);
  auto which = [&](size_t i) { return std::string(name) + ": view " + std::to_string(i); };
  NPURT_RETURN_IF_ERROR_CTX(buffers_->check_open(), std::string(name));
  views_.clear();
  for (size_t i = 0; i < args.size(); ++i) {
    NPURT_RETURN_IF_ERROR_CTX(check_view(args[i].view), which(i));
    if (args[i].view.empty()) return invalid_argument(which(i) + ": empty view");
    views_.push_back({&args[i].view, args[i].access, i});
  }
  return plan_views(p, which);
}

Status Planner::validate_launch(const isa::Image& image, uint32_t grid, std::span<const LaunchArg> args) const {
  if (grid == 0) return invalid_argument(launch_text(image) + ": empty grid");
  const std::vector<isa::ArgSpec>& specs = image.args();
  if (args.size() != specs.size()) {
    return invalid_argument(launch_text(image) + ": the image declares " + std::to_string(specs.size()) +
                            " arguments, got " + std::to_string(args.size()));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const isa::ArgSpec& spec = specs[i];
    const LaunchArg& arg = args[i];
    auto which = [&] { return launch_text(image) + ": argument " + std::to_string(i) + " ('" + spec.name + "')"; };
    if (spec.kind == isa::ArgKind::kScalar) {
      if (arg.kind() == LaunchArg::Kind::kView) return invalid_argument(which() + " is a scalar, got a view");
      const bool wants_f32 = spec.dtype == isa::DType::kF32;
      if (wants_f32 != (arg.kind() == LaunchArg::Kind::kScalarF32)) {
        return invalid_argument(which() + " is a " + std::string(isa::dtype_name(spec.dtype)) + " scalar, got " +
                                (wants_f32 ? "an integer" : "an f32"));
      }
      continue;
    }
    if (arg.kind() != LaunchArg::Kind::kView) return invalid_argument(which() + " is a buffer, got a scalar");
    const View& view = arg.view();
    NPURT_RETURN_IF_ERROR_CTX(check_view(view), which());
    if (arg.expected_access() && *arg.expected_access() != spec.access) {
      return invalid_argument(which() + " is bound as " + access_text(*arg.expected_access()) +
                              " but the image declares " + access_text(spec.access));
    }
    if (view.empty()) return invalid_argument(which() + ": empty view");
    const uint64_t unit = isa::dtype_block_bytes(spec.dtype);
    if (unit != 0 && view.size() % unit != 0) {
      return invalid_argument(which() + ": view of " + std::to_string(view.size()) + " bytes is not a whole number of " +
                              std::string(isa::dtype_name(spec.dtype)) +
                              (isa::dtype_is_quantized(spec.dtype) ? " blocks (" : " elements (") +
                              std::to_string(unit) + " bytes)");
    }
  }
  return ok_status();
}

Status Planner::plan_views(Plan& p, const std::function<std::string(size_t)>& label) {
  // Learn which earlier work finished or failed: failed uploads are sent again, and
  // finished work needs no wait.
  fences_->poll();
  for (const PlannedView& pv : views_) {
    const View& v = *pv.view;
    BufferState& b = *MemoryCore::state_of(v);
    const ByteRange r{v.offset(), v.end()};
    p.bindings.push_back({&b, r, pv.access});
    if (pv.access == isa::Access::kOut) continue;
    if (b.tracker) NPURT_RETURN_IF_ERROR_CTX(raw_writes_->absorb(b, r), label(pv.index));
    resend_failed_uploads(b, r);
    // Device work must not consume device bytes whose writer failed (bytes the host
    // replaced since are uploaded instead, which is fine).
    Status failed;
    b.map.for_each_in(r.begin, r.end, [&](uint64_t pb, uint64_t pe, CoherenceState st) {
      if (st != CoherenceState::kDeviceNewer || !failed.ok()) return;
      b.deps.for_each_in(pb, pe, [&](uint64_t, uint64_t, const DepState& d) {
        if (failed.ok()) failed = fences_->failure(d.writer);
      });
    });
    if (!failed.ok()) {
      return failed.with_context(label(pv.index) + " of buffer '" + b.name + "' was written by device work that failed");
    }
  }
  // The stale bytes the work reads; a byte bound twice is uploaded once.
  coherence_->plan_moves(p);
  merge_moves(p.moves);
  // Conflicting earlier work: writers of everything touched, readers of everything
  // written (by the uploads or the work).
  ordering_->plan_waits(p);
  return ok_status();
}

void Planner::resend_failed_uploads(BufferState& b, ByteRange r) {
  if (!resend_failed_uploads_) return;
  pieces_.clear();
  b.deps.for_each_in(r.begin, r.end, [&](uint64_t db, uint64_t de, const DepState& d) {
    if (fences_->failure(d.writer).ok()) return;
    b.map.for_each_in(db, de, [&](uint64_t s, uint64_t e, CoherenceState st) {
      if (st == CoherenceState::kBothValid) pieces_.push_back({s, e});
    });
  });
  for (const ByteRange& p : pieces_) b.map.host_written(p.begin, p.end);
}

}  // namespace npurt::memory_detail
