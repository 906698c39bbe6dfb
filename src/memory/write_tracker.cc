#include "npurt/memory/write_tracker.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <linux/userfaultfd.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>

// Kernel interfaces newer than some distributions' headers (Debian 12 ships 6.1
// uapi headers; asynchronous write-protect and PAGEMAP_SCAN arrived in 6.7). The
// values are the kernel ABI; the kernel decides at run time whether it has them.
#ifndef UFFD_USER_MODE_ONLY
#define UFFD_USER_MODE_ONLY 1
#endif
#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif
#ifndef UFFD_FEATURE_WP_ASYNC
#define UFFD_FEATURE_WP_ASYNC (1 << 15)
#endif
#ifndef PAGEMAP_SCAN
struct page_region {
  __u64 start;
  __u64 end;
  __u64 categories;
};
struct pm_scan_arg {
  __u64 size;
  __u64 flags;
  __u64 start;
  __u64 end;
  __u64 walk_end;
  __u64 vec;
  __u64 vec_len;
  __u64 max_pages;
  __u64 category_inverted;
  __u64 category_mask;
  __u64 category_anyof_mask;
  __u64 return_mask;
};
#define PAGEMAP_SCAN _IOWR('f', 16, struct pm_scan_arg)
#define PM_SCAN_WP_MATCHING (1 << 0)
#define PM_SCAN_CHECK_WPASYNC (1 << 1)
#define PAGE_IS_WRITTEN (1 << 1)
#endif

namespace npurt {
namespace write_tracker_detail {

constexpr size_t kBitsPerWord = 64;

// Bits [lo, hi) of a word, 0 <= lo <= hi <= 64, lo < 64.
uint64_t bit_mask(size_t lo, size_t hi) {
  const uint64_t below_hi = hi == kBitsPerWord ? ~uint64_t{0} : (uint64_t{1} << hi) - 1;
  return below_hi & (~uint64_t{0} << lo);
}

// Calls emit(first, last) for each maximal run of pages it is fed, word by word in
// increasing order, joining runs that continue across word boundaries.
template <typename F>
class RunBuilder {
 public:
  explicit RunBuilder(F& emit) : emit_(emit) {}

  // Adds the set bits of `bits`, the word covering pages [word_begin, word_begin + 64).
  void add_word(size_t word_begin, uint64_t bits) {
    while (bits != 0) {
      const int start = std::countr_zero(bits);
      const int end = start + std::countr_one(bits >> start);
      add(word_begin + static_cast<size_t>(start), word_begin + static_cast<size_t>(end));
      bits = end == static_cast<int>(kBitsPerWord) ? 0 : bits & (~uint64_t{0} << end);
    }
  }

  void finish() {
    if (first_ != last_) emit_(first_, last_);
    first_ = last_ = 0;
  }

 private:
  void add(size_t first, size_t last) {
    if (first_ == last_ || last_ != first) {
      finish();
      first_ = first;
    }
    last_ = last;
  }

  F& emit_;
  size_t first_ = 0;  // the open run; empty when first_ == last_
  size_t last_ = 0;
};

// One bit per page, set = dirty. Bits are atomic so the fault handler can set them
// from any thread, interrupting anything, without a lock.
class DirtyBitmap {
 public:
  explicit DirtyBitmap(size_t pages)
      : words_(
            std::make_unique<std::atomic<uint64_t>[]>((pages + kBitsPerWord - 1) / kBitsPerWord)) {}

  // Async-signal-safe.
  void set(size_t page) {
    words_[page / kBitsPerWord].fetch_or(uint64_t{1} << (page % kBitsPerWord),
                                         std::memory_order_acq_rel);
  }

  // Async-signal-safe.
  void set_range(size_t first, size_t last) {
    for_each_word(first, last, [](std::atomic<uint64_t>& word, uint64_t mask, size_t) {
      word.fetch_or(mask, std::memory_order_acq_rel);
    });
  }

  void clear_range(size_t first, size_t last) {
    for_each_word(first, last, [](std::atomic<uint64_t>& word, uint64_t mask, size_t) {
      word.fetch_and(~mask, std::memory_order_acq_rel);
    });
  }

  // Clears the bits of [first, last) and calls f(run_first, run_last) for each
  // maximal run of pages whose bit was set, in order. Every bit of a run is
  // cleared before f sees the run, which is what makes "clear, then re-protect"
  // lose no write (see take_dirty).
  template <typename F>
  void take_runs(size_t first, size_t last, F&& f) {
    RunBuilder<F> runs(f);
    for_each_word(first, last, [&](std::atomic<uint64_t>& word, uint64_t mask, size_t begin) {
      runs.add_word(begin, word.fetch_and(~mask, std::memory_order_acq_rel) & mask);
    });
    runs.finish();
  }

  // Calls f(run_first, run_last) for each maximal run of clean pages in [first, last).
  template <typename F>
  void for_each_clean_run(size_t first, size_t last, F&& f) {
    RunBuilder<F> runs(f);
    for_each_word(first, last, [&](std::atomic<uint64_t>& word, uint64_t mask, size_t begin) {
      runs.add_word(begin, ~word.load(std::memory_order_acquire) & mask);
    });
    runs.finish();
  }

 private:
  // Calls op(word, mask, word_begin) for each word overlapping pages [first, last),
  // where mask selects the word's bits inside the range and word_begin is the page
  // of its bit 0.
  template <typename Op>
  void for_each_word(size_t first, size_t last, Op op) {
    for (size_t w = first / kBitsPerWord; w * kBitsPerWord < last; ++w) {
      const size_t word_begin = w * kBitsPerWord;
      const size_t lo = first > word_begin ? first - word_begin : 0;
      const size_t hi = std::min(last - word_begin, kBitsPerWord);
      op(words_[w], bit_mask(lo, hi), word_begin);
    }
  }

  std::unique_ptr<std::atomic<uint64_t>[]> words_;
};

struct Counters {
  std::atomic<uint64_t> faults_caught{0};
  std::atomic<uint64_t> pages_reprotected{0};
  std::atomic<uint64_t> protect_syscalls{0};

  void add(std::atomic<uint64_t>& counter, uint64_t n) {
    counter.fetch_add(n, std::memory_order_relaxed);
  }
};

// What differs between the mechanisms: how pages are (un)protected and how
// writes reach the dirty bitmap. Page indices are relative to the region base.
class ProtectionBackend {
 public:
  virtual ~ProtectionBackend() = default;
  // Write-protects pages [first, last) with one syscall.
  virtual Status protect(size_t first, size_t last) = 0;
  // Makes pages [first, last) writable without a fault, with one syscall.
  virtual Status unprotect(size_t first, size_t last) = 0;
  // Folds writes the kernel recorded in [first, last) into `dirty` and protects
  // those pages again. The mprotect mechanism records in its fault handler and
  // has nothing to collect.
  virtual Status collect_written(size_t first, size_t last, DirtyBitmap& dirty,
                                 Counters& counters) = 0;
  // Whether pages taken from the bitmap still need protect() (true unless
  // collect_written() already re-protected them).
  virtual bool reprotect_after_take() const = 0;
};

}  // namespace write_tracker_detail

using write_tracker_detail::Counters;
using write_tracker_detail::DirtyBitmap;
using write_tracker_detail::ProtectionBackend;

struct PageWriteTracker::Impl {
  Impl(uintptr_t base_address, size_t length_bytes, unsigned shift)
      : base(base_address),
        length(length_bytes),
        pages(length_bytes >> shift),
        page_shift(shift),
        dirty(pages) {}

  uintptr_t base;
  size_t length;
  size_t pages;
  unsigned page_shift;
  WriteTrackingMechanism mechanism = WriteTrackingMechanism::kMprotect;
  bool armed = false;
  DirtyBitmap dirty;
  Counters counters;
  // Declared last so it is destroyed first: the backend unprotects the region and
  // stops the fault handler from reaching this object before the bitmap goes.
  std::unique_ptr<ProtectionBackend> backend;
};

namespace {

std::string errno_text(std::string_view what, int err) {
  return std::string(what) + ": " + std::strerror(err);
}

// ---- The mprotect mechanism: region registry and SIGSEGV handler -----------------
//
// The handler may interrupt any code, including code holding any lock, so it reads
// the registry without locks: each slot is a small seqlock (sequence odd while a
// writer changes it). Writers (tracker creation/destruction) serialize on a mutex
// the handler never takes. A writer never faults while a slot is odd, so a handler
// spinning on an odd slot always runs on another thread than that writer.

constexpr size_t kMaxTrackedRegions = 1024;

struct RegionSlot {
  std::atomic<uint64_t> sequence{0};
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};  // begin == end: free
  std::atomic<PageWriteTracker::Impl*> target{nullptr};
};

RegionSlot g_slots[kMaxTrackedRegions];
// Slots at or above this index were never used; the handler scans below it only.
std::atomic<size_t> g_slots_in_use{0};
std::mutex g_registry_mutex;
bool g_handler_installed = false;       // guarded by g_registry_mutex
struct sigaction g_previous_action {};  // written before the handler is installed

// Fields are stored with release and loaded with acquire: a reader that sees any
// field of a rewrite also sees the odd sequence stored before it, and its re-check
// of the sequence cannot move above its field loads. Relaxed accesses between fences
// would order the same, but ThreadSanitizer does not model fences (GCC warns that
// it does not support atomic_thread_fence), so it could miss that the handler's use
// of the tracker reached through `target` comes after the tracker was built. On
// x86-64 both forms compile to plain moves.
void write_slot(RegionSlot& slot, uintptr_t begin, uintptr_t end, PageWriteTracker::Impl* target) {
  const uint64_t seq = slot.sequence.load(std::memory_order_relaxed);
  slot.sequence.store(seq + 1, std::memory_order_relaxed);
  slot.begin.store(begin, std::memory_order_release);
  slot.end.store(end, std::memory_order_release);
  slot.target.store(target, std::memory_order_release);
  slot.sequence.store(seq + 2, std::memory_order_release);
}

// Async-signal-safe. Returns the tracker whose region contains addr, or null.
PageWriteTracker::Impl* find_region(uintptr_t addr) {
  const size_t n = g_slots_in_use.load(std::memory_order_acquire);
  for (size_t i = 0; i < n; ++i) {
    RegionSlot& slot = g_slots[i];
    for (;;) {
      const uint64_t seq = slot.sequence.load(std::memory_order_acquire);
      if (seq & 1) continue;  // another thread is rewriting this slot right now
      const uintptr_t begin = slot.begin.load(std::memory_order_acquire);
      const uintptr_t end = slot.end.load(std::memory_order_acquire);
      PageWriteTracker::Impl* target = slot.target.load(std::memory_order_acquire);
      if (slot.sequence.load(std::memory_order_relaxed) != seq) continue;
      if (addr >= begin && addr < end) return target;
      break;
    }
  }
  return nullptr;
}

// True when the faulting access was a write. Only x86-64 exposes this cheaply (the
// page-fault error code); elsewhere an access fault on a read-only tracked page is
// taken to be a write, which is the only access the tracker forbids.
bool is_write_fault(void* ucontext) {
#if defined(__x86_64__)
  const auto* uc = static_cast<const ucontext_t*>(ucontext);
  constexpr greg_t kPageFaultWriteBit = 0x2;
  return (uc->uc_mcontext.gregs[REG_ERR] & kPageFaultWriteBit) != 0;
#else
  (void)ucontext;
  return true;
#endif
}

// Async-signal-safe. Records a write to a tracked page and makes the page writable
// so the faulting instruction succeeds when retried. Unprotect strictly before
// marking dirty: a take_dirty() running concurrently then either sees the bit (and
// re-protects after clearing it) or leaves a page that is writable and dirty, never
// writable and clean.
bool record_tracked_write(uintptr_t addr) {
  PageWriteTracker::Impl* impl = find_region(addr);
  if (impl == nullptr) return false;
  const size_t page = (addr - impl->base) >> impl->page_shift;
  void* page_addr = reinterpret_cast<void*>(impl->base + (page << impl->page_shift));
  if (mprotect(page_addr, size_t{1} << impl->page_shift, PROT_READ | PROT_WRITE) == 0) {
    impl->dirty.set(page);
  } else {
    // Unprotecting one page splits the mapping, which fails once the process hits
    // vm.max_map_count. Give up page granularity for this region instead of
    // crashing: the whole region becomes writable (one merged mapping) and dirty.
    if (mprotect(reinterpret_cast<void*>(impl->base), impl->length, PROT_READ | PROT_WRITE) != 0) {
      return false;  // let the fault take its usual course rather than loop on it
    }
    impl->dirty.set_range(0, impl->pages);
  }
  impl->counters.add(impl->counters.faults_caught, 1);
  return true;
}

// Async-signal-safe. Hands a fault that is not ours to whoever had SIGSEGV before.
void chain_to_previous(int sig, siginfo_t* info, void* ucontext) {
  const struct sigaction& prev = g_previous_action;
  const bool sent_by_process = info == nullptr || info->si_code <= 0;  // kill(), raise()
  if (prev.sa_flags & SA_SIGINFO) {
    prev.sa_sigaction(sig, info, ucontext);
    return;
  }
  if (prev.sa_handler == SIG_IGN && sent_by_process) return;
  if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
    return;
  }
  // Default action (the kernel also uses it for an ignored hardware fault): restore
  // it and let the process die of SIGSEGV exactly as it would have. A hardware
  // fault repeats when the instruction is retried on return; a sent signal must be
  // raised again, and stays pending until this handler returns.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  if (sent_by_process) raise(sig);
}

void on_sigsegv(int sig, siginfo_t* info, void* ucontext) {
  const int saved_errno = errno;
  const bool handled = info != nullptr && info->si_code == SEGV_ACCERR &&
                       is_write_fault(ucontext) &&
                       record_tracked_write(reinterpret_cast<uintptr_t>(info->si_addr));
  errno = saved_errno;
  if (!handled) chain_to_previous(sig, info, ucontext);
}

// Requires g_registry_mutex.
Status install_handler_locked() {
  if (g_handler_installed) return ok_status();
  // Read the previous action first, so it is in place before any fault can reach
  // on_sigsegv.
  if (sigaction(SIGSEGV, nullptr, &g_previous_action) != 0) {
    return internal_error(errno_text("sigaction(SIGSEGV) query", errno));
  }
  struct sigaction action {};
  action.sa_sigaction = on_sigsegv;
  // SA_ONSTACK: a thread that set up an alternate stack (sanitizers do) keeps
  // using it, as the previous handler expects.
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  if (sigaction(SIGSEGV, &action, nullptr) != 0) {
    return internal_error(errno_text("sigaction(SIGSEGV) install", errno));
  }
  g_handler_installed = true;
  return ok_status();
}

StatusOr<size_t> register_region(uintptr_t begin, uintptr_t end, PageWriteTracker::Impl* target) {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  NPURT_RETURN_IF_ERROR(install_handler_locked());
  for (size_t i = 0; i < kMaxTrackedRegions; ++i) {
    if (g_slots[i].target.load(std::memory_order_relaxed) != nullptr) continue;
    write_slot(g_slots[i], begin, end, target);
    if (g_slots_in_use.load(std::memory_order_relaxed) <= i) {
      g_slots_in_use.store(i + 1, std::memory_order_release);
    }
    return i;
  }
  return resource_exhausted("write tracking: more than " + std::to_string(kMaxTrackedRegions) +
                            " regions tracked with mprotect at once");
}

void unregister_region(size_t slot) {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  write_slot(g_slots[slot], 0, 0, nullptr);
}

class MprotectBackend final : public ProtectionBackend {
 public:
  static StatusOr<std::unique_ptr<ProtectionBackend>> create(PageWriteTracker::Impl* impl) {
    NPURT_ASSIGN_OR_RETURN(size_t slot,
                           register_region(impl->base, impl->base + impl->length, impl));
    give_mapping_an_anon_vma(impl->base);
    return std::unique_ptr<ProtectionBackend>(new MprotectBackend(impl, slot));
  }

  ~MprotectBackend() override {
    // Writable first, unregistered second: no write can fault in between and find
    // the region gone.
    unprotect(0, impl_->pages).ignore();
    unregister_region(slot_);
  }

  Status protect(size_t first, size_t last) override {
    return change(first, last, PROT_READ, "mprotect(PROT_READ)");
  }
  Status unprotect(size_t first, size_t last) override {
    return change(first, last, PROT_READ | PROT_WRITE, "mprotect(PROT_READ|PROT_WRITE)");
  }
  Status collect_written(size_t, size_t, DirtyBitmap&, Counters&) override { return ok_status(); }
  bool reprotect_after_take() const override { return true; }

 private:
  MprotectBackend(PageWriteTracker::Impl* impl, size_t slot) : impl_(impl), slot_(slot) {}

  // Protecting single pages splits the mapping; the kernel merges the pieces back
  // once their protections agree again, but only if they share one anon_vma, which
  // a private mapping gets on its first write fault. Pages first written after
  // the split would each get their own and never merge, leaving one mapping per
  // page. One write fault before any split avoids that; adding zero atomically
  // changes no byte even if other threads are writing the page.
  static void give_mapping_an_anon_vma(uintptr_t base) {
    std::atomic_ref<unsigned char>(*reinterpret_cast<unsigned char*>(base))
        .fetch_add(0, std::memory_order_relaxed);
  }

  Status change(size_t first, size_t last, int prot, const char* what) {
    void* addr = reinterpret_cast<void*>(impl_->base + (first << impl_->page_shift));
    if (mprotect(addr, (last - first) << impl_->page_shift, prot) != 0) {
      return internal_error(errno_text(what, errno));
    }
    return ok_status();
  }

  PageWriteTracker::Impl* impl_;
  size_t slot_;
};

// ---- The userfaultfd mechanism -------------------------------------------------
//
// Asynchronous write-protect: a write to a protected page is resolved by the kernel
// on the spot (no message, no handler thread) by clearing the page's uffd-wp bit;
// PAGEMAP_SCAN reports pages without it as PAGE_IS_WRITTEN and, with
// PM_SCAN_WP_MATCHING, sets it again in the same page-table walk, so a write racing
// with a scan is either reported by it or leaves the page written for the next one.
// WP_ASYNC implies WP_UNPOPULATED: never-touched pages are protected too, so the
// region needs no pre-faulting.

class UffdBackend final : public ProtectionBackend {
 public:
  static StatusOr<std::unique_ptr<ProtectionBackend>> create(uintptr_t base, size_t length,
                                                             unsigned page_shift) {
    std::unique_ptr<UffdBackend> backend(new UffdBackend(base, length, page_shift));
    NPURT_RETURN_IF_ERROR(backend->open_uffd());
    NPURT_RETURN_IF_ERROR(backend->register_range());
    NPURT_RETURN_IF_ERROR(backend->open_pagemap());
    return std::unique_ptr<ProtectionBackend>(std::move(backend));
  }

  ~UffdBackend() override {
    if (registered_) {
      unprotect(0, length_ >> page_shift_).ignore();
      uffdio_range range{base_, length_};
      ioctl(uffd_, UFFDIO_UNREGISTER, &range);
    }
    if (pagemap_ >= 0) close(pagemap_);
    if (uffd_ >= 0) close(uffd_);
  }

  Status protect(size_t first, size_t last) override {
    return write_protect(first, last, UFFDIO_WRITEPROTECT_MODE_WP);
  }
  Status unprotect(size_t first, size_t last) override { return write_protect(first, last, 0); }

  Status collect_written(size_t first, size_t last, DirtyBitmap& dirty,
                         Counters& counters) override {
    constexpr size_t kRegionsPerCall = 32;
    page_region regions[kRegionsPerCall];
    pm_scan_arg arg{};
    arg.size = sizeof(arg);
    arg.flags = PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC;
    arg.start = address(first);
    arg.end = address(last);
    arg.vec = reinterpret_cast<uintptr_t>(regions);
    arg.vec_len = kRegionsPerCall;
    arg.category_mask = PAGE_IS_WRITTEN;
    arg.return_mask = PAGE_IS_WRITTEN;
    // The kernel stops early when `regions` fills up (walk_end < end); pages past
    // walk_end were neither reported nor re-protected, so continue from there.
    while (arg.start < arg.end) {
      const int n = ioctl(pagemap_, PAGEMAP_SCAN, &arg);
      counters.add(counters.protect_syscalls, 1);
      if (n < 0) {
        if (errno == EINTR) continue;
        return internal_error(errno_text("PAGEMAP_SCAN", errno));
      }
      for (int i = 0; i < n; ++i) {
        const size_t a = (regions[i].start - base_) >> page_shift_;
        const size_t b = (regions[i].end - base_) >> page_shift_;
        dirty.set_range(a, b);
        counters.add(counters.faults_caught, b - a);
        counters.add(counters.pages_reprotected, b - a);
      }
      if (arg.walk_end <= arg.start) return internal_error("PAGEMAP_SCAN made no progress");
      arg.start = arg.walk_end;
    }
    return ok_status();
  }

  bool reprotect_after_take() const override { return false; }

 private:
  UffdBackend(uintptr_t base, size_t length, unsigned page_shift)
      : base_(base), length_(length), page_shift_(page_shift) {}

  uint64_t address(size_t page) const { return base_ + (uint64_t{page} << page_shift_); }

  Status open_uffd() {
    // User-mode-only faults are all that tracking needs, and unlike kernel-mode
    // ones they are allowed without privileges when vm.unprivileged_userfaultfd is
    // 0. Kernels before 5.11 reject the flag; retry without it.
    uffd_ =
        static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY));
    if (uffd_ < 0 && errno == EINVAL) {
      uffd_ = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
    }
    if (uffd_ < 0) return unimplemented(errno_text("userfaultfd()", errno));
    uffdio_api api{};
    api.api = UFFD_API;
    api.features = UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED;
    if (ioctl(uffd_, UFFDIO_API, &api) != 0) {
      return unimplemented(errno_text("UFFDIO_API with UFFD_FEATURE_WP_ASYNC", errno));
    }
    if ((api.features & UFFD_FEATURE_WP_ASYNC) == 0) {
      return unimplemented("kernel lacks UFFD_FEATURE_WP_ASYNC (needs Linux 6.7)");
    }
    return ok_status();
  }

  Status register_range() {
    uffdio_register reg{};
    reg.range = uffdio_range{base_, length_};
    reg.mode = UFFDIO_REGISTER_MODE_WP;
    if (ioctl(uffd_, UFFDIO_REGISTER, &reg) != 0) {
      return unimplemented(errno_text("UFFDIO_REGISTER_MODE_WP", errno));
    }
    registered_ = true;
    if ((reg.ioctls & (uint64_t{1} << _UFFDIO_WRITEPROTECT)) == 0) {
      return unimplemented("UFFDIO_WRITEPROTECT not offered for this region");
    }
    return ok_status();
  }

  Status open_pagemap() {
    pagemap_ = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    if (pagemap_ < 0) return unimplemented(errno_text("open(/proc/self/pagemap)", errno));
    // An empty-output scan checks that PAGEMAP_SCAN exists (Linux 6.7) and that
    // every page of the region is under asynchronous write-protect.
    pm_scan_arg arg{};
    arg.size = sizeof(arg);
    arg.flags = PM_SCAN_CHECK_WPASYNC;
    arg.start = base_;
    arg.end = base_ + length_;
    if (ioctl(pagemap_, PAGEMAP_SCAN, &arg) < 0) {
      return unimplemented(errno_text("PAGEMAP_SCAN", errno));
    }
    return ok_status();
  }

  Status write_protect(size_t first, size_t last, uint64_t mode) {
    uffdio_writeprotect wp{};
    wp.range = uffdio_range{address(first), uint64_t{last - first} << page_shift_};
    wp.mode = mode;
    while (ioctl(uffd_, UFFDIO_WRITEPROTECT, &wp) != 0) {
      if (errno != EAGAIN && errno != EINTR) {
        return internal_error(errno_text("UFFDIO_WRITEPROTECT", errno));
      }
    }
    return ok_status();
  }

  uint64_t base_;
  uint64_t length_;
  unsigned page_shift_;
  int uffd_ = -1;
  int pagemap_ = -1;
  bool registered_ = false;
};

// ---- Mechanism choice ------------------------------------------------------------

StatusOr<WriteTrackingMechanism> resolve_mechanism(WriteTrackingMechanism requested) {
  if (requested != WriteTrackingMechanism::kAuto) return requested;
  const char* env = std::getenv("NPURT_WRITE_TRACKING");
  const std::string_view value = env == nullptr ? "" : env;
  if (value.empty() || value == "auto") return WriteTrackingMechanism::kAuto;
  if (value == "uffd" || value == "userfaultfd") return WriteTrackingMechanism::kUserfaultfd;
  if (value == "mprotect") return WriteTrackingMechanism::kMprotect;
  return invalid_argument("NPURT_WRITE_TRACKING=" + std::string(value) +
                          ": expected uffd, mprotect or auto");
}

Status probe_userfaultfd() {
  const size_t page = PageWriteTracker::page_size();
  void* mem = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return internal_error(errno_text("mmap", errno));
  Status status;
  {
    auto backend = UffdBackend::create(reinterpret_cast<uintptr_t>(mem), page,
                                       static_cast<unsigned>(std::countr_zero(page)));
    if (!backend.ok()) {
      status = backend.status();
    } else {
      status = (*backend)->protect(0, 1);
    }
  }
  munmap(mem, page);
  return status;
}

}  // namespace

const char* write_tracking_mechanism_name(WriteTrackingMechanism mechanism) {
  switch (mechanism) {
    case WriteTrackingMechanism::kAuto: return "auto";
    case WriteTrackingMechanism::kUserfaultfd: return "userfaultfd";
    case WriteTrackingMechanism::kMprotect: return "mprotect";
  }
  return "unknown";
}

size_t PageWriteTracker::page_size() {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

Status PageWriteTracker::userfaultfd_support() {
  static const Status status = probe_userfaultfd();
  return status;
}

StatusOr<PageWriteTracker> PageWriteTracker::create(void* base, size_t length, Options options) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(base);
  const size_t page = page_size();
  if (base == nullptr || addr % page != 0 || length == 0 || length % page != 0) {
    char text[160];
    std::snprintf(text, sizeof(text),
                  "write tracking needs a page-aligned region of whole %zu-byte pages, got base "
                  "%#" PRIxPTR " length %zu",
                  page, addr, length);
    return invalid_argument(text);
  }
  NPURT_ASSIGN_OR_RETURN(WriteTrackingMechanism wanted, resolve_mechanism(options.mechanism));
  auto impl = std::make_unique<Impl>(addr, length, static_cast<unsigned>(std::countr_zero(page)));

  if (wanted != WriteTrackingMechanism::kMprotect) {
    Status why = userfaultfd_support();
    if (why.ok()) {
      auto backend = UffdBackend::create(addr, length, impl->page_shift);
      if (backend.ok()) {
        impl->backend = std::move(backend).value();
        impl->mechanism = WriteTrackingMechanism::kUserfaultfd;
        return PageWriteTracker(std::move(impl));
      }
      why = backend.status();
    }
    if (wanted == WriteTrackingMechanism::kUserfaultfd) {
      return why.with_context("userfaultfd write tracking unavailable");
    }
  }
  NPURT_ASSIGN_OR_RETURN(impl->backend, MprotectBackend::create(impl.get()));
  impl->mechanism = WriteTrackingMechanism::kMprotect;
  return PageWriteTracker(std::move(impl));
}

PageWriteTracker::PageWriteTracker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PageWriteTracker::PageWriteTracker(PageWriteTracker&&) noexcept = default;
PageWriteTracker& PageWriteTracker::operator=(PageWriteTracker&&) noexcept = default;
PageWriteTracker::~PageWriteTracker() = default;

WriteTrackingMechanism PageWriteTracker::mechanism() const { return impl_->mechanism; }
void* PageWriteTracker::base() const { return reinterpret_cast<void*>(impl_->base); }
size_t PageWriteTracker::length() const { return impl_->length; }
bool PageWriteTracker::armed() const { return impl_->armed; }

Status PageWriteTracker::arm() {
  // Re-arming would re-protect pages the kernel marked written but nobody has
  // collected yet (userfaultfd), losing those writes; once is enough.
  if (impl_->armed) return ok_status();
  Status status;
  impl_->dirty.for_each_clean_run(0, impl_->pages, [&](size_t first, size_t last) {
    if (!status.ok()) return;
    status = impl_->backend->protect(first, last);
    impl_->counters.add(impl_->counters.protect_syscalls, 1);
  });
  NPURT_RETURN_IF_ERROR(status);
  impl_->armed = true;
  return ok_status();
}

namespace {

Status check_byte_range(uint64_t begin, uint64_t end, size_t length) {
  if (begin > end || end > length) {
    return out_of_range("byte range [" + std::to_string(begin) + ", " + std::to_string(end) +
                        ") outside tracked region of " + std::to_string(length) + " bytes");
  }
  return ok_status();
}

}  // namespace

Status PageWriteTracker::take_dirty(uint64_t begin, uint64_t end, std::vector<ByteRange>* out) {
  NPURT_RETURN_IF_ERROR(check_byte_range(begin, end, impl_->length));
  if (begin == end) return ok_status();
  Impl& impl = *impl_;
  const size_t first = begin >> impl.page_shift;
  const size_t last = (end + (size_t{1} << impl.page_shift) - 1) >> impl.page_shift;
  if (impl.armed) {
    NPURT_RETURN_IF_ERROR(impl.backend->collect_written(first, last, impl.dirty, impl.counters));
  }
  const bool reprotect = impl.armed && impl.backend->reprotect_after_take();
  Status status;
  // Each run's bits are cleared before it is re-protected: a write landing in
  // between is still visible to the caller's upload that follows, and any write
  // after the protect faults and marks the page again.
  impl.dirty.take_runs(first, last, [&](size_t a, size_t b) {
    out->push_back({uint64_t{a} << impl.page_shift, uint64_t{b} << impl.page_shift});
    if (!reprotect) return;
    impl.counters.add(impl.counters.protect_syscalls, 1);
    Status s = impl.backend->protect(a, b);
    if (s.ok()) {
      impl.counters.add(impl.counters.pages_reprotected, b - a);
    } else {
      // Still writable: keep the pages dirty so the next call reports them again.
      impl.dirty.set_range(a, b);
      if (status.ok()) status = s;
    }
  });
  return status;
}

StatusOr<std::vector<ByteRange>> PageWriteTracker::take_dirty(uint64_t begin, uint64_t end) {
  std::vector<ByteRange> out;
  NPURT_RETURN_IF_ERROR(take_dirty(begin, end, &out));
  return out;
}

Status PageWriteTracker::mark_all_dirty() {
  // Dirty before writable, so no page is ever writable and clean.
  impl_->dirty.set_range(0, impl_->pages);
  if (!impl_->armed) return ok_status();
  impl_->counters.add(impl_->counters.protect_syscalls, 1);
  return impl_->backend->unprotect(0, impl_->pages);
}

Status PageWriteTracker::clear(uint64_t begin, uint64_t end) {
  NPURT_RETURN_IF_ERROR(check_byte_range(begin, end, impl_->length));
  if (begin == end) return ok_status();
  const size_t first = begin >> impl_->page_shift;
  const size_t last = (end + (size_t{1} << impl_->page_shift) - 1) >> impl_->page_shift;
  impl_->dirty.clear_range(first, last);
  if (!impl_->armed) return ok_status();
  impl_->counters.add(impl_->counters.protect_syscalls, 1);
  return impl_->backend->protect(first, last);
}

Status PageWriteTracker::clear() { return clear(0, impl_->length); }

WriteTrackerStats PageWriteTracker::stats() const {
  const Counters& c = impl_->counters;
  WriteTrackerStats s;
  s.faults_caught = c.faults_caught.load(std::memory_order_relaxed);
  s.pages_reprotected = c.pages_reprotected.load(std::memory_order_relaxed);
  s.protect_syscalls = c.protect_syscalls.load(std::memory_order_relaxed);
  return s;
}

}  // namespace npurt
