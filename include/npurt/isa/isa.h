// The npurt tile ISA: instruction encoding, opcodes, dtypes and operand rules.
//
// This header is the contract between the kernel builder, the image verifier, the
// disassembler and the simulated NPU's cores. It describes bytes, not behaviour of
// any one device; see docs/isa.md for the semantics of each instruction.
//
// Machine model seen by a kernel (one "block" of a launch grid):
//   * 32 scalar registers r0..r31, 64-bit. Integer ops treat them as int64; float
//     ops (FALU, tile-scalar ops, TFILL) use the low 32 bits as an IEEE f32.
//   * Special read-only values read with SPECIAL: block index, block count, the
//     value of argument i (a scalar's bits; 0 for a buffer, whose base is never
//     visible to code) and the byte length of argument i.
//   * 16 tile registers t0..t15. A tile register is a descriptor
//     {local byte offset, rows, cols, dtype} set by TDEF; tile data lives in the
//     core's local memory. Row stride in local memory is `cols` (dense tiles).
//   * Global memory (GM) is reachable only through argument-relative memory
//     operands (arg index, byte-offset register): images are position independent
//     and every access is bounds-checked against its argument's buffer.
//     Argument index kConstArg addresses the image's own constant section.
//   * Counted loops (LOOP/ENDLOOP, nesting depth <= kMaxLoopDepth), no other
//     control flow. BARRIER waits for every block of the launch.
//
// Every instruction is 16 bytes, little-endian:
//   byte 0  opcode      byte 1..5  operands a..e      byte 6  sub-op   byte 7 flags
//   bytes 8..15 imm (int64)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace npurt::isa {

inline constexpr int kNumScalarRegs = 32;
inline constexpr int kNumTileRegs = 16;
inline constexpr int kMaxLoopDepth = 8;
// Vectors one batched TMV multiplies (rows of its x tile).
inline constexpr uint32_t kMaxTmvBatch = 16;
inline constexpr int kMaxArgs = 32;
inline constexpr uint8_t kConstArg = 0xFF;  // memory operand: the image's constants
inline constexpr uint8_t kNoReg = 0xFF;     // optional register operand absent
inline constexpr size_t kInsnBytes = 16;

// Element types. Plain types can be tile dtypes; block-quantized types exist only in
// GM and are loaded with TLDQ (dequantizing to f32). Codes are part of the format.
enum class DType : uint8_t {
  kF32 = 0,
  kBF16 = 1,
  kF16 = 2,
  kI32 = 3,
  kQ8_0 = 16,
  kQ4_0 = 17,
  kQ5_0 = 18,
  kQ4_K = 19,
  kQ5_K = 20,
  kQ6_K = 21,
};

bool dtype_is_valid(uint8_t code);
bool dtype_is_plain(DType t);      // f32, bf16, f16, i32
bool dtype_is_quantized(DType t);  // one of the block types
// Bytes per element for plain types; 0 for quantized types.
size_t dtype_size(DType t);
// Elements per block / bytes per block for quantized types (1 / size for plain).
size_t dtype_block_elems(DType t);
size_t dtype_block_bytes(DType t);
std::string_view dtype_name(DType t);

enum class Opcode : uint8_t {
  kNop = 0,
  kExit = 1,     // end this block
  kBarrier = 2,  // grid-wide barrier: every block of the launch reaches it first
  kLoop = 3,     // a: count reg; imm: index of the matching ENDLOOP. Runs body count times
                 //    (count <= 0 skips to after ENDLOOP).
  kEndLoop = 4,  // imm: index of the matching LOOP

  // ---- scalar ----
  kLi = 16,       // r[a] = imm
  kMov = 17,      // r[a] = r[b]
  kSpecial = 18,  // r[a] = special(sub: Special, imm: arg index for kArgValue/kArgBytes)
  kAlu = 19,      // r[a] = r[b] <sub:AluOp> r[c]           (int64)
  kAluI = 20,     // r[a] = r[b] <sub:AluOp> imm            (int64)
  kFalu = 21,     // r[a] = f32(r[b]) <sub:FaluOp> f32(r[c]) (f32 bits)
  kI2F = 22,      // r[a] = f32 bits of (float)int64 r[b]
  kF2I = 23,      // r[a] = (int64)truncate(f32 r[b])

  // ---- tiles ----
  // TDEF t[a]: dtype = sub; rows = (b == kNoReg ? imm[32..47] : r[b]);
  //            cols = (c == kNoReg ? imm[48..63] : r[c]);
  //            local offset = imm[0..31] + (d == kNoReg ? 0 : r[d])
  kTdef = 32,
  // TLD t[a] <- GM arg b at byte offset r[c], row stride r[d] elements of GM dtype
  //   (d == kNoReg: rows are contiguous, stride = cols); GM dtype = sub (plain);
  //   converts to t[a].dtype.
  kTld = 33,
  // TST t[a] -> GM arg b at byte offset r[c], row stride r[d] (as TLD); GM dtype =
  //   sub; converts from t[a].dtype. Not allowed to `in` arguments or constants.
  kTst = 34,
  // TLDQ t[a] (f32) <- quantized GM arg b, byte offset r[c] of the first block of
  //   row 0, row stride r[d] bytes; GM dtype = sub (quantized). t.cols must be a
  //   multiple of the block size. flags kTransB: the tile holds the rows
  //   transposed (row i of GM is column i of t[a]; t.rows values per GM row, t.cols rows).
  kTldq = 35,
  // TGATHER t[a] <- rows of GM arg b: row i = element row idx[i] where idx is the
  //   i32 tile t[c] (first column); row pitch r[d] bytes; GM dtype = sub (any type;
  //   quantized rows dequantize into an f32 tile whose cols are a multiple of the block size).
  kTgather = 36,
  kTfill = 37,   // t[a] = f32(r[b]) (or int64 r[b] for i32 tiles)
  kTcvt = 38,    // t[a] = convert(t[b]); same shape
  kTbin = 39,    // t[a] = t[b] <sub:BinOp> t[c]; flags: broadcast of t[c] (Bcast)
  kTun = 40,     // t[a] = <sub:UnOp>(t[b])
  kTsop = 41,    // t[a] = t[b] <sub:BinOp> f32(r[c])
  kTred = 42,    // t[a] (rows x 1) = <sub:RedOp> over each row of t[b]
  kTbcast = 43,  // t[a] = broadcast of t[b]: flags kBcastRow (1 x cols) or kBcastCol (rows x 1)
  kTmma = 44,    // t[a] (f32, MxN) (+)= t[b] (MxK) * t[c] (KxN, or NxK with kTransB);
                 //   flags: kTransB, kAccumulate
  kTget = 45,    // r[a] = element r[c] (flat index) of t[b]: f32 bits or int64 for i32
  // TMV t[a] (f32, rows x 1) (+)= W * t[e]^T: row i of W is t[e].cols values of GM dtype
  //   sub (f32, bf16, f16 or quantized) at byte r[c] + i * r[d] of arg b; t[e] is an f32
  //   1 x K tile. Weights stream from GM without a local copy. flags: kAccumulate.
  //   Batched: t[e] T x K (T <= kMaxTmvBatch vectors) and t[a] T x rows; each weight row
  //   is read once for all T, and row t of t[a] is bitwise the T = 1 result for row t of t[e].
  kTmv = 46,
  kOpcodeEnd,
};

enum class Special : uint8_t {
  kBlockId = 0,
  kBlockCount = 1,
  kArgValue = 2,  // imm = arg index
  kArgBytes = 3,  // imm = arg index
  kEnd,
};

enum class AluOp : uint8_t { kAdd, kSub, kMul, kDiv, kRem, kMin, kMax, kShl, kShr, kAnd, kOr, kEnd };
enum class FaluOp : uint8_t { kAdd, kSub, kMul, kDiv, kMin, kMax, kEnd };
enum class BinOp : uint8_t { kAdd, kSub, kMul, kDiv, kMax, kMin, kEnd };
// Codes are part of the format: new ops are appended before kEnd.
enum class UnOp : uint8_t {
  kExp, kRsqrt, kSqrt, kTanh, kGeluTanh, kSilu, kRecip, kNeg, kAbs, kSin, kCos, kLog, kEnd
};
enum class RedOp : uint8_t { kSum, kMax, kSumSq, kArgmax, kEnd };

// Flags byte.
inline constexpr uint8_t kBcastNone = 0;
inline constexpr uint8_t kBcastRow = 1;  // operand is 1 x cols, repeated over rows
inline constexpr uint8_t kBcastCol = 2;  // operand is rows x 1, repeated over cols
inline constexpr uint8_t kTransB = 1;
inline constexpr uint8_t kAccumulate = 2;

#pragma pack(push, 1)
struct Insn {
  uint8_t op = 0;
  uint8_t a = 0, b = 0, c = 0, d = 0, e = 0;
  uint8_t sub = 0;
  uint8_t flags = 0;
  int64_t imm = 0;
};
#pragma pack(pop)
static_assert(sizeof(Insn) == kInsnBytes, "instructions are 16 bytes");

// An instruction from its fields in encoding order; e (used by TMV only) stays 0.
constexpr Insn make_insn(Opcode op, uint8_t a = 0, uint8_t b = 0, uint8_t c = 0, uint8_t d = 0,
                         uint8_t sub = 0, uint8_t flags = 0, int64_t imm = 0) {
  return Insn{static_cast<uint8_t>(op), a, b, c, d, 0, sub, flags, imm};
}

std::string_view opcode_name(uint8_t op);

// Helpers for the packed TDEF immediate.
constexpr int64_t tdef_imm(uint32_t local_offset, uint16_t rows, uint16_t cols) {
  return static_cast<int64_t>(static_cast<uint64_t>(local_offset) |
                              (static_cast<uint64_t>(rows) << 32) |
                              (static_cast<uint64_t>(cols) << 48));
}
constexpr uint32_t tdef_offset(int64_t imm) { return static_cast<uint32_t>(static_cast<uint64_t>(imm)); }
constexpr uint16_t tdef_rows(int64_t imm) { return static_cast<uint16_t>(static_cast<uint64_t>(imm) >> 32); }
constexpr uint16_t tdef_cols(int64_t imm) { return static_cast<uint16_t>(static_cast<uint64_t>(imm) >> 48); }

}  // namespace npurt::isa
