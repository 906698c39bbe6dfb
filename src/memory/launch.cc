// MemoryContext::launch: binds views to an image's argument signature, syncs the
// inputs' stale bytes, orders the launch after conflicting work and records what it
// reads and writes.

#include <algorithm>
#include <cstring>

#include "memory/memory_core.h"
#include "npurt/memory/launch_arg.h"

namespace npurt {

LaunchArg LaunchArg::scalar_f32(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return LaunchArg(Kind::kScalarF32, bits);
}

namespace memory_detail {
namespace {

std::string access_text(isa::Access a) { return "'" + std::string(isa::access_name(a)) + "'"; }

}  // namespace

Status MemoryCore::validate_launch(const isa::Image& image, uint32_t grid,
                                   std::span<const LaunchArg> args) const {
  auto kernel = [&] { return "launch of '" + image.name() + "'"; };
  if (grid == 0) return invalid_argument(kernel() + ": empty grid");
  const std::vector<isa::ArgSpec>& specs = image.args();
  if (args.size() != specs.size()) {
    return invalid_argument(kernel() + ": the image declares " + std::to_string(specs.size()) +
                            " arguments, got " + std::to_string(args.size()));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    const isa::ArgSpec& spec = specs[i];
    const LaunchArg& arg = args[i];
    auto which = [&] {
      return kernel() + ": argument " + std::to_string(i) + " ('" + spec.name + "')";
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

Status MemoryCore::launch(hal::StreamId stream, hal::DeviceAddr code, const isa::Image& image,
                          uint32_t grid, std::span<const LaunchArg> args) {
  std::lock_guard<std::mutex> lock(mu_);
  auto kernel = [&] { return "launch of '" + image.name() + "'"; };
  NPURT_RETURN_IF_ERROR_CTX(check_open(), kernel());
  NPURT_RETURN_IF_ERROR(validate_launch(image, grid, args));
  reap_deferred_frees();

  const std::vector<isa::ArgSpec>& specs = image.args();
  bindings_.clear();
  uploads_.clear();
  waits_.clear();
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].kind != isa::ArgKind::kBuffer) continue;
    const View& v = args[i].view();
    bindings_.push_back({v.buffer_.get(), {v.offset(), v.end()}, specs[i].access});
  }

  // A kernel must not consume device bytes whose writer failed (bytes the host
  // replaced since are uploaded instead, which is fine).
  for (size_t i = 0, b = 0; i < specs.size() && exact(); ++i) {
    if (specs[i].kind != isa::ArgKind::kBuffer) continue;
    const Binding& bd = bindings_[b++];
    if (bd.access == isa::Access::kOut) continue;
    Status failed;
    bd.buffer->map.for_each_in(
        bd.range.begin, bd.range.end, [&](uint64_t pb, uint64_t pe, CoherenceState st) {
          if (st != CoherenceState::kDeviceNewer || !failed.ok()) return;
          bd.buffer->deps.for_each_in(pb, pe, [&](uint64_t, uint64_t, const DepState& d) {
            if (failed.ok()) failed = fences_.failure(d.writer);
          });
        });
    if (!failed.ok()) {
      return failed.with_context(kernel() + ": argument " + std::to_string(i) + " ('" +
                                 specs[i].name + "') of buffer '" + bd.buffer->name +
                                 "' was written by device work that failed");
    }
  }

  // 1. The stale bytes the kernel reads. A byte bound twice is uploaded once.
  for (const Binding& bd : bindings_) {
    if (bd.access == isa::Access::kOut) continue;
    auto ranges = plan_upload(*bd.buffer, bd.range.begin, bd.range.end);
    if (!ranges.ok()) return ranges.status().with_context(kernel());
    for (const ByteRange& r : *ranges) uploads_.push_back({bd.buffer, r});
  }
  if (uploads_.size() > 1) {
    std::sort(uploads_.begin(), uploads_.end(), [](const Upload& a, const Upload& b) {
      return a.buffer != b.buffer ? std::less<>()(a.buffer, b.buffer)
                                  : a.range.begin < b.range.begin;
    });
    size_t kept = 0;
    for (size_t i = 1; i < uploads_.size(); ++i) {
      Upload& last = uploads_[kept];
      if (uploads_[i].buffer == last.buffer && uploads_[i].range.begin <= last.range.end) {
        last.range.end = std::max(last.range.end, uploads_[i].range.end);
      } else {
        uploads_[++kept] = uploads_[i];
      }
    }
    uploads_.resize(kept + 1);
  }

  // 2. Conflicting earlier work: writers of everything touched, readers of
  // everything written (by the uploads or the kernel).
  for (const Binding& bd : bindings_) {
    collect_waits(*bd.buffer, bd.range, bd.access != isa::Access::kIn);
  }
  for (const Upload& u : uploads_) collect_waits(*u.buffer, u.range, /*writes=*/true);
  std::sort(waits_.begin(), waits_.end());
  waits_.erase(std::unique(waits_.begin(), waits_.end()), waits_.end());

  // 3. Snapshot of the stale host bytes: the mirror is free again when we return.
  uint64_t staged = 0;
  for (const Upload& u : uploads_) staged += u.range.size();
  Staging staging;
  if (staged != 0) {
    staging = take_staging(staged);
    uint64_t off = 0;
    for (const Upload& u : uploads_) {
      std::memcpy(staging.data.get() + off, u.buffer->mirror + u.range.begin, u.range.size());
      off += u.range.size();
    }
  }

  // 4. Enqueue: waits, uploads, the launch, its fence.
  for (const FenceRef& w : waits_) {
    NPURT_RETURN_IF_ERROR_CTX(fences_.device_wait(stream, w),
                              kernel() + ": waiting for earlier work");
  }
  Status s;
  size_t copies = 0;
  uint64_t off = 0;
  for (const Upload& u : uploads_) {
    s = device_->copy_to_device(stream, u.buffer->device_addr + u.range.begin,
                                staging.data.get() + off, u.range.size());
    if (!s.ok()) break;
    ++copies;
    off += u.range.size();
  }
  if (s.ok()) {
    params_.image = code;
    params_.grid = grid;
    params_.args.clear();
    for (size_t i = 0; i < specs.size(); ++i) {
      const LaunchArg& a = args[i];
      if (a.kind() == LaunchArg::Kind::kView) {
        const View& v = a.view();
        params_.args.push_back(
            hal::KernelArg::buffer(v.buffer_->device_addr + v.offset(), v.size()));
      } else {
        hal::KernelArg k;
        k.is_scalar = true;
        k.bits = a.scalar_bits();
        params_.args.push_back(k);
      }
    }
    s = device_->launch(stream, params_);
  }
  if (!s.ok()) {
    // Copies already enqueued read the staging memory; it must outlive them.
    if (copies != 0) device_->stream_synchronize(stream).ignore();
    return s.with_context(kernel());
  }
  StatusOr<FenceRef> recorded = fences_.record(stream);
  Status result;
  FenceRef fence;
  if (recorded.ok()) {
    fence = *recorded;
  } else {
    // The launch is enqueued but cannot be tracked: wait until it is over, so
    // nothing later needs to wait for it, and still record what it did.
    device_->stream_synchronize(stream).ignore();
    result = recorded.status().with_context(kernel() + ": recording its completion");
  }

  // 5. What the launch did to each range.
  stats_.h2d_bytes += staged;
  stats_.h2d_copies += copies;
  stats_.staging_bytes += staged;
  ++stats_.launches;
  for (const Upload& u : uploads_) {
    set_writer(*u.buffer, u.range, fence);
    if (exact()) u.buffer->map.mark_synced(u.range.begin, u.range.end);
  }
  if (fence.valid()) {
    for (const Binding& bd : bindings_) {
      if (bd.access != isa::Access::kOut) add_reader(*bd.buffer, bd.range, fence, stream);
    }
  }
  for (const Binding& bd : bindings_) {
    if (bd.access == isa::Access::kIn) continue;
    set_writer(*bd.buffer, bd.range, fence);
    if (exact()) {
      bd.buffer->map.device_written(bd.range.begin, bd.range.end);
    } else if (!bd.buffer->naive.read_back_once) {
      bd.buffer->naive.readback_pending = true;
    }
  }
  if (staged != 0) pending_staging_.push_back({fence, std::move(staging)});
  return result;
}

}  // namespace memory_detail
}  // namespace npurt
