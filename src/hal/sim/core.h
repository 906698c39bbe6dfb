// One logical core of the simulated NPU: local memory, an instruction cache, and
// the interpreter that runs one block of a launch.
//
// The instruction cache is the point of the simulator: lines are filled from global
// memory on a miss and then used as they are, whatever GM holds later. Nothing but
// ICache::invalidate (called by the device for the first launch on a fresh stream)
// drops them. A core that hits a stale line executes the stale bytes; one that
// cannot decode them faults the kernel. In sanitizer mode every fetch is compared
// with GM and a mismatch is reported as a hazard instead of executed.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "npurt/base/status.h"
#include "npurt/hal/ids.h"
#include "npurt/isa/image.h"
#include "npurt/isa/isa.h"

namespace npurt::sim {

// The simulator's global memory as the cores see it.
struct GlobalMemory {
  uint8_t* host = nullptr;      // host mapping of the device address space
  uint64_t base_addr = 0;       // device address of host[0]
  uint64_t size = 0;
  uint64_t* shadow = nullptr;   // sanitizer: 1 bit per byte "has been written"; else null

  uint8_t* ptr(uint64_t addr) const { return host + (addr - base_addr); }
  uint8_t* ptr(hal::DeviceAddr addr) const { return ptr(addr.value()); }
  void mark_initialized(uint64_t addr, uint64_t n) const;
  void mark_initialized(hal::DeviceAddr addr, uint64_t n) const { mark_initialized(addr.value(), n); }
  void mark_uninitialized(uint64_t addr, uint64_t n) const;
  // First never-written address in [addr, addr + n), if any.
  std::optional<uint64_t> first_uninitialized(uint64_t addr, uint64_t n) const;
};

// A launch argument as a core sees it: a bounds-checked window onto GM, or bits.
struct ArgBinding {
  uint64_t addr = 0;
  uint64_t bytes = 0;
  uint64_t bits = 0;
  bool is_scalar = false;
  bool readable = false;
  bool writable = false;
};

// Everything a block needs to know about the launch it belongs to. Read-only
// while the launch runs.
struct LaunchContext {
  const GlobalMemory* gm = nullptr;
  uint64_t image_addr = 0;
  std::string_view kernel_name;
  uint64_t code_addr = 0;
  uint32_t num_insns = 0;
  uint32_t grid = 1;
  uint32_t num_args = 0;
  ArgBinding args[isa::kMaxArgs];
  ArgBinding constants;
  bool sanitize = false;
  std::atomic<bool>* abort = nullptr;  // set when any block faulted, or the stream is aborted
  // An injected fault (sim_device.h): block `inject_block` faults, or hangs until
  // `abort` is set, once it has executed `inject_instruction` instructions.
  uint32_t inject_block = UINT32_MAX;
  uint64_t inject_instruction = 0;
  bool inject_hang = false;
  uint64_t inject_id = 0;
};

class ICache {
 public:
  void configure(uint32_t sets, uint32_t ways, uint32_t line_bytes);
  void invalidate();

  // A cached line, decoded at fill time: the raw instructions and, per instruction,
  // why it cannot be executed (null when it can). Valid until the line is replaced.
  struct Line {
    const isa::Insn* insns = nullptr;
    const char* const* decode_error = nullptr;
  };
  // The line holding `line_addr`, filling it from `gm` on a miss.
  Line fetch_line(uint64_t line_addr, const GlobalMemory& gm, bool* hit);

  uint32_t line_bytes() const { return line_bytes_; }

 private:
  static constexpr uint64_t kInvalid = ~uint64_t{0};  // the tag of an empty way

  Line line(size_t way) const {
    return {&insns_[way * insns_per_line_], &decode_error_[way * insns_per_line_]};
  }

  uint32_t sets_ = 0, ways_ = 0, line_bytes_ = 0, line_shift_ = 0, insns_per_line_ = 0;
  uint64_t clock_ = 0;
  // Per way (set * ways + way), each field in its own array: a lookup reads one
  // set's tags from one cache line, which the weights streaming through the host's
  // caches would otherwise have evicted along with whole line records.
  std::vector<uint64_t> tags_;  // GM address of the line, or kInvalid
  std::vector<uint64_t> last_use_;
  std::vector<isa::Insn> insns_;           // insns_per_line_ per way
  std::vector<const char*> decode_error_;  // likewise
};

struct TileDesc {
  uint32_t offset = 0;  // bytes into local memory
  uint32_t rows = 0, cols = 0;
  isa::DType dtype = isa::DType::kF32;
  bool defined = false;
};

struct LoopFrame {
  uint32_t body_pc = 0;
  uint32_t end_pc = 0;
  int64_t remaining = 0;
};

// Architectural state of one block; survives across barriers. A launch keeps its
// blocks' states side by side and host threads run neighbouring blocks at once: each
// state starts its own cache line, so one block's register writes never invalidate
// the line another thread is reading its registers from.
struct alignas(64) BlockState {
  uint32_t block_id = 0;
  uint32_t pc = 0;
  uint32_t depth = 0;
  int64_t r[isa::kNumScalarRegs] = {};
  TileDesc t[isa::kNumTileRegs];
  LoopFrame loops[isa::kMaxLoopDepth];
  uint64_t executed = 0;  // instructions so far (injected faults count them)
};

enum class BlockResult { kExited, kAtBarrier, kFaulted };

// Counted per fetched instruction: a line of its own, for the same reason.
struct alignas(64) CoreStats {
  uint64_t icache_hits = 0, icache_misses = 0;
  uint64_t stale_fetch_hazards = 0, uninit_read_hazards = 0;
};

class Core {
 public:
  Core(uint32_t id, uint32_t local_bytes, uint32_t icache_sets, uint32_t icache_ways,
       uint32_t icache_line_bytes);

  uint32_t id() const { return id_; }
  uint32_t local_bytes() const { return static_cast<uint32_t>(local_size_); }
  ICache& icache() { return icache_; }

  // Runs `block` until it exits, reaches a barrier or faults (then *fault is set).
  BlockResult run(BlockState& block, const LaunchContext& launch, Status* fault, CoreStats& stats);

 private:
  struct Exec;  // the interpreter, in core.cc

  uint32_t id_;
  size_t local_size_;
  std::unique_ptr<uint8_t[], void (*)(void*)> local_;
  ICache icache_;
};

}  // namespace npurt::sim
