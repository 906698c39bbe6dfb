// MemoryContext::launch: planned (rules.h), then executed and committed.

#include <algorithm>
#include <cstring>
#include <functional>

#include "memory/memory_core.h"

namespace npurt::memory_detail {
namespace {

std::string access_text(isa::Access a) { return "'" + std::string(isa::access_name(a)) + "'"; }
std::string launch_text(const isa::Image& image) { return "launch of '" + image.name() + "'"; }

}  // namespace

Status MemoryCore::validate_launch(const isa::Image& image, uint32_t grid,
                                   std::span<const LaunchArg> args) const {
  if (grid == 0) return invalid_argument(launch_text(image) + ": empty grid");
  const std::vector<isa::ArgSpec>& specs = image.args();
  if (args.size() != specs.size()) {
    return invalid_argument(launch_text(image) + ": the image declares " +
                            std::to_string(specs.size()) + " arguments, got " +
                            std::to_string(args.size()));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const isa::ArgSpec& spec = specs[i];
    const LaunchArg& arg = args[i];
    auto which = [&] {
      return launch_text(image) + ": argument " + std::to_string(i) + " ('" + spec.name + "')";
    };
    if (spec.kind == isa::ArgKind::kScalar) {
      if (arg.kind() == LaunchArg::Kind::kView) {
        return invalid_argument(which() + " is a scalar, got a view");
      }
      const bool wants_f32 = spec.dtype == isa::DType::kF32;
      if (wants_f32 != (arg.kind() == LaunchArg::Kind::kScalarF32)) {
        return invalid_argument(which() + " is a " + std::string(isa::dtype_name(spec.dtype)) +
                                " scalar, got " + (wants_f32 ? "an integer" : "an f32"));
      }
      continue;
    }
    if (arg.kind() != LaunchArg::Kind::kView) {
      return invalid_argument(which() + " is a buffer, got a scalar");
    }
    const View& view = arg.view();
    NPURT_RETURN_IF_ERROR_CTX(check_view(view), which());
    if (arg.expected_access() && *arg.expected_access() != spec.access) {
      return invalid_argument(which() + " is bound as " + access_text(*arg.expected_access()) +
                              " but the image declares " + access_text(spec.access));
    }
    if (view.empty()) return invalid_argument(which() + ": empty view");
    const uint64_t unit = isa::dtype_block_bytes(spec.dtype);
    if (unit != 0 && view.size() % unit != 0) {
      return invalid_argument(which() + ": view of " + std::to_string(view.size()) +
                              " bytes is not a whole number of " +
                              std::string(isa::dtype_name(spec.dtype)) +
                              (isa::dtype_is_quantized(spec.dtype) ? " blocks (" : " elements (") +
                              std::to_string(unit) + " bytes)");
    }
  }
  return ok_status();
}

Status MemoryCore::plan_kernel(hal::StreamId stream, const isa::Image& image, uint32_t grid,
                               std::span<const LaunchArg> args) {
  NPURT_RETURN_IF_ERROR_CTX(check_open(), launch_text(image));
  NPURT_RETURN_IF_ERROR(validate_launch(image, grid, args));
  const std::vector<isa::ArgSpec>& specs = image.args();
  views_.clear();
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].kind != isa::ArgKind::kBuffer) continue;
    views_.push_back({&args[i].view(), args[i].is_written_first() ? isa::Access::kOut : specs[i].access, i});
  }
  return plan_views(stream, [&](size_t i) {
    return launch_text(image) + ": argument " + std::to_string(i) + " ('" + specs[i].name + "')";
  });
}

Status MemoryCore::plan_command(hal::StreamId stream, std::string_view name, std::span<const CommandArg> args) {
  auto which = [&](size_t i) { return std::string(name) + ": view " + std::to_string(i); };
  NPURT_RETURN_IF_ERROR_CTX(check_open(), std::string(name));
  views_.clear();
  for (size_t i = 0; i < args.size(); ++i) {
    NPURT_RETURN_IF_ERROR_CTX(check_view(args[i].view), which(i));
    if (args[i].view.empty()) return invalid_argument(which(i) + ": empty view");
    views_.push_back({&args[i].view, args[i].access, i});
  }
  return plan_views(stream, which);
}

Status MemoryCore::plan_views(hal::StreamId stream, const std::function<std::string(size_t)>& label) {
  // Learn which earlier work finished or failed: failed uploads are sent again, and
  // finished work needs no wait.
  fences_.poll();
  Plan& p = plan_;
  p.reset(/*is_upload=*/true, /*is_launch=*/true, stream);
  for (const PlannedView& pv : views_) {
    const View& v = *pv.view;
    BufferState& b = *v.buffer_;
    p.bindings.push_back({&b, {v.offset(), v.end()}, pv.access});
    if (pv.access == isa::Access::kOut) continue;
    if (b.tracker) NPURT_RETURN_IF_ERROR_CTX(absorb_dirty(b, v.offset(), v.end()), label(pv.index));
    resend_failed_uploads(b, {v.offset(), v.end()});
    // Device work must not consume device bytes whose writer failed (bytes the host
    // replaced since are uploaded instead, which is fine).
    Status failed;
    b.map.for_each_in(v.offset(), v.end(), [&](uint64_t pb, uint64_t pe, CoherenceState st) {
      if (st != CoherenceState::kDeviceNewer || !failed.ok()) return;
      b.deps.for_each_in(pb, pe, [&](uint64_t, uint64_t, const DepState& d) {
        if (failed.ok()) failed = fences_.failure(d.writer);
      });
    });
    if (!failed.ok()) {
      return failed.with_context(label(pv.index) + " of buffer '" + b.name + "' was written by device work that failed");
    }
  }
  // The stale bytes the work reads; a byte bound twice is uploaded once.
  coherence_->plan_moves(p);
  if (p.moves.size() > 1) {
    std::sort(p.moves.begin(), p.moves.end(), [](const Plan::Move& a, const Plan::Move& b) {
      return a.buffer != b.buffer ? std::less<>()(a.buffer, b.buffer)
                                  : a.range.begin < b.range.begin;
    });
    size_t kept = 0;
    for (size_t i = 1; i < p.moves.size(); ++i) {
      Plan::Move& last = p.moves[kept];
      if (p.moves[i].buffer == last.buffer && p.moves[i].range.begin <= last.range.end) {
        last.range.end = std::max(last.range.end, p.moves[i].range.end);
      } else {
        p.moves[++kept] = p.moves[i];
      }
    }
    p.moves.resize(kept + 1);
  }
  // Conflicting earlier work: writers of everything touched, readers of everything
  // written (by the uploads or the work).
  ordering_->plan_waits(p);
  return ok_status();
}

StatusOr<LaunchPlan> MemoryCore::plan_launch(hal::StreamId stream, const isa::Image& image,
                                             uint32_t grid, std::span<const LaunchArg> args) {
  std::lock_guard<std::mutex> lock(mu_);
  NPURT_RETURN_IF_ERROR(plan_kernel(stream, image, grid, args));
  LaunchPlan out;
  for (const Plan::Move& m : plan_.moves) out.uploads.push_back({m.buffer->name, m.range});
  for (const Plan::Binding& bd : plan_.bindings) {
    out.bindings.push_back({bd.buffer->name, bd.range, bd.access});
  }
  out.waits = plan_.waits.size();
  return out;
}

Status MemoryCore::launch(hal::StreamId stream, const exec::CodeHandle& code, uint32_t grid,
                          std::span<const LaunchArg> args) {
  if (!code) return invalid_argument("launch: the code handle is empty (unregistered or moved from)");
  std::lock_guard<std::mutex> lock(mu_);
  reap_deferred_frees();
  release_finished_code();
  NPURT_RETURN_IF_ERROR(plan_kernel(stream, *code.image(), grid, args));
  return execute_launch(code, grid, args);
}

Status MemoryCore::execute_launch(const exec::CodeHandle& code, uint32_t grid, std::span<const LaunchArg> args) {
  const isa::Image& image = *code.image();
  const auto work = [&](hal::StreamId stream) {
    params_.image = code.address();
    params_.grid = grid;
    params_.args.clear();
    for (const LaunchArg& a : args) {
      if (a.kind() == LaunchArg::Kind::kView) {
        const View& v = a.view();
        params_.args.push_back(hal::KernelArg::buffer(v.buffer_->device_addr + v.offset(), v.size()));
      } else {
        params_.args.push_back(hal::KernelArg{true, hal::DeviceAddr{}, 0, a.scalar_bits()});
      }
    }
    return device_->launch(stream, params_);
  };
  return execute_plan([&] { return launch_text(image); }, work, &code);
}

Status MemoryCore::enqueue_command(hal::StreamId stream, std::string_view name, std::span<const CommandArg> args,
                                   const MemoryContext::EnqueueCommand& enqueue) {
  std::lock_guard<std::mutex> lock(mu_);
  reap_deferred_frees();
  NPURT_RETURN_IF_ERROR(plan_command(stream, name, args));
  return execute_plan([&] { return std::string(name); }, [&](hal::StreamId s) {
    params_.args.clear();
    for (const CommandArg& a : args) {
      params_.args.push_back(hal::KernelArg::buffer(a.view.buffer_->device_addr + a.view.offset(), a.view.size()));
    }
    return enqueue(s, params_.args);
  });
}

Status MemoryCore::execute_plan(const std::function<std::string()>& what,
                                const std::function<Status(hal::StreamId)>& work, const exec::CodeHandle* code) {
  const Plan& p = plan_;
  for (const FenceRef& w : p.waits) {
    NPURT_RETURN_IF_ERROR_CTX(fences_.device_wait(p.stream, w), what() + ": waiting for earlier work");
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
    s = device_->copy_to_device(p.stream, m.buffer->device_addr + m.range.begin, snapshot,
                                m.range.size());
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
  StatusOr<FenceRef> recorded = fences_.record(p.stream);
  FenceRef fence = recorded.ok() ? *recorded : FenceRef{};
  Status untracked;
  if (!recorded.ok()) {
    // Enqueued but untrackable: nothing could order later work after it, and waiting
    // for it here could wait forever (a hung kernel). So it is stopped: its stream is
    // aborted (which returns once the stream is idle) and the work counts as failed.
    device_->abort_stream(p.stream).ignore();
    untracked = device_->stream_synchronize(p.stream);
    fence = fences_.failed(recorded.status());
  }
  stats_.h2d_bytes += staged;
  stats_.h2d_copies += copies;
  stats_.staging_bytes += staged;
  ++stats_.launches;
  commit(fence);
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

}  // namespace npurt::memory_detail
