// MemoryContext: host/device coherence and ordering for a device's buffers.
//
// The context creates Buffers (buffer.h) and is the only thing that moves their
// bytes. It keeps, per buffer,
//   * a CoherenceMap: for every byte range, which side holds the newest bytes
//     (host-newer, device-newer, both valid, uninitialized);
//   * a dependency map: for every byte range of the device copy, the last device
//     operation that writes it and the ones that read it, as device events;
//   * in tracked mode, a PageWriteTracker over the host mirror.
//
// Rules:
//   * Host writes are recorded for their exact bytes: write()/overwrite() guards
//     (host_access.h) and mark_host_written() mark their view host-newer; in tracked
//     mode raw writes are recorded per page (below).
//   * A sync moves exactly the stale bytes of the requested view: to_device(view)
//     and the inputs of a launch upload the view's host-newer bytes; read()/write()
//     guards and to_host(view) download its device-newer bytes. Nothing else moves:
//     a sync of view B never clears view A's mark, never uploads A, and never
//     overwrites a sibling's newer device bytes; resident data is uploaded once.
//   * launch() binds views to the image's argument signature. `in` and `inout`
//     views are synced first; `out` and `inout` views are device-newer afterwards,
//     every time, so a later host read of an output always fetches what that launch
//     wrote. An `out` argument promises the kernel writes every byte of its view
//     (host bytes it held are superseded); use `inout` for partial writes.
//   * Ordering (read-after-write, write-after-read, write-after-write): a launch
//     and its input uploads wait for the device operations that last wrote the
//     bytes they read or write, and for those still reading bytes they overwrite,
//     on whatever stream those ran; to_device() waits likewise on the host, and
//     host fetches wait for the writer of the bytes they fetch. Operations on one
//     stream are ordered by the stream itself.
//   * A buffer's device memory is freed only after the device work using it
//     completed (deferred, never refused).
//   * Bad input (a view out of range or of a freed buffer, a launch whose arguments
//     do not match the image, a view of another context) is a Status naming the
//     problem; nothing is enqueued and the device stays usable.
//
// What "sync" means in time. to_device(), to_host(), read(), write() and
// overwrite() are synchronous: when they return, the bytes have moved (they run on
// a transfer stream of the context's and block the calling thread, including on the
// device work they must wait for). launch() is asynchronous: it enqueues the input
// uploads, the waits and the launch on the caller's stream and returns. Its
// uploads read a snapshot of the stale host bytes taken during the call, so the
// host may write the mirror again as soon as launch() returns.
//
// Tracked mode (BufferOptions::track_writes, Buffer::enable_tracking()). The mirror
// is write-protected; the first write to a clean page, from any thread and by any
// means (memcpy, std::copy, strided loops, another thread), is caught and the page
// recorded as dirty. Before a buffer's bytes are synced or fetched, the dirty pages
// of the affected range are collected: their bytes become host-newer (so uploads
// are page-granular for raw writes) and the pages are protected again. Bytes that
// are device-newer stay device-newer: the mirror holds stale bytes there, and a raw
// write into them (rather than after fetching them, or through overwrite() /
// mark_host_written()) cannot be told apart from the stale bytes around it, so the
// device's bytes win. MemoryStats::tracked_conflict_pages counts dirty pages that
// held such bytes. Downloads into the mirror and guard writes are not counted as
// raw writes. A raw write must happen-before the context call that should see it
// (as for any shared data); a raw write racing with a fetch into the same page may
// be lost.
//
// Faults. Device work that fails (a copy, a kernel, an aborted stream) loses nothing
// the host still has:
//   * a synchronous transfer that fails changes no state: a failed upload leaves its
//     bytes host-newer (sent again by the next sync), a failed download leaves them
//     device-newer (fetched again by the next read);
//   * the uploads of a launch or command whose stream failed are sent again by the
//     next sync or launch that needs those bytes on the device (the host's bytes were
//     never overwritten);
//   * bytes a failed launch or command writes (`out`, `inout`) hold garbage: host reads
//     of them and device work consuming them fail with that work's error until they
//     are rewritten (a host overwrite(), or a later launch's `out`);
//   * when a launch's completion cannot be recorded (the event record is refused),
//     nothing could order later work after it: the call aborts its stream
//     (hal::Device::abort_stream, bounded even for a hung kernel), the work counts as
//     failed, and the error names the refused record and any earlier failure of the
//     stream. The caller replaces the stream, as after any failure.
//
// Threading: all methods are thread-safe; one mutex per context serializes them,
// including their waits on the device (so a read() waiting for a long kernel delays
// other threads' calls on the same context). launch() may be called from any
// thread with any stream, such as a Worker's run callable with its slot's stream.
//
// Lifetime: the context and its buffers keep the device alive. The destructor waits
// for all device work the context enqueued or depends on, frees every buffer's device
// memory and destroys its streams and events. Buffers, views and guards may outlive
// it: their calls then fail with kFailedPrecondition, and destroying them is safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "npurt/base/status.h"
#include "npurt/exec/code_registry.h"
#include "npurt/hal/device.h"
#include "npurt/isa/image.h"
#include "npurt/memory/buffer.h"
#include "npurt/memory/host_access.h"
#include "npurt/memory/launch_arg.h"
#include "npurt/memory/launch_plan.h"

namespace npurt {

// Hazard::kNaiveCoherence (base/hazards.h) is WRONG on purpose: it emulates the
// production runtime whose stale-data bugs the exact tracking above prevents, so that
// tests can show they catch them. Per buffer it keeps two flags instead of a
// coherence map:
  //   * a residency flag: the first sync of any view uploads the whole buffer and
  //     sets it (the "initial upload"); after that, a declared host write on any view
  //     sets one shared dirty flag, and the next sync of any view uploads that view
  //     only and clears the flag (a sibling's sync swallows the mark);
  //   * a read-back flag: set by the first launch that writes the buffer, cleared by
  //     the next host fetch, which downloads the whole buffer; later launches do not
//     set it again (looped dispatches return a stale output);
// and it ignores tracked-mode raw writes. Dependencies are tracked as exactly.
// The context's other hazards: kUnorderedConflicts (transfers and launches no longer
// wait for conflicting work on other streams; dependencies are still recorded, frees
// still deferred), kNoResendOfFailedUploads (bytes whose upload belonged to work that
// failed count as on the device, see "Faults" above), kLaunchesDropTheirCode (a
// launch does not hold its code). A context reads them when it is made.

struct MemoryOptions {
  // Staging memory kept for reuse by launch() uploads once their copies completed.
  uint64_t max_pooled_staging_bytes = 64ull << 20;
};

// Counters since the context's creation. The device's own Counters are the
// independent evidence of bytes moved; these say why.
struct MemoryStats {
  uint64_t buffers_created = 0;
  uint64_t buffers_live = 0;
  uint64_t h2d_bytes = 0, h2d_copies = 0;  // uploads enqueued
  uint64_t d2h_bytes = 0, d2h_copies = 0;  // downloads
  uint64_t launches = 0;
  uint64_t staging_bytes = 0;  // bytes copied into launch staging
  uint64_t fences_recorded = 0;
  uint64_t events_created = 0;           // device events ever created
  uint64_t events_live = 0;              // device events held now
  uint64_t device_waits = 0;             // wait_event commands enqueued
  uint64_t host_waits = 0;               // event_synchronize calls
  uint64_t deferred_frees = 0;           // frees postponed for running work
  uint64_t pending_frees = 0;            // postponed frees not yet done
  uint64_t tracked_pages_collected = 0;  // dirty pages recorded as host writes
  uint64_t tracked_conflict_pages = 0;   // dirty pages that held device-newer bytes
  uint64_t host_bytes_dropped = 0;       // mirror bytes released by drop_host_copy
  uint64_t retained_bytes = 0;           // device bytes kept until exit (retain_until_exit)
  friend bool operator==(const MemoryStats&, const MemoryStats&) = default;
};

class MemoryContext {
 public:
  // A context on `device`, which it (and every buffer of it) keeps alive.
  static StatusOr<std::unique_ptr<MemoryContext>> create(std::shared_ptr<hal::Device> device,
                                                         MemoryOptions options = {});
  ~MemoryContext();
  // What the destructor does, now: later calls on the context and its buffers fail
  // with kFailedPrecondition. Idempotent.
  void close();
  MemoryContext(const MemoryContext&) = delete;
  MemoryContext& operator=(const MemoryContext&) = delete;

  const MemoryOptions& options() const;
  hal::Device& device() const;

  // A buffer of `bytes` (> 0) bytes; all bytes uninitialized (nothing to move in
  // either direction until a side writes them). kInvalidArgument for a zero size or
  // bad alignment; the device's error (kResourceExhausted) when it is full.
  StatusOr<Buffer> create_buffer(uint64_t bytes, BufferOptions options = {});

  // ---- host access (synchronous) ----
  StatusOr<ReadGuard> read(const View& view);
  StatusOr<WriteGuard> write(const View& view);
  StatusOr<WriteGuard> overwrite(const View& view);
  // Declares that the host wrote every byte of `view` through a raw pointer.
  Status mark_host_written(const View& view);
  // Uploads the view's host-newer bytes / downloads its device-newer bytes.
  Status to_device(const View& view);
  Status to_host(const View& view);
  // Gives the host's copy of `view` back to the system, for bytes the host will not
  // read or write again (weights, caches): the device keeps the only copy. Host-newer
  // bytes are uploaded first and uploads still in flight are waited for (one that
  // failed is sent again), so nothing is lost; then the mirror pages that lie wholly
  // inside the view (the last one too when the view reaches the buffer's end) are
  // released and their bytes become device-newer. A later read or write guard,
  // to_host() or download fetches them again, never a stale byte; raw pointers see
  // zeros there until then (see buffer.h, "Raw pointers"); in tracked mode a raw write
  // to them is caught and loses to the device's bytes, as for any device-newer byte.
  Status drop_host_copy(const View& view);

  // Someone outside the context may write the device bytes of `view` at any later
  // time (an MPI request that timed out, which MPI cannot cancel): the device block of
  // its buffer is never freed nor reused while the process lives, whatever happens to
  // the buffer and the context, and the device itself is kept alive. free() and close()
  // then leave that block allocated. Safe to call from a stream's host function, while
  // other threads wait for that stream. Counted in MemoryStats::retained_bytes.
  Status retain_until_exit(const View& view);

  // ---- device access (asynchronous) ----
  // Enqueues on `stream`: waits for conflicting earlier work, the upload of the
  // stale bytes of `in`/`inout` views, and the launch of `code`, an image resident
  // through an exec::CodeRegistry. The launch holds a copy of `code` until its work
  // has completed, so the image stays resident (and its address is not handed to
  // other code) however soon the caller drops its own handle. Checks first,
  // enqueuing nothing on a mismatch: an empty handle, argument count, buffer vs scalar, scalar type,
  // expected access, view length a whole number of `dtype` elements (blocks), views
  // non-empty, attached, alive and of this context (kInvalidArgument or
  // kFailedPrecondition naming the kernel and the argument); and no input whose
  // device bytes were written by work known to have failed (that work's error).
  // Device errors while enqueuing are returned. The kernel's own failure surfaces on
  // the stream, on host reads of its outputs, and on launches that consume them.
  Status launch(hal::StreamId stream, const exec::CodeHandle& code, uint32_t grid,
                std::span<const LaunchArg> args);
  // What launch(stream, code, grid, args) of `image` would do now (launch_plan.h),
  // with the same checks and errors, enqueuing nothing and changing no state (it
  // records the raw writes tracked mode caught in its inputs and the failed uploads
  // it learns of, as any call does).
  StatusOr<LaunchPlan> plan_launch(hal::StreamId stream, const isa::Image& image, uint32_t grid,
                                   std::span<const LaunchArg> args);

  // Device work other than a kernel launch (a collective, a peer copy): the views it
  // uses and what it does with each. enqueue_command() plans it as it plans a launch
  // (the same checks, waits and uploads of stale `in`/`inout` bytes), calls `enqueue`
  // with the stream and each view's device range (KernelArg::buffer, in order) to
  // enqueue the work, then records its completion: `out`/`inout` views are
  // device-newer afterwards, and later work and host reads wait for it. `name`
  // names the work in errors. `enqueue` must not call back into this context.
  struct CommandArg {
    View view;
    isa::Access access = isa::Access::kIn;
  };
  using EnqueueCommand = std::function<Status(hal::StreamId, std::span<const hal::KernelArg>)>;
  Status enqueue_command(hal::StreamId stream, std::string_view name, std::span<const CommandArg> args,
                         const EnqueueCommand& enqueue);

  // While the returned scope lives, this thread's launches and commands on the
  // context collect a tracked buffer's raw writes once, at its first use, over every
  // page holding a byte that is not device-newer (a raw write into device-newer bytes
  // loses to them anyway), instead of over each input view at every launch (a decode
  // step's 16 launches used to scan their views' pages over 300 times). For a caller that
  // enqueues several launches in one go and writes through no raw pointer meanwhile,
  // as a sequence does: raw writes made before the scope reach every launch in it;
  // one made while it lives is caught at the buffer's first use after it. An inner
  // scope on the same thread changes nothing.
  class RawWriteScan {
   public:
    ~RawWriteScan();
    RawWriteScan(const RawWriteScan&) = delete;
    RawWriteScan& operator=(const RawWriteScan&) = delete;

   private:
    friend class MemoryContext;
    explicit RawWriteScan(std::shared_ptr<memory_detail::MemoryCore> core);
    std::shared_ptr<memory_detail::MemoryCore> core_;  // null: another scope was active
  };
  [[nodiscard]] RawWriteScan scan_raw_writes_once();

  // Blocks until every device operation the context knows of has completed.
  // Returns the first failure among them, if any.
  Status synchronize();

  MemoryStats stats() const;

 private:
  explicit MemoryContext(std::shared_ptr<memory_detail::MemoryCore> core);
  std::shared_ptr<memory_detail::MemoryCore> core_;
};

}  // namespace npurt
