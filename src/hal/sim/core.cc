#include "hal/sim/core.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "hal/sim/dequant_kernels.h"
#include "hal/sim/matvec_kernels.h"
#include "hal/sim/tile_kernels.h"
#include "npurt/base/math.h"
#include "npurt/isa/verifier.h"

namespace npurt::sim {

using isa::DType;
using isa::Insn;
using isa::Opcode;

// ---------------------------------------------------------------- global memory

namespace {

constexpr uint64_t kAllOnes = ~uint64_t{0};

// Applies `fn(word_index, mask)` to every shadow word covering bytes [addr, addr+n).
template <typename Fn>
void for_shadow_words(uint64_t first_bit, uint64_t n, Fn fn) {
  uint64_t bit = first_bit;
  const uint64_t end = first_bit + n;
  while (bit < end) {
    const uint64_t word = bit / 64;
    const uint64_t lo = bit % 64;
    const uint64_t hi = std::min<uint64_t>(64, lo + (end - bit));
    const uint64_t mask = (hi - lo == 64) ? kAllOnes : (((uint64_t{1} << (hi - lo)) - 1) << lo);
    if (!fn(word, mask)) return;
    bit += hi - lo;
  }
}

}  // namespace

void GlobalMemory::mark_initialized(uint64_t addr, uint64_t n) const {
  if (!shadow || n == 0) return;
  for_shadow_words(addr - base_addr, n, [&](uint64_t w, uint64_t mask) {
    std::atomic_ref<uint64_t>(shadow[w]).fetch_or(mask, std::memory_order_relaxed);
    return true;
  });
}

void GlobalMemory::mark_uninitialized(uint64_t addr, uint64_t n) const {
  if (!shadow || n == 0) return;
  for_shadow_words(addr - base_addr, n, [&](uint64_t w, uint64_t mask) {
    std::atomic_ref<uint64_t>(shadow[w]).fetch_and(~mask, std::memory_order_relaxed);
    return true;
  });
}

std::optional<uint64_t> GlobalMemory::first_uninitialized(uint64_t addr, uint64_t n) const {
  if (!shadow || n == 0) return std::nullopt;
  std::optional<uint64_t> found;
  for_shadow_words(addr - base_addr, n, [&](uint64_t w, uint64_t mask) {
    const uint64_t bits = std::atomic_ref<uint64_t>(shadow[w]).load(std::memory_order_relaxed);
    const uint64_t missing = ~bits & mask;
    if (missing == 0) return true;
    found = base_addr + w * 64 + static_cast<uint64_t>(std::countr_zero(missing));
    return false;
  });
  return found;
}

// ---------------------------------------------------------------- icache

void ICache::configure(uint32_t sets, uint32_t ways, uint32_t line_bytes) {
  sets_ = sets;  // sets and line bytes are powers of two (SimOptions checks)
  ways_ = ways;
  line_bytes_ = line_bytes;
  line_shift_ = static_cast<uint32_t>(std::countr_zero(line_bytes));
  insns_per_line_ = line_bytes / static_cast<uint32_t>(isa::kInsnBytes);
  const size_t n = static_cast<size_t>(sets) * ways;
  tags_.assign(n, kInvalid);
  last_use_.assign(n, 0);
  insns_.assign(n * insns_per_line_, isa::Insn{});
  decode_error_.assign(n * insns_per_line_, nullptr);
}

void ICache::invalidate() { std::fill(tags_.begin(), tags_.end(), kInvalid); }

ICache::Line ICache::fetch_line(uint64_t line_addr, const GlobalMemory& gm, bool* hit) {
  const size_t first = ((line_addr >> line_shift_) & (sets_ - 1)) * ways_;
  size_t victim = first;
  ++clock_;
  for (size_t w = first; w < first + ways_; ++w) {
    if (tags_[w] == line_addr) {
      last_use_[w] = clock_;
      *hit = true;
      return line(w);
    }
    // An empty way (the last one) or else the least recently used.
    if (tags_[w] == kInvalid || (tags_[victim] != kInvalid && last_use_[w] < last_use_[victim])) victim = w;
  }
  *hit = false;
  tags_[victim] = line_addr;
  last_use_[victim] = clock_;
  isa::Insn* insns = &insns_[victim * insns_per_line_];
  const char** errors = &decode_error_[victim * insns_per_line_];
  std::memcpy(insns, gm.ptr(line_addr), line_bytes_);
  for (size_t i = 0; i < insns_per_line_; ++i) {
    // Loop targets depend on the launch and are checked when executed.
    errors[i] = isa::insn_structure_error(insns[i], UINT32_MAX);
  }
  return line(victim);
}


// ---------------------------------------------------------------- core

Core::Core(uint32_t id, uint32_t local_bytes, uint32_t icache_sets, uint32_t icache_ways,
           uint32_t icache_line_bytes)
    : id_(id),
      local_size_(local_bytes),
      local_(static_cast<uint8_t*>(std::aligned_alloc(64, round_up(local_bytes, 64))), std::free) {
  // Local memory starts as garbage on hardware; a fixed pattern keeps runs reproducible.
  std::memset(local_.get(), 0xA5, local_size_);
  icache_.configure(icache_sets, icache_ways, icache_line_bytes);
}

// The interpreter for one block. Kept as a struct so helpers share the context
// without long parameter lists.
struct Core::Exec {
  Core& core;
  BlockState& b;
  const LaunchContext& L;
  Status* fault;
  CoreStats& stats;
  uint32_t pc = 0;
  const Insn* in = nullptr;

  // ---- faults ----
  bool fail(const std::string& msg, StatusCode code = StatusCode::kDeviceFault) {
    char where[160];
    std::snprintf(where, sizeof where, "kernel '%.*s' (image at 0x%llx), block %u, insn %u (%.*s): ",
                  static_cast<int>(L.kernel_name.size()), L.kernel_name.data(),
                  static_cast<unsigned long long>(L.image_addr), b.block_id, pc,
                  static_cast<int>(isa::opcode_name(in ? in->op : 0).size()),
                  isa::opcode_name(in ? in->op : 0).data());
    *fault = Status(code, where + msg);
    return false;
  }

  // ---- operands ----
  int64_t reg(uint8_t r) const { return b.r[r]; }
  float freg(uint8_t r) const { return std::bit_cast<float>(static_cast<uint32_t>(b.r[r])); }
  void set_freg(uint8_t r, float v) { b.r[r] = std::bit_cast<uint32_t>(v); }

  uint8_t* local(const TileDesc& t) const { return core.local_.get() + t.offset; }
  float* lf(const TileDesc& t) const { return reinterpret_cast<float*>(local(t)); }
  static size_t elems(const TileDesc& t) { return static_cast<size_t>(t.rows) * t.cols; }

  const TileDesc* tile(uint8_t i, const char* role) {
    const TileDesc& t = b.t[i];
    if (!t.defined) {
      fail(std::string(role) + " tile t" + std::to_string(i) + " is not defined");
      return nullptr;
    }
    return &t;
  }
  const TileDesc* f32_tile(uint8_t i, const char* role) {
    const TileDesc* t = tile(i, role);
    if (t && t->dtype != DType::kF32) {
      fail(std::string(role) + " tile t" + std::to_string(i) + " must be f32, is " +
           std::string(isa::dtype_name(t->dtype)));
      return nullptr;
    }
    return t;
  }
  bool same_shape(const TileDesc& x, const TileDesc& y, const char* what) {
    if (x.rows == y.rows && x.cols == y.cols) return true;
    return fail(std::string(what) + ": shape " + std::to_string(x.rows) + "x" + std::to_string(x.cols) +
                " vs " + std::to_string(y.rows) + "x" + std::to_string(y.cols));
  }

  static uint64_t tile_bytes(const TileDesc& t) { return elems(t) * isa::dtype_size(t.dtype); }

  // Tile math reads and writes whole tiles through vector kernels, which are only
  // correct when the output is disjoint from an input or exactly the same tile.
  bool disjoint_or_same(const TileDesc& out, const TileDesc& in, const char* what) {
    const uint64_t o0 = out.offset, o1 = o0 + tile_bytes(out);
    const uint64_t i0 = in.offset, i1 = i0 + tile_bytes(in);
    if (o1 <= i0 || i1 <= o0 || o0 == o1 || i0 == i1) return true;
    if (o0 == i0 && o1 == i1 && out.dtype == in.dtype) return true;
    return fail(std::string(what) + ": destination tile partially overlaps a source tile");
  }

  const ArgBinding* arg(uint8_t index) {
    if (index == isa::kConstArg) return &L.constants;
    if (index >= L.num_args) {
      fail("argument " + std::to_string(index) + " does not exist (launch has " +
           std::to_string(L.num_args) + ")");
      return nullptr;
    }
    const ArgBinding& a = L.args[index];
    if (a.is_scalar) {
      fail("argument " + std::to_string(index) + " is a scalar, not a buffer");
      return nullptr;
    }
    return &a;
  }
  // The buffer a load (store: a store) accesses, when it exists and allows that.
  const ArgBinding* memory_arg(uint8_t index, bool store) {
    const ArgBinding* a = arg(index);
    if (a && !(store ? a->writable : a->readable)) {
      fail("arg " + std::to_string(index) + (store ? " is not writable" : " is not readable"));
      return nullptr;
    }
    return a;
  }

  // Checks a rows x row_bytes access with `pitch` bytes between rows at byte offset
  // `off` of `a`; returns the device address of the first byte.
  bool gm_window(const ArgBinding& a, uint8_t arg_index, int64_t off, uint64_t rows, uint64_t row_bytes,
                 int64_t pitch, uint64_t* first) {
    if (off < 0 || pitch < 0) {
      return fail("arg " + std::to_string(arg_index) + ": negative offset " + std::to_string(off) +
                  " or stride " + std::to_string(pitch));
    }
    unsigned __int128 end = static_cast<unsigned __int128>(off) +
                            static_cast<unsigned __int128>(rows - 1) * static_cast<uint64_t>(pitch) +
                            row_bytes;
    if (end > a.bytes) {
      return fail("out-of-bounds access to arg " + std::to_string(arg_index) + ": bytes [" +
                  std::to_string(off) + ", " + std::to_string(static_cast<uint64_t>(end)) +
                  ") of a " + std::to_string(a.bytes) + "-byte buffer at " + hex(a.addr));
    }
    *first = a.addr + static_cast<uint64_t>(off);
    return true;
  }

  // Inline, for the per-row calls of loads: without the sanitizer it is one test.
  [[gnu::always_inline]] bool check_initialized(uint64_t addr, uint64_t n, uint8_t arg_index) {
    return !L.sanitize || report_uninitialized(addr, n, arg_index);
  }
  bool report_uninitialized(uint64_t addr, uint64_t n, uint8_t arg_index) {
    auto bad = L.gm->first_uninitialized(addr, n);
    if (!bad) return true;
    ++stats.uninit_read_hazards;
    return fail("hazard: read of never-written global memory at " + hex(*bad) + " (arg " +
                    std::to_string(arg_index) + ")",
                StatusCode::kHazard);
  }

  // ---- instruction groups ----
  bool exec_scalar();
  bool exec_tdef();
  bool exec_load_store(bool store);
  bool quant_row_bytes(const TileDesc& t, DType qt, const char* what, uint64_t* row_bytes);
  bool exec_tldq();
  bool exec_gather();
  bool exec_tile_math();
  bool exec_tmma();
  bool exec_tmv();
  bool exec_loop(uint32_t* next_pc);

  BlockResult run();
  BlockResult inject();  // the injected fault of this block (LaunchContext::inject_*)
};

bool Core::Exec::exec_scalar() {
  const Insn& i = *in;
  switch (static_cast<Opcode>(i.op)) {
    case Opcode::kLi: b.r[i.a] = i.imm; return true;
    case Opcode::kMov: b.r[i.a] = b.r[i.b]; return true;
    case Opcode::kSpecial: {
      switch (static_cast<isa::Special>(i.sub)) {
        case isa::Special::kBlockId: b.r[i.a] = b.block_id; return true;
        case isa::Special::kBlockCount: b.r[i.a] = L.grid; return true;
        case isa::Special::kArgValue:
        case isa::Special::kArgBytes: {
          if (i.imm < 0 || static_cast<uint64_t>(i.imm) >= L.num_args) {
            return fail("argument " + std::to_string(i.imm) + " does not exist");
          }
          const ArgBinding& a = L.args[i.imm];
          const bool value = static_cast<isa::Special>(i.sub) == isa::Special::kArgValue;
          b.r[i.a] = static_cast<int64_t>(value ? (a.is_scalar ? a.bits : 0) : a.bytes);
          return true;
        }
        default: return fail("bad special register");
      }
    }
    case Opcode::kAlu:
    case Opcode::kAluI: {
      const int64_t x = b.r[i.b];
      const int64_t y = static_cast<Opcode>(i.op) == Opcode::kAlu ? b.r[i.c] : i.imm;
      int64_t r = 0;
      switch (static_cast<isa::AluOp>(i.sub)) {
        case isa::AluOp::kAdd: r = static_cast<int64_t>(static_cast<uint64_t>(x) + static_cast<uint64_t>(y)); break;
        case isa::AluOp::kSub: r = static_cast<int64_t>(static_cast<uint64_t>(x) - static_cast<uint64_t>(y)); break;
        case isa::AluOp::kMul: r = static_cast<int64_t>(static_cast<uint64_t>(x) * static_cast<uint64_t>(y)); break;
        case isa::AluOp::kDiv:
        case isa::AluOp::kRem:
          if (y == 0 || (x == INT64_MIN && y == -1)) return fail("integer division by zero or overflow");
          r = static_cast<isa::AluOp>(i.sub) == isa::AluOp::kDiv ? x / y : x % y;
          break;
        case isa::AluOp::kMin: r = std::min(x, y); break;
        case isa::AluOp::kMax: r = std::max(x, y); break;
        case isa::AluOp::kShl: r = static_cast<int64_t>(static_cast<uint64_t>(x) << (y & 63)); break;
        case isa::AluOp::kShr: r = x >> (y & 63); break;
        case isa::AluOp::kAnd: r = x & y; break;
        case isa::AluOp::kOr: r = x | y; break;
        default: return fail("bad ALU op");
      }
      b.r[i.a] = r;
      return true;
    }
    case Opcode::kFalu: {
      const float x = freg(i.b), y = freg(i.c);
      float r = 0;
      switch (static_cast<isa::FaluOp>(i.sub)) {
        case isa::FaluOp::kAdd: r = x + y; break;
        case isa::FaluOp::kSub: r = x - y; break;
        case isa::FaluOp::kMul: r = x * y; break;
        case isa::FaluOp::kDiv: r = x / y; break;
        case isa::FaluOp::kMin: r = std::fmin(x, y); break;
        case isa::FaluOp::kMax: r = std::fmax(x, y); break;
        default: return fail("bad float ALU op");
      }
      set_freg(i.a, r);
      return true;
    }
    case Opcode::kI2F: set_freg(i.a, static_cast<float>(b.r[i.b])); return true;
    case Opcode::kF2I: {
      const float f = freg(i.b);
      if (!(std::fabs(f) < 9.2e18f)) return fail("float to int conversion out of range");
      b.r[i.a] = static_cast<int64_t>(f);
      return true;
    }
    default: return fail("not a scalar instruction");
  }
}

bool Core::Exec::exec_tdef() {
  const Insn& i = *in;
  const DType dt = static_cast<DType>(i.sub);
  const int64_t rows = i.b == isa::kNoReg ? isa::tdef_rows(i.imm) : reg(i.b);
  const int64_t cols = i.c == isa::kNoReg ? isa::tdef_cols(i.imm) : reg(i.c);
  const int64_t off = static_cast<int64_t>(isa::tdef_offset(i.imm)) + (i.d == isa::kNoReg ? 0 : reg(i.d));
  if (rows < 0 || cols < 0 || off < 0 || rows > INT32_MAX || cols > INT32_MAX) {
    return fail("tile t" + std::to_string(i.a) + " has negative or huge shape/offset (" + std::to_string(rows) +
                "x" + std::to_string(cols) + " at " + std::to_string(off) + ")");
  }
  const unsigned __int128 end = static_cast<unsigned __int128>(off) +
                                static_cast<unsigned __int128>(rows) * static_cast<uint64_t>(cols) *
                                    isa::dtype_size(dt);
  if (end > core.local_size_) {
    return fail("tile t" + std::to_string(i.a) + " (" + std::to_string(rows) + "x" + std::to_string(cols) + " " +
                std::string(isa::dtype_name(dt)) + " at local offset " + std::to_string(off) +
                ") exceeds local memory of " + std::to_string(core.local_size_) + " bytes");
  }
  if (off % isa::dtype_size(dt) != 0) return fail("tile offset is not aligned to its element size");
  b.t[i.a] = TileDesc{static_cast<uint32_t>(off), static_cast<uint32_t>(rows), static_cast<uint32_t>(cols), dt, true};
  return true;
}

bool Core::Exec::exec_load_store(bool store) {
  const Insn& i = *in;
  const TileDesc* t = tile(i.a, store ? "source" : "destination");
  const ArgBinding* a = t ? memory_arg(i.b, store) : nullptr;
  if (!a) return false;
  if (elems(*t) == 0) return true;
  const DType gt = static_cast<DType>(i.sub);
  const uint64_t esz = isa::dtype_size(gt);
  const int64_t stride = i.d == isa::kNoReg ? t->cols : reg(i.d);
  if (stride < 0 || stride > (INT64_MAX / 16)) return fail("bad row stride " + std::to_string(stride));
  uint64_t first = 0;
  if (!gm_window(*a, i.b, reg(i.c), t->rows, t->cols * esz, stride * static_cast<int64_t>(esz), &first)) {
    return false;
  }
  const size_t tsz = isa::dtype_size(t->dtype);
  const uint64_t row_bytes = t->cols * esz;
  const bool dense = static_cast<uint64_t>(stride) == t->cols;
  const uint32_t pieces = dense ? 1 : t->rows;
  const size_t piece_elems = dense ? elems(*t) : t->cols;
  for (uint32_t r = 0; r < pieces; ++r) {
    const uint64_t g = first + static_cast<uint64_t>(r) * stride * esz;
    uint8_t* l = local(*t) + static_cast<size_t>(r) * t->cols * tsz;
    const uint64_t n = dense ? row_bytes * t->rows : row_bytes;
    if (store) {
      convert(l, t->dtype, L.gm->ptr(g), gt, piece_elems);
      L.gm->mark_initialized(g, n);
    } else {
      if (!check_initialized(g, n, i.b)) return false;
      convert(L.gm->ptr(g), gt, l, t->dtype, piece_elems);
    }
  }
  return true;
}

bool Core::Exec::quant_row_bytes(const TileDesc& t, DType qt, const char* what, uint64_t* row_bytes) {
  if (!isa::dtype_is_quantized(qt)) {
    return fail(std::string(what) + ": " + std::string(isa::dtype_name(qt)) + " is not a quantized type");
  }
  if (t.dtype != DType::kF32) {
    return fail(std::string(what) + ": destination tile must be f32 to receive " +
                std::string(isa::dtype_name(qt)) + " rows, is " + std::string(isa::dtype_name(t.dtype)));
  }
  const uint64_t be = isa::dtype_block_elems(qt);
  if (t.cols % be != 0) {
    return fail(std::string(what) + ": tile cols " + std::to_string(t.cols) + " is not a multiple of the " +
                std::string(isa::dtype_name(qt)) + " block size " + std::to_string(be));
  }
  *row_bytes = t.cols / be * isa::dtype_block_bytes(qt);
  return true;
}

namespace {

// TLDQ with kTransB decodes this many rows at a time before transposing them.
constexpr uint32_t kTransposeGroup = 8;

}  // namespace

bool Core::Exec::exec_tldq() {
  const Insn& i = *in;
  const TileDesc* t = tile(i.a, "destination");
  const ArgBinding* a = t ? memory_arg(i.b, /*store=*/false) : nullptr;
  if (!a) return false;
  const DType qt = static_cast<DType>(i.sub);
  // Transposed, GM row r is column r of the tile: t.rows values per row, t.cols rows.
  const bool transposed = (i.flags & isa::kTransB) != 0;
  const TileDesc shape = transposed ? TileDesc{t->offset, t->cols, t->rows, t->dtype, true} : *t;
  uint64_t row_bytes = 0;
  if (!quant_row_bytes(shape, qt, "TLDQ", &row_bytes)) return false;
  if (elems(*t) == 0) return true;
  const int64_t pitch = reg(i.d);
  uint64_t first = 0;
  if (!gm_window(*a, i.b, reg(i.c), shape.rows, row_bytes, pitch, &first)) return false;
  const bool dense = static_cast<uint64_t>(pitch) == row_bytes;
  if (dense && !check_initialized(first, row_bytes * shape.rows, i.b)) return false;
  const auto row_at = [&](uint32_t r) { return first + static_cast<uint64_t>(r) * static_cast<uint64_t>(pitch); };
  if (!transposed) {
    for (uint32_t r = 0; r < shape.rows; ++r) {
      if (!dense && !check_initialized(row_at(r), row_bytes, i.b)) return false;
      dequantize(L.gm->ptr(row_at(r)), qt, lf(*t) + static_cast<size_t>(r) * t->cols, t->cols);
    }
    return true;
  }
  // Groups of kGroup rows are decoded into scratch and written out as columns, 8 x 8
  // blocks at a time where the CPU has AVX2, so each tile row receives runs of kGroup
  // contiguous values.
  const size_t vals = shape.cols;
  thread_local std::vector<float> scratch;
  scratch.resize(kTransposeGroup * vals);
  for (uint32_t r0 = 0; r0 < shape.rows; r0 += kTransposeGroup) {
    const uint32_t n = std::min(kTransposeGroup, shape.rows - r0);
    for (uint32_t j = 0; j < n; ++j) {
      if (!dense && !check_initialized(row_at(r0 + j), row_bytes, i.b)) return false;
      dequantize(L.gm->ptr(row_at(r0 + j)), qt, scratch.data() + j * vals, vals);
    }
    transpose(scratch.data(), vals, n, vals, lf(*t) + r0, t->cols);
  }
  return true;
}

bool Core::Exec::exec_gather() {
  const Insn& i = *in;
  const TileDesc* t = tile(i.a, "destination");
  const TileDesc* idx = t ? tile(i.c, "index") : nullptr;
  const ArgBinding* a = idx ? memory_arg(i.b, /*store=*/false) : nullptr;
  if (!a) return false;
  if (idx->dtype != DType::kI32) return fail("index tile must be i32");
  if (idx->rows < t->rows || (t->rows > 0 && idx->cols == 0)) return fail("index tile has fewer rows than destination");
  const DType gt = static_cast<DType>(i.sub);
  const int64_t pitch = reg(i.d);
  if (isa::dtype_is_quantized(gt)) {
    uint64_t qrow_bytes = 0;
    if (!quant_row_bytes(*t, gt, "TGATHER", &qrow_bytes)) return false;
    if (pitch < 0) return fail("TGATHER: negative row pitch " + std::to_string(pitch));
    const int32_t* qix = reinterpret_cast<const int32_t*>(local(*idx));
    for (uint32_t r = 0; r < t->rows && t->cols > 0; ++r) {
      const int64_t row = qix[static_cast<size_t>(r) * idx->cols];
      if (row < 0) return fail("gather index " + std::to_string(row) + " is negative");
      const unsigned __int128 off = static_cast<unsigned __int128>(row) * static_cast<uint64_t>(pitch);
      if (off > static_cast<unsigned __int128>(INT64_MAX)) {
        return fail("out-of-bounds access to arg " + std::to_string(i.b) + ": gather row " + std::to_string(row) +
                    " at pitch " + std::to_string(pitch));
      }
      uint64_t g = 0;
      if (!gm_window(*a, i.b, static_cast<int64_t>(off), 1, qrow_bytes, 0, &g)) return false;
      if (!check_initialized(g, qrow_bytes, i.b)) return false;
      dequantize(L.gm->ptr(g), gt, lf(*t) + static_cast<size_t>(r) * t->cols, t->cols);
    }
    return true;
  }
  if (!isa::dtype_is_plain(gt)) return fail("gather of an invalid GM type");
  const uint64_t row_bytes = t->cols * isa::dtype_size(gt);
  const int32_t* ix = reinterpret_cast<const int32_t*>(local(*idx));
  for (uint32_t r = 0; r < t->rows; ++r) {
    const int64_t row = ix[static_cast<size_t>(r) * idx->cols];
    if (row < 0) return fail("gather index " + std::to_string(row) + " is negative");
    uint64_t g = 0;
    if (!gm_window(*a, i.b, row * pitch, 1, row_bytes, 0, &g)) return false;
    if (!check_initialized(g, row_bytes, i.b)) return false;
    convert(L.gm->ptr(g), gt, local(*t) + static_cast<size_t>(r) * t->cols * isa::dtype_size(t->dtype), t->dtype,
            t->cols);
  }
  return true;
}

bool Core::Exec::exec_tile_math() {
  const Insn& i = *in;
  switch (static_cast<Opcode>(i.op)) {
    case Opcode::kTfill: {
      const TileDesc* t = tile(i.a, "destination");
      if (!t) return false;
      if (t->dtype == DType::kI32) {
        std::fill_n(reinterpret_cast<int32_t*>(local(*t)), elems(*t), static_cast<int32_t>(reg(i.b)));
        return true;
      }
      const float v = freg(i.b);
      if (t->dtype == DType::kF32) {
        std::fill_n(lf(*t), elems(*t), v);
      } else {
        for (size_t k = 0; k < elems(*t); ++k) {
          convert(&v, DType::kF32, local(*t) + k * isa::dtype_size(t->dtype), t->dtype, 1);
        }
      }
      return true;
    }
    case Opcode::kTcvt: {
      const TileDesc* d = tile(i.a, "destination");
      const TileDesc* s = d ? tile(i.b, "source") : nullptr;
      if (!s || !same_shape(*d, *s, "convert") || !disjoint_or_same(*d, *s, "convert")) return false;
      convert(local(*s), s->dtype, local(*d), d->dtype, elems(*d));
      return true;
    }
    case Opcode::kTbin: {
      const TileDesc* d = f32_tile(i.a, "destination");
      const TileDesc* x = d ? f32_tile(i.b, "first operand") : nullptr;
      const TileDesc* y = x ? f32_tile(i.c, "second operand") : nullptr;
      if (!y || !same_shape(*d, *x, "binary op")) return false;
      if (!disjoint_or_same(*d, *x, "binary op") || !disjoint_or_same(*d, *y, "binary op")) return false;
      const auto op = static_cast<isa::BinOp>(i.sub);
      switch (i.flags) {
        case isa::kBcastNone:
          if (!same_shape(*d, *y, "binary op")) return false;
          binary(op, lf(*x), lf(*y), lf(*d), elems(*d));
          return true;
        case isa::kBcastRow:
          if (y->rows != 1 || y->cols != d->cols) return fail("row-broadcast operand must be 1 x cols");
          for (uint32_t r = 0; r < d->rows; ++r) {
            binary(op, lf(*x) + static_cast<size_t>(r) * d->cols, lf(*y), lf(*d) + static_cast<size_t>(r) * d->cols,
                   d->cols);
          }
          return true;
        case isa::kBcastCol:
          if (y->cols != 1 || y->rows != d->rows) return fail("column-broadcast operand must be rows x 1");
          for (uint32_t r = 0; r < d->rows; ++r) {
            binary_scalar(op, lf(*x) + static_cast<size_t>(r) * d->cols, lf(*y)[r],
                          lf(*d) + static_cast<size_t>(r) * d->cols, d->cols);
          }
          return true;
        default: return fail("bad broadcast flags");
      }
    }
    case Opcode::kTun: {
      const TileDesc* d = f32_tile(i.a, "destination");
      const TileDesc* x = d ? f32_tile(i.b, "source") : nullptr;
      if (!x || !same_shape(*d, *x, "unary op") || !disjoint_or_same(*d, *x, "unary op")) return false;
      unary(static_cast<isa::UnOp>(i.sub), lf(*x), lf(*d), elems(*d));
      return true;
    }
    case Opcode::kTsop: {
      const TileDesc* d = f32_tile(i.a, "destination");
      const TileDesc* x = d ? f32_tile(i.b, "source") : nullptr;
      if (!x || !same_shape(*d, *x, "tile-scalar op") || !disjoint_or_same(*d, *x, "tile-scalar op")) return false;
      binary_scalar(static_cast<isa::BinOp>(i.sub), lf(*x), freg(i.c), lf(*d), elems(*d));
      return true;
    }
    case Opcode::kTred: {
      const TileDesc* d = tile(i.a, "destination");
      const TileDesc* x = d ? f32_tile(i.b, "source") : nullptr;
      if (!x) return false;
      const auto op = static_cast<isa::RedOp>(i.sub);
      const DType want = op == isa::RedOp::kArgmax ? DType::kI32 : DType::kF32;
      if (d->dtype != want) return fail("reduction destination must be " + std::string(isa::dtype_name(want)));
      if (d->rows != x->rows || d->cols != 1) return fail("reduction destination must be rows x 1");
      if (!disjoint_or_same(*d, *x, "reduction")) return false;
      reduce_rows(op, lf(*x), x->rows, x->cols, local(*d));
      return true;
    }
    case Opcode::kTbcast: {
      const TileDesc* d = tile(i.a, "destination");
      const TileDesc* x = d ? tile(i.b, "source") : nullptr;
      if (!x) return false;
      if (d->dtype != x->dtype) return fail("broadcast between different dtypes");
      const size_t esz = isa::dtype_size(d->dtype);
      if (i.flags == isa::kBcastRow) {
        if (x->rows != 1 || x->cols != d->cols) return fail("row broadcast source must be 1 x cols");
        for (uint32_t r = 0; r < d->rows; ++r) {
          std::memmove(local(*d) + static_cast<size_t>(r) * d->cols * esz, local(*x), d->cols * esz);
        }
        return true;
      }
      if (i.flags == isa::kBcastCol) {
        if (x->cols != 1 || x->rows != d->rows) return fail("column broadcast source must be rows x 1");
        for (uint32_t r = d->rows; r-- > 0;) {  // backwards: source may alias row 0 of the destination
          uint8_t* row = local(*d) + static_cast<size_t>(r) * d->cols * esz;
          uint8_t v[4];
          std::memcpy(v, local(*x) + r * esz, esz);
          for (uint32_t c = 0; c < d->cols; ++c) std::memcpy(row + c * esz, v, esz);
        }
        return true;
      }
      return fail("bad broadcast flags");
    }
    case Opcode::kTget: {
      const TileDesc* x = tile(i.b, "source");
      if (!x) return false;
      const int64_t k = reg(i.c);
      if (k < 0 || static_cast<uint64_t>(k) >= elems(*x)) {
        return fail("element " + std::to_string(k) + " outside tile of " + std::to_string(elems(*x)));
      }
      if (x->dtype == DType::kI32) {
        b.r[i.a] = reinterpret_cast<const int32_t*>(local(*x))[k];
      } else {
        float v;
        convert(local(*x) + k * isa::dtype_size(x->dtype), x->dtype, &v, DType::kF32, 1);
        set_freg(i.a, v);
      }
      return true;
    }
    default: return fail("not a tile instruction");
  }
}

bool Core::Exec::exec_tmma() {
  const Insn& i = *in;
  const TileDesc* c = f32_tile(i.a, "accumulator");
  const TileDesc* a = c ? tile(i.b, "A") : nullptr;
  const TileDesc* bt = a ? tile(i.c, "B") : nullptr;
  if (!bt) return false;
  const bool trans = i.flags & isa::kTransB;
  const uint32_t m = a->rows, k = a->cols;
  const uint32_t n = trans ? bt->rows : bt->cols;
  const uint32_t kb = trans ? bt->cols : bt->rows;
  if (kb != k || c->rows != m || c->cols != n) {
    return fail("matmul shapes: C " + std::to_string(c->rows) + "x" + std::to_string(c->cols) + ", A " +
                std::to_string(m) + "x" + std::to_string(k) + ", B " + std::to_string(bt->rows) + "x" +
                std::to_string(bt->cols) + (trans ? " (transposed)" : ""));
  }
  for (const TileDesc* src : {a, bt}) {
    if (src->dtype == DType::kI32) return fail("matmul operands must be f32, bf16 or f16");
    const uint64_t s0 = src->offset, s1 = s0 + elems(*src) * isa::dtype_size(src->dtype);
    const uint64_t c0 = c->offset, c1 = c0 + elems(*c) * 4;
    if (s0 < c1 && c0 < s1 && elems(*src) > 0 && elems(*c) > 0) return fail("matmul accumulator overlaps an operand");
  }
  matmul(local(*a), a->dtype, local(*bt), bt->dtype, lf(*c), m, n, k, trans, i.flags & isa::kAccumulate);
  return true;
}

bool Core::Exec::exec_tmv() {
  const Insn& i = *in;
  const TileDesc* acc = f32_tile(i.a, "accumulator");
  const TileDesc* x = acc ? f32_tile(i.e, "x") : nullptr;
  const ArgBinding* a = x ? memory_arg(i.b, /*store=*/false) : nullptr;
  if (!a) return false;
  // x holds T vectors (T x K); the accumulator is R x 1 (T = 1, the GEMV form) or T x R.
  const bool column = acc->cols == 1 && x->rows == 1;
  const uint32_t batch = x->rows, rows = column ? acc->rows : acc->cols;
  if (!column && (acc->rows != batch || batch > isa::kMaxTmvBatch)) {
    return fail("TMV shapes: accumulator " + std::to_string(acc->rows) + "x" + std::to_string(acc->cols) +
                " (must be rows x 1 for one vector, or T x rows), x " + std::to_string(x->rows) + "x" +
                std::to_string(x->cols) + " (T x K, T <= " + std::to_string(isa::kMaxTmvBatch) + ")");
  }
  const uint64_t a0 = acc->offset, a1 = a0 + elems(*acc) * 4, x0 = x->offset, x1 = x0 + elems(*x) * 4;
  if (a0 < x1 && x0 < a1 && elems(*acc) > 0 && elems(*x) > 0) return fail("TMV accumulator overlaps x");
  const DType wt = static_cast<DType>(i.sub);
  uint64_t row_bytes = 0;
  if (isa::dtype_is_quantized(wt)) {
    if (!quant_row_bytes(*x, wt, "TMV", &row_bytes)) return false;
  } else if (wt == DType::kI32) {
    return fail("TMV weights must be f32, bf16, f16 or quantized, are i32");
  } else {
    row_bytes = static_cast<uint64_t>(x->cols) * isa::dtype_size(wt);
  }
  if (rows == 0 || batch == 0) return true;
  const int64_t pitch = reg(i.d);
  uint64_t first = 0;
  if (!gm_window(*a, i.b, reg(i.c), rows, row_bytes, pitch, &first)) return false;
  for (uint32_t r = 0; r < rows; ++r) {
    if (!check_initialized(first + static_cast<uint64_t>(r) * static_cast<uint64_t>(pitch), row_bytes, i.b)) {
      return false;
    }
  }
  matvec_batch(L.gm->ptr(first), wt, static_cast<size_t>(pitch), rows, lf(*x), x->cols, batch, lf(*acc),
               (i.flags & isa::kAccumulate) != 0);
  return true;
}

bool Core::Exec::exec_loop(uint32_t* next_pc) {
  const Insn& i = *in;
  if (i.imm < 0 || static_cast<uint64_t>(i.imm) >= L.num_insns) {
    return fail("loop target " + std::to_string(i.imm) + " outside the code");
  }
  const uint32_t target = static_cast<uint32_t>(i.imm);
  if (static_cast<Opcode>(i.op) == Opcode::kLoop) {
    const int64_t count = reg(i.a);
    if (target <= pc) return fail("LOOP must point forward to its ENDLOOP");
    if (count <= 0) {
      *next_pc = target + 1;
      return true;
    }
    if (b.depth == isa::kMaxLoopDepth) return fail("loop nesting deeper than " + std::to_string(isa::kMaxLoopDepth));
    b.loops[b.depth++] = LoopFrame{pc + 1, target, count};
    return true;
  }
  if (b.depth == 0 || b.loops[b.depth - 1].end_pc != pc) return fail("ENDLOOP without its LOOP");
  LoopFrame& f = b.loops[b.depth - 1];
  if (--f.remaining > 0) {
    *next_pc = f.body_pc;
  } else {
    --b.depth;
  }
  return true;
}

BlockResult Core::Exec::run() {
  const uint32_t line_bytes = core.icache_.line_bytes();
  ICache::Line line;
  uint64_t line_addr = 0;
  pc = b.pc;
  uint32_t since_abort_check = 0;
  const bool injects = b.block_id == L.inject_block;
  while (pc < L.num_insns) {
    if (injects && b.executed == L.inject_instruction) return inject();
    ++b.executed;
    if (++since_abort_check == 64) {
      since_abort_check = 0;
      if (L.abort->load(std::memory_order_relaxed)) {
        b.pc = pc;
        return BlockResult::kExited;  // another block faulted; the launch is over
      }
    }
    const uint64_t addr = L.code_addr + static_cast<uint64_t>(pc) * isa::kInsnBytes;
    const uint64_t want_line = addr & ~static_cast<uint64_t>(line_bytes - 1);
    if (!line.insns || want_line != line_addr) {
      bool hit = false;
      line = core.icache_.fetch_line(want_line, *L.gm, &hit);
      line_addr = want_line;
      ++(hit ? stats.icache_hits : stats.icache_misses);
    } else {
      ++stats.icache_hits;
    }
    const uint32_t slot = static_cast<uint32_t>((addr - line_addr) / isa::kInsnBytes);
    in = &line.insns[slot];
    if (L.sanitize && std::memcmp(in, L.gm->ptr(addr), isa::kInsnBytes) != 0) {
      ++stats.stale_fetch_hazards;
      fail("hazard: stale instruction fetch at " + hex(addr) +
               ": the instruction cache holds bytes of an earlier image; global memory holds different ones",
           StatusCode::kHazard);
      return BlockResult::kFaulted;
    }
    if (const char* err = line.decode_error[slot]) {
      fail(std::string("cannot decode instruction at ") + hex(addr) + ": " + err);
      return BlockResult::kFaulted;
    }
    uint32_t next = pc + 1;
    bool ok = true;
    switch (static_cast<Opcode>(in->op)) {
      case Opcode::kNop: break;
      case Opcode::kExit:
        b.pc = L.num_insns;
        return injects ? inject() : BlockResult::kExited;
      case Opcode::kBarrier: b.pc = next; return BlockResult::kAtBarrier;
      case Opcode::kLoop:
      case Opcode::kEndLoop: ok = exec_loop(&next); break;
      case Opcode::kLi: case Opcode::kMov: case Opcode::kSpecial: case Opcode::kAlu:
      case Opcode::kAluI: case Opcode::kFalu: case Opcode::kI2F: case Opcode::kF2I:
        ok = exec_scalar();
        break;
      case Opcode::kTdef: ok = exec_tdef(); break;
      case Opcode::kTld: ok = exec_load_store(false); break;
      case Opcode::kTst: ok = exec_load_store(true); break;
      case Opcode::kTldq: ok = exec_tldq(); break;
      case Opcode::kTgather: ok = exec_gather(); break;
      case Opcode::kTmma: ok = exec_tmma(); break;
      case Opcode::kTmv: ok = exec_tmv(); break;
      default: ok = exec_tile_math(); break;
    }
    if (!ok) return BlockResult::kFaulted;
    pc = next;
  }
  b.pc = pc;
  return injects ? inject() : BlockResult::kExited;
}

BlockResult Core::Exec::inject() {
  const std::string id = " (injected fault #" + std::to_string(L.inject_id) + ")";
  if (!L.inject_hang) {
    fail("device fault after " + std::to_string(b.executed) + " instructions" + id);
    return BlockResult::kFaulted;
  }
  // A hung kernel: nothing but an abort of its stream ends it.
  while (!L.abort->load(std::memory_order_acquire)) std::this_thread::sleep_for(std::chrono::microseconds(20));
  fail("hung after " + std::to_string(b.executed) + " instructions until its stream was aborted" + id,
       StatusCode::kAborted);
  return BlockResult::kFaulted;
}

BlockResult Core::run(BlockState& block, const LaunchContext& launch, Status* fault, CoreStats& stats) {
  Exec exec{*this, block, launch, fault, stats};
  return exec.run();
}

}  // namespace npurt::sim
