// PageWriteTracker: catches host writes made through raw pointers, per page.
//
// Tracked mode (docs/architecture.md, "Memory and coherence") lets callers write a buffer's
// host mirror through plain pointers (memcpy, numpy, other threads) without
// declaring the writes. The tracker watches a page-aligned region: while armed,
// clean pages are write-protected; the first write to a clean page is caught and
// the page becomes dirty (and writable, so later writes to it cost nothing). Before
// a sync the owner calls take_dirty(), which reports the dirty pages and protects
// them again, so the next write after the sync is caught too.
//
// Mechanisms, picked at creation (see WriteTrackingMechanism):
//   userfaultfd  asynchronous userfaultfd write-protect (UFFD_FEATURE_WP_ASYNC,
//                Linux >= 6.7): the kernel resolves write faults itself and keeps
//                the "written" bit in the page table; take_dirty() collects and
//                re-protects in one PAGEMAP_SCAN call. No signal handler, and writes
//                made by the kernel on the process's behalf (read(2) into the
//                region) are caught as well.
//   mprotect     mprotect(PROT_READ) plus a process-wide SIGSEGV handler that
//                records the page and makes it writable again. Works everywhere;
//                costs a signal per first write. Writes made by the kernel (read(2)
//                into a protected page) fail with EFAULT instead of being caught, so
//                never hand a protected region to a syscall that writes it.
// Auto prefers userfaultfd and falls back to mprotect. The environment variable
// NPURT_WRITE_TRACKING=uffd|mprotect|auto forces a choice when the caller asks for
// kAuto.
//
// Ownership and lifetime: the tracker does not own the memory. The region must be
// readable and writable and stay mapped for the tracker's lifetime (a host mirror:
// private anonymous memory). Memory the kernel refuses to register for userfaultfd
// falls back to mprotect under kAuto. The mprotect mechanism makes one no-op atomic
// write to the first page at creation (see write_tracker.cc). On destruction every
// page is made writable again and tracking stops. Writes into the region must not
// race with the destructor.
//
// Granularity: dirty state is per page. take_dirty() reports whole pages, which
// may extend past the requested byte range to its enclosing page boundaries; every
// reported byte must be treated as written, since the write may have hit any of them.
//
// Threading: the region may be written from any thread at any time. Control calls
// (arm, take_dirty, clear, mark_all_dirty) must be serialized by the caller (the
// owning Buffer does). A write racing with take_dirty() is either reported by that
// call, and then visible to the caller's subsequent reads of the region, or caught
// again afterwards and reported by the next call; it is never lost.
//
// mprotect mechanism and signals: the SIGSEGV handler is installed once, when the
// first tracker using it is created, and never removed. Faults outside tracked
// regions are passed to the handler that was installed before (sanitizers,
// crash reporters); if there was none, the process dies of SIGSEGV as it would
// have without npurt. Handlers installed after npurt's must chain to it likewise.
// Forking a process with live trackers is not supported.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "npurt/base/status.h"
#include "npurt/memory/coherence_map.h"  // ByteRange

namespace npurt {

enum class WriteTrackingMechanism : uint8_t {
  kAuto,         // userfaultfd if the kernel offers it, else mprotect
  kUserfaultfd,  // asynchronous userfaultfd write-protect + PAGEMAP_SCAN
  kMprotect,     // mprotect + SIGSEGV handler
};

const char* write_tracking_mechanism_name(WriteTrackingMechanism mechanism);

struct WriteTrackerStats {
  // First writes to protected pages that the tracker recorded. For userfaultfd
  // these are counted when collected, as the pages found written (the kernel took
  // one fault for each, or mark_all_dirty() unprotected it).
  uint64_t faults_caught = 0;
  // Pages write-protected again by take_dirty() after being dirty.
  uint64_t pages_reprotected = 0;
  // Syscalls issued to change protection from control calls (mprotect,
  // UFFDIO_WRITEPROTECT, PAGEMAP_SCAN); the fault path is counted in faults_caught.
  uint64_t protect_syscalls = 0;
};

class PageWriteTracker {
 public:
  struct Options {
    // kAuto defers to NPURT_WRITE_TRACKING, then to what the kernel supports.
    WriteTrackingMechanism mechanism = WriteTrackingMechanism::kAuto;
  };

  // Starts watching [base, base + length). base must be page-aligned and length a
  // non-zero multiple of page_size(). All pages start clean and unprotected;
  // nothing is caught until arm().
  // Errors: kInvalidArgument for a misaligned region or a bad NPURT_WRITE_TRACKING
  // value; kUnimplemented when userfaultfd was requested explicitly and the kernel
  // or the memory does not support it (the message says why);
  // kResourceExhausted when too many mprotect-tracked regions exist at once.
  static StatusOr<PageWriteTracker> create(void* base, size_t length, Options options);
  static StatusOr<PageWriteTracker> create(void* base, size_t length) {
    return create(base, length, Options{});
  }

  // OK when this kernel offers asynchronous userfaultfd write-protect together with
  // PAGEMAP_SCAN for anonymous memory; otherwise the reason. Probed once.
  static Status userfaultfd_support();

  static size_t page_size();

  // A moved-from tracker may only be destroyed or assigned to.
  PageWriteTracker(PageWriteTracker&&) noexcept;
  PageWriteTracker& operator=(PageWriteTracker&&) noexcept;
  PageWriteTracker(const PageWriteTracker&) = delete;
  PageWriteTracker& operator=(const PageWriteTracker&) = delete;
  ~PageWriteTracker();

  WriteTrackingMechanism mechanism() const;
  void* base() const;
  size_t length() const;
  bool armed() const;

  // Write-protects every clean page and starts catching writes. Dirty pages stay
  // writable until take_dirty() or clear() reports/forgets them. Writes made before
  // arm() are not seen.
  Status arm();

  // Appends to *out the dirty pages overlapping the byte range [begin, end)
  // (offsets from base(), end <= length()) as coalesced, page-aligned ranges in
  // increasing order; marks them clean and, when armed, protects them again.
  // kOutOfRange for a bad range. On a failure, pages not yet reported stay dirty.
  Status take_dirty(uint64_t begin, uint64_t end, std::vector<ByteRange>* out);
  StatusOr<std::vector<ByteRange>> take_dirty(uint64_t begin, uint64_t end);

  // Marks every page dirty (and writable): "the host may have written anything".
  Status mark_all_dirty();
  // Forgets dirty state: marks the pages overlapping [begin, end) clean and, when
  // armed, protects them. For bytes the runtime itself just made current (after
  // a download into the mirror, or right after the initial upload).
  Status clear(uint64_t begin, uint64_t end);
  Status clear();

  WriteTrackerStats stats() const;

  // Implementation state; public only so the implementation file can name it.
  struct Impl;

 private:
  explicit PageWriteTracker(std::unique_ptr<Impl> impl);

  // Heap-allocated so its address, which the fault handler may hold, survives
  // moves of the tracker.
  std::unique_ptr<Impl> impl_;
};

}  // namespace npurt
