// KernelBuilder: emits verified kernel images from C++.
//
// A builder collects an argument signature, instructions and constants, then lays
// them out as an image (image.h) and runs the verifier. It is how each operator's
// compile() produces code for the shapes it is given:
//
//   KernelBuilder b("scale");
//   uint8_t x = b.arg_buffer("x", Access::kIn, DType::kBF16);
//   uint8_t y = b.arg_buffer("y", Access::kOut, DType::kBF16);
//   uint8_t s = b.arg_scalar("s", DType::kF32);
//   const Reg off{0}, scale{1};
//   const Tile t{0};
//   b.li(off, 0);
//   b.arg_value(scale, s);
//   b.tdef(t, DType::kF32, 16, 64);
//   b.tld(t, x, off, DType::kBF16);
//   b.tsop(BinOp::kMul, t, t, scale);
//   b.tst(t, y, off, DType::kBF16);
//   StatusOr<Image> image = b.build();
//
// Instruction methods encode exactly what they are given; they do not validate
// operands. Mistakes (a register out of range, a store into an `in` argument, an
// unclosed loop) surface as a Status from build(), never as a crash. Problems only
// the builder can see (a loop_end without loop_begin, a dimension that does not fit
// the encoding) are remembered, first one wins, and reported by build().
//
// Not thread-safe; one builder per kernel. build() does not consume the builder.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "npurt/base/status.h"
#include "npurt/isa/image.h"
#include "npurt/isa/isa.h"

namespace npurt::isa {

// A scalar register r0..r31.
struct Reg {
  uint8_t index;
};

// A tile register t0..t15.
struct Tile {
  uint8_t index;
};

// A TDEF dimension: an immediate (0..65535) or a scalar register read at run time.
// Converts implicitly from both so `b.tdef(t, DType::kF32, 16, Reg{3})` reads naturally.
struct Dim {
  Dim(int value) : imm(value) {}  // NOLINT: implicit by design
  Dim(Reg r) : reg(r.index) {}    // NOLINT: implicit by design
  int imm = 0;
  uint8_t reg = kNoReg;  // kNoReg: the immediate is used
};

class KernelBuilder {
 public:
  explicit KernelBuilder(std::string name);

  // ---- signature ----
  // Each returns the argument's index, used as the memory operand of loads/stores
  // and by arg_value/arg_bytes. Buffers may use any dtype; scalars are kF32 or kI32
  // and always `in`.
  uint8_t arg_buffer(std::string name, Access access, DType dtype);
  uint8_t arg_scalar(std::string name, DType dtype);

  // Appends bytes to the constant section and returns their byte offset there
  // (16-byte aligned). Code reads them with loads whose arg is kConstArg.
  uint32_t add_constants(std::span<const uint8_t> bytes);
  template <typename T>
  requires std::is_trivially_copyable_v<T> uint32_t add_constant_values(std::span<const T> values) {
    return add_constants({reinterpret_cast<const uint8_t*>(values.data()), values.size_bytes()});
  }

  // Raises the header's local_bytes to at least `bytes`: for kernels that place tiles
  // with an offset register or a register shape, whose extent is not visible to
  // build(). Static tiles are accounted for automatically.
  void reserve_local(uint32_t bytes);

  // ---- control ----
  void nop();
  void exit();
  void barrier();
  // Runs the instructions up to the matching loop_end() r[count] times. The builder
  // fills in both LOOP and ENDLOOP targets.
  void loop_begin(Reg count);
  void loop_end();

  // ---- scalar ----
  void li(Reg dst, int64_t value);
  void mov(Reg dst, Reg src);
  void special(Reg dst, Special which, int64_t arg_index = 0);
  void block_id(Reg dst) { special(dst, Special::kBlockId); }
  void block_count(Reg dst) { special(dst, Special::kBlockCount); }
  void arg_value(Reg dst, uint8_t arg) { special(dst, Special::kArgValue, arg); }
  void arg_bytes(Reg dst, uint8_t arg) { special(dst, Special::kArgBytes, arg); }
  void alu(AluOp op, Reg dst, Reg lhs, Reg rhs);
  void alui(AluOp op, Reg dst, Reg lhs, int64_t imm);
  void falu(FaluOp op, Reg dst, Reg lhs, Reg rhs);
  void i2f(Reg dst, Reg src);
  void f2i(Reg dst, Reg src);

  // ---- tiles ----
  // t = rows x cols of `dtype` at local byte offset `local_offset` (+ r[offset_reg]).
  void tdef(Tile t, DType dtype, Dim rows, Dim cols, uint32_t local_offset = 0,
            std::optional<Reg> offset_reg = std::nullopt);
  // GM <-> tile. `offset` holds the byte offset into the argument; `row_stride` the
  // GM row stride in elements (absent: rows are contiguous).
  void tld(Tile dst, uint8_t arg, Reg offset, DType gm_dtype, std::optional<Reg> row_stride = std::nullopt);
  void tst(Tile src, uint8_t arg, Reg offset, DType gm_dtype, std::optional<Reg> row_stride = std::nullopt);
  // Quantized blocks -> f32 tile; row stride in bytes. `transposed`: GM row i becomes
  // column i of dst (the B operand of a TMMA without kTransB).
  void tldq(Tile dst, uint8_t arg, Reg offset, Reg row_stride_bytes, DType quant_dtype, bool transposed = false);
  // Row i of dst = row indices[i] of the argument; rows are row_pitch_bytes apart.
  void tgather(Tile dst, uint8_t arg, Tile indices, Reg row_pitch_bytes, DType gm_dtype);
  void tfill(Tile dst, Reg value);
  void tcvt(Tile dst, Tile src);
  void tbin(BinOp op, Tile dst, Tile lhs, Tile rhs, uint8_t bcast = kBcastNone);
  void tun(UnOp op, Tile dst, Tile src);
  void tsop(BinOp op, Tile dst, Tile src, Reg scalar);
  void tred(RedOp op, Tile dst, Tile src);
  void tbcast(Tile dst, Tile src, uint8_t bcast);
  void tmma(Tile acc, Tile lhs, Tile rhs, uint8_t flags = 0);
  void tget(Reg dst, Tile src, Reg flat_index);
  // acc (f32, rows x 1) (+)= W x^T with W's rows read from GM: row i is x.cols values of
  // gm_dtype at byte offset + i * row_stride_bytes of the argument.
  void tmv(Tile acc, uint8_t arg, Reg offset, Reg row_stride_bytes, Tile x, DType gm_dtype, bool accumulate = false);

  // Appends a raw instruction, unchecked; returns its index. For tests that craft
  // malformed code, and for instructions the helpers above do not cover.
  uint32_t emit(const Insn& insn);
  // Index the next instruction will get.
  uint32_t num_insns() const { return static_cast<uint32_t>(code_.size()); }
  // The instructions emitted so far.
  std::span<const Insn> code() const { return code_; }

  // Lays out the image and verifies it for a device with `max_local_bytes` of local
  // memory per core.
  StatusOr<Image> build(uint32_t max_local_bytes = 1u << 20) const;
  // The same bytes without any check: open loops keep an invalid target and recorded
  // errors are ignored. For tests that need malformed images.
  std::vector<uint8_t> build_unverified() const;

 private:
  uint8_t add_arg(std::string name, ArgKind kind, Access access, DType dtype);
  void fail(std::string message);
  uint32_t static_local_bytes() const;

  std::string name_;
  std::vector<ArgSpec> args_;
  std::vector<Insn> code_;
  std::vector<uint8_t> constants_;
  std::vector<uint32_t> open_loops_;  // indices of LOOPs awaiting loop_end()
  uint32_t reserved_local_ = 0;
  Status first_error_;
};

}  // namespace npurt::isa
