#include "npurt/exec/code_registry.h"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "npurt/base/math.h"
#include "npurt/base/trace.h"

namespace npurt::exec {

namespace {

constexpr std::string_view kTraceLane = "code registry";

struct CodeHashHasher {
  size_t operator()(const CodeHash& h) const { return static_cast<size_t>(h.lo ^ (h.hi >> 1)); }
};

}  // namespace

namespace detail {

// Shared by the CodeRegistry and every entry, so handles may outlive the registry.
struct RegistryState {
  RegistryState(std::shared_ptr<hal::Device> d, CodeRegistryOptions o)
      : device(std::move(d)), options(std::move(o)) {}

  // Called by the last holder of `entry`: forgets it and frees its block.
  void release(const CodeEntry& entry);

  const std::shared_ptr<hal::Device> device;  // kept alive by every handle
  const CodeRegistryOptions options;

  // A resident image as the dedup index sees it. `raw` identifies the entry even
  // after its last holder is gone (then `weak` has expired, and the entry's
  // destructor is about to remove this record).
  struct Resident {
    const CodeEntry* raw;
    std::weak_ptr<const CodeEntry> weak;
  };

  mutable std::mutex mu;
  std::unordered_map<CodeHash, std::vector<Resident>, CodeHashHasher> resident;  // guarded by mu
  CodeRegistryStats stats;                                                      // guarded by mu
  std::atomic<uint64_t> epoch{0};  // written under mu, read without it
  bool closed = false;             // guarded by mu
};

struct CodeEntry {
  CodeEntry(std::shared_ptr<RegistryState> s, CodeHash h, hal::DeviceAddr a, const isa::Image& image,
            uint64_t epoch)
      : state(std::move(s)),
        hash(h),
        addr(a),
        image(image),
        published_at(epoch) {}
  ~CodeEntry() { state->release(*this); }
  CodeEntry(const CodeEntry&) = delete;
  CodeEntry& operator=(const CodeEntry&) = delete;

  std::shared_ptr<RegistryState> state;
  CodeHash hash;
  hal::DeviceAddr addr;
  isa::Image image;  // what was uploaded: the dedup comparison reads its bytes
  uint64_t published_at;
};

void RegistryState::release(const CodeEntry& entry) {
  std::lock_guard lock(mu);
  auto it = resident.find(entry.hash);
  if (it != resident.end()) {
    std::erase_if(it->second, [&](const Resident& r) { return r.raw == &entry; });
    if (it->second.empty()) resident.erase(it);
  }
  // The last holder is gone: no registration, and no run that could still execute
  // it (runs hold a copy until retirement, after their stream finished).
  const Status freed = device->free(entry.addr);
  --stats.live_images;
  if (freed.ok()) {
    ++stats.blocks_freed;
  } else {
    ++stats.free_failures;
  }
  if (trace::enabled()) {
    trace::instant(kTraceLane, "free " + entry.image.name(), "code",
                   {{"addr", hex(entry.addr)}, {"ok", freed.ok()}});
  }
}

}  // namespace detail

using detail::CodeEntry;
using detail::RegistryState;

CodeHash hash_code(std::span<const uint8_t> bytes) {
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  return CodeHash{h.low64, h.high64};
}

// ---- CodeHandle ----

hal::DeviceAddr CodeHandle::address() const { return entry_ ? entry_->addr : hal::DeviceAddr{}; }

CodeHash CodeHandle::hash() const { return entry_ ? entry_->hash : CodeHash{}; }

const std::string& CodeHandle::name() const {
  static const std::string kEmpty;
  return entry_ ? entry_->image.name() : kEmpty;
}

uint64_t CodeHandle::bytes() const { return entry_ ? entry_->image.bytes().size() : 0; }

const isa::Image* CodeHandle::image() const { return entry_ ? &entry_->image : nullptr; }

uint64_t CodeHandle::published_at() const { return entry_ ? entry_->published_at : 0; }

long CodeHandle::use_count() const { return entry_.use_count(); }

// ---- CodeRegistry ----

CodeRegistry::CodeRegistry(FactoryKey, std::shared_ptr<hal::Device> device, CodeRegistryOptions options)
    : state_(std::make_shared<RegistryState>(std::move(device), std::move(options))) {}

CodeRegistry::~CodeRegistry() = default;

StatusOr<CodeHandle> CodeRegistry::register_image(const isa::Image& image) {
  RegistryState& s = *state_;
  if (!is_pow2(s.options.alignment) || s.options.alignment > 4096) {
    return invalid_argument("register_image: code block alignment " +
                            std::to_string(s.options.alignment) +
                            " is not a power of two <= 4096");
  }
  const std::span<const uint8_t> bytes = image.bytes();
  const CodeHash hash = s.options.hash ? s.options.hash(bytes) : hash_code(bytes);

  // Entries whose hash matched but whose bytes did not. Declared before the lock so
  // that, should one of them be the last holder, it is released after unlocking
  // (its destructor takes the lock).
  std::vector<std::shared_ptr<const CodeEntry>> collided;
  std::lock_guard lock(s.mu);
  if (s.closed) return failed_precondition("register_image '" + image.name() + "': the code registry is closed");

  if (auto it = s.resident.find(hash); it != s.resident.end()) {
    for (const RegistryState::Resident& r : it->second) {
      std::shared_ptr<const CodeEntry> entry = r.weak.lock();
      if (!entry) continue;  // its last holder is releasing it right now
      if (std::ranges::equal(entry->image.bytes(), bytes)) {
        ++s.stats.dedup_hits;
        ++s.stats.registrations;
        if (trace::enabled()) {
          trace::instant(kTraceLane, "dedup hit " + image.name(), "code",
                         {{"addr", hex(entry->addr)}});
        }
        return CodeHandle(std::move(entry));
      }
      ++s.stats.hash_collisions;
      collided.push_back(std::move(entry));
    }
  }

  // A miss: publish. Allocation and upload happen under the lock so two threads
  // registering the same new image cannot both upload it.
  const double t0 = trace::enabled() ? trace::now_us() : 0;
  const std::string context = "register_image '" + image.name() + "'";
  StatusOr<hal::DeviceAddr> addr = s.device->allocate(bytes.size(), s.options.alignment);
  if (!addr.ok()) return addr.status().with_context(context);
  // The single publication point of the code base (see code_registry.h).
  if (Status uploaded = s.device->upload_code(*addr, image); !uploaded.ok()) {
    s.device->free(*addr).ignore();
    return uploaded.with_context(context);
  }
  // Bumped only once the bytes are in GM: whoever reads the new epoch may rely on it.
  const uint64_t epoch = s.epoch.fetch_add(1) + 1;
  auto entry = std::make_shared<const CodeEntry>(state_, hash, *addr, image, epoch);
  s.resident[hash].push_back({entry.get(), entry});
  ++s.stats.publications;
  ++s.stats.registrations;
  ++s.stats.live_images;
  s.stats.published_bytes += bytes.size();
  if (trace::enabled()) {
    trace::complete(kTraceLane, "publish " + image.name(), "code", t0, trace::now_us(),
                    {{"addr", hex(*addr)}, {"bytes", bytes.size()}, {"epoch", epoch}});
  }
  return CodeHandle(std::move(entry));
}

Status CodeRegistry::unregister(CodeHandle& handle) {
  if (!handle.valid()) {
    return not_found("unregister: the code handle is empty (already unregistered, or never registered)");
  }
  if (handle.entry_->state != state_) {
    return invalid_argument("unregister: image '" + handle.name() + "' at " +
                            hex(handle.address()) + " belongs to another code registry");
  }
  // Not under the lock: if this was the last holder, the entry's destructor takes it.
  handle.reset();
  return ok_status();
}

void CodeRegistry::close() {
  std::lock_guard lock(state_->mu);
  state_->closed = true;
}

uint64_t CodeRegistry::publication_epoch() const { return state_->epoch.load(); }

CodeRegistryStats CodeRegistry::stats() const {
  std::lock_guard lock(state_->mu);
  return state_->stats;
}

hal::Device& CodeRegistry::device() const { return *state_->device; }

const std::shared_ptr<hal::Device>& CodeRegistry::shared_device() const { return state_->device; }

}  // namespace npurt::exec
