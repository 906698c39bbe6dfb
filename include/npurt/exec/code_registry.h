// CodeRegistry: the one place where code reaches device memory.
//
// register_image() deduplicates images by content: the key is the XXH3-128 hash of
// the image bytes *and* the bytes themselves (a hash match whose bytes differ is a
// different image, never trusted as the same code). A hit hands out another
// reference to the resident block and writes nothing. A miss allocates a block in
// global memory, uploads the image into it, and bumps the publication epoch.
//
// Publication point. Device::upload_code is called from code_registry.cc and nowhere
// else in src/: every new code byte in GM is a publication and moves the epoch. The
// Worker compares that epoch with the one each pipeline slot's stream was created at
// (StreamSlots, ReusePolicy::kPublicationAware): a publication makes every existing
// stream stale, because the new block may sit at an address some core still caches
// instructions for. Keep it that way: code uploaded anywhere else would bypass the
// epoch and bring back the stale-instruction hazard.
//
// Ownership. A CodeHandle is a copyable reference to one resident image. Each copy
// is a holder: the caller's registration, and every in-flight run (the Worker keeps
// copies of a run's handles until it retires the run, i.e. after the device has
// finished with its stream). The block is freed when the last holder goes, whichever
// that is; only then may the allocator hand its address to another image. So
// "unregister while a run is in flight" is safe by construction: the run's copy keeps
// the block, and retirement frees it.
//
// Lifetime. Handles may outlive the CodeRegistry object: they share its internal
// state, which keeps the device alive, so the last holder can free the block through
// it whenever it goes.
//
// Threading. Every method, and CodeHandle copy/destruction, is thread-safe. A
// handle's last holder may release it from any thread (the Worker's progress thread,
// typically); that thread then frees the block.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "npurt/base/status.h"
#include "npurt/exec/factory_key.h"
#include "npurt/hal/device.h"
#include "npurt/isa/image.h"

namespace npurt::exec {

// A 128-bit content hash.
struct CodeHash {
  uint64_t lo = 0;
  uint64_t hi = 0;
  friend bool operator==(const CodeHash&, const CodeHash&) = default;
};

// XXH3-128 of `bytes`.
CodeHash hash_code(std::span<const uint8_t> bytes);

// Monotonic since construction, except live_images (a current value).
struct CodeRegistryStats {
  uint64_t registrations = 0;    // successful register_image() calls
  uint64_t publications = 0;     // uploads (misses); equals the publication epoch
  uint64_t published_bytes = 0;
  uint64_t dedup_hits = 0;       // registrations that found the image resident
  uint64_t hash_collisions = 0;  // equal hash, different bytes (kept apart)
  uint64_t blocks_freed = 0;     // blocks released by their last holder
  uint64_t free_failures = 0;    // Device::free errors while releasing a block
  uint64_t live_images = 0;      // resident blocks now
};

struct CodeRegistryOptions {
  // Content hash used as the dedup key. Defaults to hash_code (XXH3-128). Tests
  // inject a weak one to force collisions and exercise the byte comparison.
  std::function<CodeHash(std::span<const uint8_t>)> hash;
  // Alignment of code blocks in GM (a power of two <= 4096).
  uint64_t alignment = 256;
};

class CodeRegistry;
namespace detail {
struct CodeEntry;
struct RegistryState;
}  // namespace detail

// A reference to a resident image (see "Ownership" above). Default-constructed and
// moved-from handles are empty. Accessors of an empty handle return zero values.
class CodeHandle {
 public:
  CodeHandle() = default;

  bool valid() const { return entry_ != nullptr; }
  explicit operator bool() const { return valid(); }

  // Where the image lives in GM (0 for an empty handle).
  hal::DeviceAddr address() const;
  CodeHash hash() const;
  const std::string& name() const;
  uint64_t bytes() const;
  // The resident image (null for an empty handle), valid while this handle holds it.
  const isa::Image* image() const;
  // The publication epoch this image's upload produced.
  uint64_t published_at() const;
  // Holders of this resident image right now (registrations and in-flight runs):
  // exact when no other thread copies or drops handles of it concurrently.
  long use_count() const;

  // Drops this holder; the block is freed if it was the last one.
  void reset() { entry_.reset(); }

  // Same resident block.
  friend bool operator==(const CodeHandle& a, const CodeHandle& b) { return a.entry_ == b.entry_; }

 private:
  friend class CodeRegistry;
  explicit CodeHandle(std::shared_ptr<const detail::CodeEntry> entry) : entry_(std::move(entry)) {}
  std::shared_ptr<const detail::CodeEntry> entry_;
};

class CodeRegistry {
 public:
  // Runtime::registry() is the one of a runtime's device (factory_key.h).
  CodeRegistry(FactoryKey key, std::shared_ptr<hal::Device> device, CodeRegistryOptions options = {});
  // Handles still alive keep the registry's state (and their blocks) until they go.
  ~CodeRegistry();

  CodeRegistry(const CodeRegistry&) = delete;
  CodeRegistry& operator=(const CodeRegistry&) = delete;

  // Returns a handle to `image` resident in GM: the existing block if identical bytes
  // are resident (a dedup hit: nothing is written, the epoch does not move), else a
  // new block, uploaded, after which the publication epoch is bumped.
  // Errors: the allocation error (typically kResourceExhausted) or the upload error,
  // with the image name as context; nothing is left allocated.
  StatusOr<CodeHandle> register_image(const isa::Image& image);

  // Drops the registration `handle` holds and empties it. The block is freed now if
  // no other holder remains, otherwise when the last one (e.g. an in-flight run)
  // retires. kNotFound for an empty handle (already unregistered); kInvalidArgument
  // for a handle of another registry (left untouched).
  Status unregister(CodeHandle& handle);

  // Refuses every later registration (kFailedPrecondition naming the image); handles
  // already given out stay valid and free their blocks as usual.
  void close();
  // Number of publications so far: 0 until the first upload, then +1 per upload.
  // Read it *after* the handles a run will use exist (see StreamSlots::begin).
  uint64_t publication_epoch() const;

  CodeRegistryStats stats() const;

  hal::Device& device() const;
  const std::shared_ptr<hal::Device>& shared_device() const;

 private:
  std::shared_ptr<detail::RegistryState> state_;
};

}  // namespace npurt::exec
