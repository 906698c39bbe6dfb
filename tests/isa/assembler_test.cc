// The assembler: disassemble -> assemble gives the same bytes for every form the
// listing has, hand-written text with comments assembles, and every kind of bad text
// is an error naming its line and column, never a crash.
#include "npurt/isa/assembler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "isa/sample_kernels.h"
#include "npurt/isa/builder.h"
#include "npurt/isa/disasm.h"

namespace npurt::isa {
namespace {

constexpr uint32_t kNoLimit = std::numeric_limits<uint32_t>::max();

std::vector<uint8_t> bytes_of(const Image& image) { return {image.bytes().begin(), image.bytes().end()}; }

// disassemble -> assemble -> the same bytes, and the same listing again.
void expect_round_trip(const Image& image) {
  const std::string text = disassemble(image);
  StatusOr<Image> back = assemble(text, kNoLimit);
  ASSERT_TRUE(back.ok()) << back.status().to_string() << "\n" << text;
  EXPECT_EQ(bytes_of(*back), bytes_of(image)) << text;
  EXPECT_EQ(disassemble(*back), text);
  StatusOr<std::vector<uint8_t>> raw = assemble_bytes(text);
  ASSERT_TRUE(raw.ok()) << raw.status().to_string();
  EXPECT_EQ(*raw, bytes_of(image));
}

void expect_round_trip(const KernelBuilder& b) {
  StatusOr<Image> image = b.build(kNoLimit);
  ASSERT_TRUE(image.ok()) << image.status().to_string();
  expect_round_trip(*image);
}

// The error of assembling `text`: kInvalidArgument starting with `where` (e.g.
// "line 3, column 9: ") and containing `what`.
void expect_error(const std::string& text, const std::string& where, const std::string& what) {
  StatusOr<Image> image = assemble(text);
  ASSERT_FALSE(image.ok()) << "assembled:\n" << text;
  EXPECT_EQ(image.status().code(), StatusCode::kInvalidArgument) << image.status().to_string();
  const std::string& m = image.status().message();
  EXPECT_EQ(m.substr(0, where.size()), where) << m;
  EXPECT_NE(m.find(what), std::string::npos) << "message: " << m << "\nexpected: " << what;
}

// Arguments every opcode can use: 0 x in bf16, 1 y out f32, 2 z inout f32,
// 3 s scalar f32, 4 n scalar i32, 5 q in q4_0.
KernelBuilder args_builder(std::string name) {
  KernelBuilder b(std::move(name));
  b.arg_buffer("x", Access::kIn, DType::kBF16);
  b.arg_buffer("y", Access::kOut, DType::kF32);
  b.arg_buffer("z", Access::kInOut, DType::kF32);
  b.arg_scalar("s", DType::kF32);
  b.arg_scalar("n", DType::kI32);
  b.arg_buffer("q", Access::kIn, DType::kQ4_0);
  return b;
}

const DType kAllDTypes[] = {DType::kF32,  DType::kBF16, DType::kF16,  DType::kI32,  DType::kQ8_0,
                            DType::kQ4_0, DType::kQ5_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};
const DType kPlain[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kI32};
const DType kQuantized[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ5_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

// ---------------------------------------------------------------------------
// Round trips

TEST(AssemblerRoundTrip, SampleKernels) {
  for (const KernelBuilder& b : {testing::copy_kernel(), testing::every_opcode_kernel(),
                                 testing::quant_matvec_kernel()}) {
    expect_round_trip(b);
  }
}

TEST(AssemblerRoundTrip, ScalarAndControlForms) {
  KernelBuilder b = args_builder("scalar");
  const Reg r0{0}, r1{1}, r31{31};
  b.nop();
  b.li(r0, 0);
  b.li(r1, -1);
  b.li(r31, std::numeric_limits<int64_t>::max());
  b.li(r31, std::numeric_limits<int64_t>::min());
  b.mov(r31, r0);
  for (uint8_t op = 0; op < static_cast<uint8_t>(AluOp::kEnd); ++op) {
    b.alu(static_cast<AluOp>(op), r1, r0, r31);
    b.alui(static_cast<AluOp>(op), r1, r0, -static_cast<int64_t>(op) * 1000003);
  }
  b.alui(AluOp::kAdd, r1, r1, std::numeric_limits<int64_t>::min());
  for (uint8_t op = 0; op < static_cast<uint8_t>(FaluOp::kEnd); ++op) b.falu(static_cast<FaluOp>(op), r1, r0, r31);
  b.i2f(r1, r0);
  b.f2i(r0, r1);
  b.block_id(r0);
  b.block_count(r1);
  for (uint8_t a = 0; a < 6; ++a) {
    b.arg_value(r1, a);
    b.arg_bytes(r1, a);
  }
  b.li(r1, 2);
  for (int depth = 0; depth < kMaxLoopDepth; ++depth) b.loop_begin(r1);
  b.nop();
  for (int depth = 0; depth < kMaxLoopDepth; ++depth) b.loop_end();
  b.barrier();
  b.exit();
  expect_round_trip(b);
}

TEST(AssemblerRoundTrip, TileForms) {
  KernelBuilder b = args_builder("tiles");
  const Reg r0{0}, r1{1}, r2{2}, r31{31};
  const Tile t0{0}, t1{1}, t2{2}, t15{15};
  b.tdef(t0, DType::kF32, 16, 64, 0);
  b.tdef(t1, DType::kBF16, 65535, 1, 8192);
  b.tdef(t2, DType::kF16, r1, 32, 64, r2);
  b.tdef(t15, DType::kI32, 16, r31, 4096);
  b.tdef(t15, DType::kF32, r1, r2, std::numeric_limits<uint32_t>::max(), r31);
  for (DType t : kPlain) {
    b.tdef(t1, t, 1, 1, 0);
    b.tld(t0, 0, r0, t);
    b.tld(t0, 2, r0, t, r1);
    b.tld(t0, kConstArg, r0, t, r31);
    b.tst(t0, 1, r0, t);
    b.tst(t0, 2, r0, t, r2);
  }
  for (DType t : kQuantized) {
    b.tldq(t0, 5, r0, r1, t);
    b.tldq(t15, kConstArg, r0, r1, t, true);
  }
  for (DType t : kAllDTypes) {
    b.tgather(t0, 0, t1, r2, t);
    b.tgather(t0, kConstArg, t15, r2, t);
    if (t != DType::kI32) {
      b.tmv(t0, 5, r0, r1, t1, t);
      b.tmv(t15, kConstArg, r0, r1, t2, t, true);
    }
  }
  b.tfill(t0, r31);
  b.tcvt(t0, t15);
  for (uint8_t op = 0; op < static_cast<uint8_t>(BinOp::kEnd); ++op) {
    for (uint8_t bcast : {kBcastNone, kBcastRow, kBcastCol}) b.tbin(static_cast<BinOp>(op), t0, t1, t2, bcast);
    b.tsop(static_cast<BinOp>(op), t0, t1, r31);
  }
  for (uint8_t op = 0; op < static_cast<uint8_t>(UnOp::kEnd); ++op) b.tun(static_cast<UnOp>(op), t0, t1);
  for (uint8_t op = 0; op < static_cast<uint8_t>(RedOp::kEnd); ++op) b.tred(static_cast<RedOp>(op), t0, t1);
  b.tbcast(t0, t1, kBcastRow);
  b.tbcast(t0, t1, kBcastCol);
  for (uint8_t flags = 0; flags < 4; ++flags) b.tmma(t0, t1, t2, flags);
  b.tget(r31, t15, r0);
  const uint8_t table[3] = {1, 2, 3};
  b.add_constants(table);
  b.exit();
  expect_round_trip(b);
}

TEST(AssemblerRoundTrip, ConstantsOfEveryLengthAndChunks) {
  for (size_t n = 1; n <= 40; ++n) {
    SCOPED_TRACE(n);
    KernelBuilder b("consts");
    std::vector<uint8_t> bytes(n);
    for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(0xF0 + i * 37);
    b.add_constants(bytes);
    b.add_constants(std::span<const uint8_t>(bytes).first(n / 2 + 1));  // padded to 16 before it
    b.exit();
    expect_round_trip(b);
  }
}

TEST(AssemblerRoundTrip, NamesWithEveryByte) {
  std::string all;
  for (int c = 1; c < 256; ++c) all += static_cast<char>(c);
  all += '\0';
  KernelBuilder b(all);
  // Names that look like the syntax around them: colons, comment characters,
  // spaces at either end, an empty name.
  for (const std::string& name : {std::string("a: in buffer f32"), std::string(" # x; y : "),
                                 std::string(""), std::string("\\x41"), all}) {
    b.arg_buffer(name, Access::kIn, DType::kF32);
  }
  b.arg_scalar(":", DType::kI32);
  b.exit();
  expect_round_trip(b);
}

TEST(AssemblerRoundTrip, ThirtyTwoArguments) {
  KernelBuilder b("many");
  for (int i = 0; i < kMaxArgs; ++i) b.arg_buffer("a" + std::to_string(i), Access::kInOut, DType::kF16);
  b.arg_value(Reg{0}, kMaxArgs - 1);
  b.tdef(Tile{0}, DType::kF16, 1, 8);
  b.tst(Tile{0}, kMaxArgs - 1, Reg{0}, DType::kF16);
  expect_round_trip(b);
}

TEST(AssemblerRoundTrip, LocalBytesAboveTheStaticTiles) {
  KernelBuilder b("reserved");
  b.tdef(Tile{0}, DType::kF32, 4, 4);
  b.reserve_local(100000);
  b.exit();
  expect_round_trip(b);
}

TEST(AssemblerRoundTrip, DeviceLimitAppliesToAssembleOnly) {
  KernelBuilder b("big");
  b.reserve_local(64u << 20);
  b.exit();
  const std::vector<uint8_t> bytes = b.build_unverified();
  StatusOr<std::string> text = disassemble_bytes(bytes);
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  StatusOr<Image> limited = assemble(*text);
  ASSERT_FALSE(limited.ok());
  EXPECT_EQ(limited.status().code(), StatusCode::kResourceExhausted) << limited.status().to_string();
  EXPECT_EQ(limited.status().message().rfind("line 1, column 1: ", 0), 0u) << limited.status().message();
  StatusOr<std::vector<uint8_t>> raw = assemble_bytes(*text);
  ASSERT_TRUE(raw.ok()) << raw.status().to_string();
  EXPECT_EQ(*raw, bytes);
}

// ---------------------------------------------------------------------------
// The listing of constants

TEST(Disasm, ListsTheConstantSection) {
  KernelBuilder b("table");
  const float values[5] = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f};
  b.add_constant_values(std::span<const float>(values));
  b.exit();
  StatusOr<Image> image = b.build();
  ASSERT_TRUE(image.ok());
  EXPECT_EQ(disassemble(*image),
            "kernel \"table\": 0 args, 1 insns, local 0 B, constants 20 B\n"
            "  0000: exit\n"
            "  const 0000: 00 00 80 3f 00 00 00 40 00 00 40 40 00 00 80 40\n"
            "  const 0010: 00 00 a0 40\n");
}

TEST(Disasm, NoConstantLinesWithoutConstants) {
  StatusOr<Image> image = testing::copy_kernel().build();
  ASSERT_TRUE(image.ok());
  EXPECT_EQ(disassemble(*image).find("const "), std::string::npos);
}

// ---------------------------------------------------------------------------
// Hand-written text

// The example of assembler.h, with comments and free spacing.
constexpr const char* kScale =
    "# y = x * s, 16 x 64 bf16 per block\n"
    "\n"
    "kernel \"scale\": 3 args, 6 insns, local 4096 B, constants 0 B   ; the header\n"
    "  arg0 x: in buffer bf16\n"
    "  arg1 y: out buffer bf16   # written\n"
    "  arg2 s: in scalar f32\n"
    "  0000: li r0, 0\n"
    "\t0001:special   r1 ,arg_value arg2\n"
    "  0002: tdef t0, f32, 16 x 64, local 0\n"
    "  0003: tld t0, arg0[ r0 ], bf16\n"
    "  0004: tsop.mul t0, t0, r1\n"
    "  0005: tst t0, arg1[r0], bf16\n";

TEST(AssemblerText, CommentsBlankLinesAndSpacing) {
  StatusOr<Image> image = assemble(kScale);
  ASSERT_TRUE(image.ok()) << image.status().to_string();
  KernelBuilder b("scale");
  const uint8_t x = b.arg_buffer("x", Access::kIn, DType::kBF16);
  const uint8_t y = b.arg_buffer("y", Access::kOut, DType::kBF16);
  const uint8_t s = b.arg_scalar("s", DType::kF32);
  b.li(Reg{0}, 0);
  b.arg_value(Reg{1}, s);
  b.tdef(Tile{0}, DType::kF32, 16, 64);
  b.tld(Tile{0}, x, Reg{0}, DType::kBF16);
  b.tsop(BinOp::kMul, Tile{0}, Tile{0}, Reg{1});
  b.tst(Tile{0}, y, Reg{0}, DType::kBF16);
  EXPECT_EQ(bytes_of(*image), b.build_unverified());
}

TEST(AssemblerText, LooseSpellings) {
  // Singular nouns, short indices, CRLF line ends, flags in either order, upper-case hex.
  const std::string text =
      "kernel \"k\": 1 arg, 3 insn, local 16384 B, constants 2 B\r\n"
      "arg0 z: inout buffer f32\r\n"
      "0: tdef t0, f32, 64 x 64, local 0\r\n"
      "1: tmma t0, t0, t0, accumulate, trans_b\r\n"
      "2: exit\r\n"
      "const 0: AB cd\r\n";
  StatusOr<Image> image = assemble(text);
  ASSERT_TRUE(image.ok()) << image.status().to_string();
  EXPECT_EQ(image->code()[1].flags, kTransB | kAccumulate);
  ASSERT_EQ(image->constants().size(), 2u);
  EXPECT_EQ(image->constants()[0], 0xAB);
  EXPECT_EQ(image->constants()[1], 0xCD);
  expect_round_trip(*image);
}

TEST(AssemblerText, ArgumentLineWithACommentHoldingAColon) {
  StatusOr<Image> image = assemble(
      "kernel \"k\": 1 args, 1 insns, local 0 B, constants 0 B\n"
      "  arg0 x: in buffer f32  # note: read only\n"
      "  0000: exit\n");
  ASSERT_TRUE(image.ok()) << image.status().to_string();
  EXPECT_EQ(image->args()[0].name, "x");
}

// ---------------------------------------------------------------------------
// Errors

std::string listing_of(const KernelBuilder& b) {
  StatusOr<Image> image = b.build();
  return image.ok() ? disassemble(*image) : image.status().to_string();
}

// Line `n` (1-based) of `text` replaced.
std::string with_line(const std::string& text, int n, const std::string& line) {
  size_t begin = 0;
  for (int i = 1; i < n; ++i) begin = text.find('\n', begin) + 1;
  const size_t end = text.find('\n', begin);
  return text.substr(0, begin) + line + text.substr(end);
}

// copy_kernel's listing: line 1 the header, 2-4 the args, 5-14 insns 0000-0009.
std::string copy_listing() { return listing_of(testing::copy_kernel()); }

// The error of assembling copy_listing() with its line `n` replaced by `line`.
void expect_copy_error(int n, const std::string& line, const std::string& where, const std::string& what) {
  expect_error(with_line(copy_listing(), n, line), where, what);
}

TEST(AssemblerErrors, EmptyOrOnlyComments) {
  expect_error("", "line 1, column 1: ", "no header line");
  expect_error("# nothing\n\n", "line 3, column 1: ", "no header line");
}

TEST(AssemblerErrors, HeaderMustComeFirst) {
  expect_error("  arg0 x: in buffer f32\n", "line 1, column 3: ", "expected the header line");
  const std::string text = copy_listing();
  expect_error(text + "kernel \"again\": 0 args, 1 insns, local 0 B, constants 0 B\n", "line 15, column 1: ",
               "a second header line (the first is line 1)");
}

TEST(AssemblerErrors, LinesOutOfOrder) {
  const std::string text = copy_listing();
  expect_error(text + "  arg3 w: in buffer f32\n", "line 15, column 3: ",
               "an argument line after the instruction lines");
  expect_copy_error(5, "  const 0000: 00", "line 6, column 3: ", "an instruction line after the constants lines");
}

TEST(AssemblerErrors, TruncatedHeader) {
  expect_copy_error(1, "kernel \"copy\": 3 args, 10 insns, local 2048",
                    "line 1, column 44: ", "expected 'B', got end of line");
  expect_copy_error(1, "kernel \"copy", "line 1, column 8: ", "no closing '\"'");
}

TEST(AssemblerErrors, UnknownMnemonicsAndSubOps) {
  expect_copy_error(7, "  0002: frob r2, 64", "line 7, column 9: ", "unknown mnemonic 'frob'");
  expect_copy_error(7, "  0002: li.add r2, 64", "line 7, column 9: ", "unknown mnemonic 'li.add'");
  expect_copy_error(6, "  0001: alui.mull r1, r0, 2048", "line 6, column 14: ",
                    "unknown alui operation 'mull' (one of add, sub, mul, div, rem, min, max, shl, shr, and, or)");
  expect_copy_error(6, "  0001: alui r1, r0, 2048", "line 6, column 9: ", "'alui' needs an operation");
  expect_copy_error(5, "  0000: special r0, block_idx", "line 5, column 21: ", "unknown special value 'block_idx'");
}

TEST(AssemblerErrors, BadRegisters) {
  expect_copy_error(11, "  0006:   tld r3, arg0[r1], stride r2, bf16",
                    "line 11, column 15: ", "expected a tile register t0..t15, got 'r3'");
  expect_copy_error(11, "  0006:   tld t16, arg0[r1], stride r2, bf16",
                    "line 11, column 15: ", "expected a tile register t0..t15, got 't16'");
  expect_copy_error(7, "  0002: li r32, 64", "line 7, column 12: ", "expected a scalar register r0..r31, got 'r32'");
  expect_copy_error(11, "  0006:   tld t0, arg32[r1], stride r2, bf16",
                    "line 11, column 19: ", "expected an argument arg0..arg31 or const, got 'arg32'");
  expect_copy_error(11, "  0006:   tld t0, arg0[r1], stride r2, bf17", "line 11, column 40: ", "expected a dtype");
}

TEST(AssemblerErrors, MissingAndExtraOperands) {
  expect_copy_error(7, "  0002: li r2", "line 7, column 14: ", "expected ',', got end of line");
  expect_copy_error(7, "  0002: li r2, 64, 5", "line 7, column 18: ", "unexpected ',' at the end of the line");
  expect_copy_error(10, "  0005: loop r3 0008", "line 10, column 17: ", "expected '->', got '0008'");
  expect_copy_error(14, "  0009: exit now", "line 14, column 14: ", "unexpected 'now'");
}

TEST(AssemblerErrors, OutOfRangeImmediates) {
  expect_copy_error(9, "  0004: tdef t0, bf16, 70000 x 64, local 0",
                    "line 9, column 24: ", "a tile dimension (or register) '70000' is out of range (0..65535)");
  expect_copy_error(9, "  0004: tdef t0, bf16, 16 x 64, local 4294967296",
                    "line 9, column 39: ", "a local byte offset '4294967296' is out of range (0..4294967295)");
  expect_copy_error(7, "  0002: li r2, 9223372036854775808",
                    "line 7, column 16: ", "integer '9223372036854775808' does not fit in 64 bits");
  expect_copy_error(7, "  0002: li r2, -9223372036854775809", "line 7, column 16: ", "does not fit in 64 bits");
  expect_copy_error(7, "  0002: li r2, 6x4", "line 7, column 16: ", "expected an integer, got '6x4'");
}

TEST(AssemblerErrors, BadEscapes) {
  expect_copy_error(1, "kernel \"co\\py\": 3 args, 10 insns, local 2048 B, constants 0 B",
                    "line 1, column 11: ", "bad escape '\\py'");
  expect_copy_error(1, "kernel \"co\\x4\": 3 args, 10 insns, local 2048 B, constants 0 B",
                    "line 1, column 11: ", "bad escape");
  expect_copy_error(2, "  arg0 x\\xzz: in buffer bf16", "line 2, column 9: ", "bad escape");
}

TEST(AssemblerErrors, HeaderCountsMustMatch) {
  expect_copy_error(1, "kernel \"copy\": 4 args, 10 insns, local 2048 B, constants 0 B",
                    "line 1, column 16: ", "the header says 4 args, the listing has 3");
  expect_copy_error(1, "kernel \"copy\": 3 args, 11 insns, local 2048 B, constants 0 B",
                    "line 1, column 24: ", "the header says 11 insns, the listing has 10");
  expect_copy_error(1, "kernel \"copy\": 3 args, 10 insns, local 2048 B, constants 4 B",
                    "line 1, column 58: ", "the header says 4 constant bytes, the listing has 0");
  expect_copy_error(1, "kernel \"copy\": 3 args, 10 insns, local 2048 B, constants 0 B, barrier",
                    "line 1, column 61: ", "the header says barrier, but no instruction is one");
  expect_copy_error(1, "kernel \"copy\": 3 args, 10 insns, local 1024 B, constants 0 B",
                    "line 1, column 40: ", "the header says local 1024 B, but the static tiles need 2048 B");
  expect_copy_error(7, "  0002: barrier", "line 1, column 61: ",
                    "instruction 0002 (line 7) is a barrier: the header must end with ', barrier'");
}

TEST(AssemblerErrors, IndicesAndOffsetsInSequence) {
  expect_copy_error(7, "  0003: li r2, 64",
                    "line 7, column 3: ", "instruction index 0003 out of sequence: expected 0002");
  expect_copy_error(3, "  arg2 y: out buffer bf16", "line 3, column 3: ", "arg2 out of order: expected arg1");
  const std::string header = "kernel \"c\": 0 args, 1 insns, local 0 B, constants 17 B\n  0000: exit\n";
  expect_error(header + "  const 0000: 00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f\n  const 0011: 10\n",
               "line 4, column 9: ", "constants offset 0011 out of sequence: expected 0010");
  expect_error(header + "  const 0000: 00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f 10\n", "line 3, column 63: ",
               "more than 16 bytes on a constants line");
  expect_error(header + "  const 0000: 00 1g\n", "line 3, column 18: ", "expected a byte in hex (00..ff), got '1g'");
  expect_error(header + "  const 0000: 100\n", "line 3, column 15: ", "expected a byte in hex");
  expect_error(header + "  const 0000:\n", "line 3, column 14: ", "expected a byte in hex (00..ff), got end of line");
}

TEST(AssemblerErrors, ScalarArgumentsAreIn) {
  expect_copy_error(4, "  arg2 n: out scalar i32", "line 4, column 11: ", "a scalar argument is always 'in'");
}

TEST(AssemblerErrors, VerifierErrorsNameTheLine) {
  // A store into an `in` argument: the verifier's message, at the instruction's line.
  expect_copy_error(12, "  0007:   tst t0, arg0[r1], stride r2, bf16",
                    "line 12, column 11: ", "kernel \"copy\": insn 7 (TST): operand b: store into `in` arg 0 \"x\"");
  expect_copy_error(10, "  0005: loop r3 -> 0009", "line 10, column 9: ", "insn 5 (LOOP)");
  // A scalar of a type scalars cannot have: at the argument's line.
  expect_copy_error(4, "  arg2 n: in scalar bf16", "line 4, column 3: ", "arg 2: scalar dtype bf16 is not f32 or i32");
  // An empty kernel: at the header.
  expect_error("kernel \"e\": 0 args, 0 insns, local 0 B, constants 0 B\n", "line 1, column 1: ",
               "code_bytes 0 is not a non-zero multiple of 16");
}

// Cutting any line of a valid listing anywhere gives an error that names that line,
// the next one (a line cut down to its indentation is blank, so the next is out of
// sequence) or the header (whose counts no longer match), or a valid image; never a
// crash.
TEST(AssemblerErrors, TruncatedLinesNameTheirLine) {
  const std::string text = listing_of(testing::every_opcode_kernel());
  std::vector<std::string> lines;
  for (size_t begin = 0; begin < text.size();) {
    const size_t end = text.find('\n', begin);
    lines.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  size_t errors = 0;
  for (size_t n = 0; n < lines.size(); ++n) {
    for (size_t cut = 0; cut < lines[n].size(); ++cut) {
      const std::string bad = with_line(text, static_cast<int>(n + 1), lines[n].substr(0, cut));
      StatusOr<Image> image = assemble(bad);
      if (image.ok()) continue;  // e.g. "li r4, 0" cut to a smaller number
      ++errors;
      const std::string& m = image.status().message();
      const auto names = [&](size_t line) { return m.rfind("line " + std::to_string(line) + ", column ", 0) == 0; };
      const bool names_it = names(n + 1) || (cut <= 2 && names(n + 2)) || names(1);
      EXPECT_TRUE(names_it) << "line " << n + 1 << " cut at " << cut << ": " << m;
    }
  }
  EXPECT_GT(errors, 1000u);
}

// Random byte changes of a valid listing: an error naming a line in the text, or an
// image whose listing assembles to the same bytes.
TEST(AssemblerErrors, RandomByteFlips) {
  const std::string text = listing_of(testing::every_opcode_kernel());
  const int num_lines = static_cast<int>(std::count(text.begin(), text.end(), '\n')) + 1;
  std::mt19937 rng(7);
  size_t errors = 0, accepted = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string bad = text;
    const int flips = 1 + trial % 3;
    for (int f = 0; f < flips; ++f) {
      bad[rng() % bad.size()] = static_cast<char>(rng() % 256);
    }
    StatusOr<Image> image = assemble(bad);
    if (image.ok()) {
      ++accepted;
      StatusOr<Image> again = assemble(disassemble(*image));
      ASSERT_TRUE(again.ok()) << again.status().to_string();
      EXPECT_EQ(bytes_of(*again), bytes_of(*image));
      continue;
    }
    ++errors;
    const std::string& m = image.status().message();
    int line = 0;
    ASSERT_EQ(std::sscanf(m.c_str(), "line %d, column", &line), 1) << m;
    // A flipped '\n' can add a line.
    EXPECT_GE(line, 1) << m;
    EXPECT_LE(line, num_lines + flips) << m;
  }
  EXPECT_GT(errors, 2000u);
  RecordProperty("accepted", std::to_string(accepted));
}

// ---------------------------------------------------------------------------
// Fuzz seeds: listings under fuzz/seeds/assembler/. The sample kernels' listings
// (NPURT_WRITE_ASM_SEEDS=<dir> rewrites them) must match the current disassembly;
// every seed there, the operators' listings included (written by ops_test), must
// assemble and round-trip, so the fuzzer starts from valid text.

TEST(FuzzSeeds, SampleListingsAreCommitted) {
  const char* out_dir = std::getenv("NPURT_WRITE_ASM_SEEDS");
  const std::pair<const char*, KernelBuilder> samples[] = {{"copy.s", testing::copy_kernel()},
                                                           {"every_opcode.s", testing::every_opcode_kernel()},
                                                           {"q8_matvec.s", testing::quant_matvec_kernel()}};
  for (const auto& [file, builder] : samples) {
    SCOPED_TRACE(file);
    const std::string text = listing_of(builder);
    if (out_dir != nullptr) {
      std::ofstream out(std::string(out_dir) + "/" + file, std::ios::binary);
      out << text;
      ASSERT_TRUE(out.good());
      continue;
    }
    std::ifstream in(std::string(NPURT_SOURCE_DIR) + "/fuzz/seeds/assembler/" + file, std::ios::binary);
    ASSERT_TRUE(in.good()) << "seed missing; regenerate with NPURT_WRITE_ASM_SEEDS=fuzz/seeds/assembler";
    const std::string committed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(committed, text) << "seed is stale; regenerate with NPURT_WRITE_ASM_SEEDS=fuzz/seeds/assembler";
  }
}

TEST(FuzzSeeds, EveryAssemblerSeedRoundTrips) {
  size_t seeds = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(NPURT_SOURCE_DIR) + "/fuzz/seeds/assembler")) {
    SCOPED_TRACE(entry.path().string());
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    StatusOr<Image> image = assemble(text);
    ASSERT_TRUE(image.ok()) << image.status().to_string();
    EXPECT_EQ(disassemble(*image), text);
    ++seeds;
  }
  EXPECT_GE(seeds, 3u);
}

}  // namespace
}  // namespace npurt::isa
