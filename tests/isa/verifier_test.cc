// The verifier against deliberately broken images: each rule has a test that breaks
// exactly that rule and asserts the status code and the message that names it.
#include "npurt/isa/verifier.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "isa/sample_kernels.h"
#include "npurt/isa/builder.h"
#include "npurt/isa/disasm.h"
#include "npurt/isa/image.h"

namespace npurt::isa {
namespace {

using testing::copy_kernel;
using testing::every_opcode_kernel;
using testing::quant_matvec_kernel;

constexpr uint32_t kLocal = 1u << 20;

void expect_error(const Status& s, StatusCode code, const std::string& substring) {
  EXPECT_EQ(s.code(), code) << s.to_string();
  EXPECT_NE(s.message().find(substring), std::string::npos)
      << "message: " << s.message() << "\nexpected: " << substring;
}

void expect_invalid(const Status& s, const std::string& substring) {
  expect_error(s, StatusCode::kInvalidArgument, substring);
}

uint8_t u8(auto e) { return static_cast<uint8_t>(e); }

// Signature used by the instruction tests: 0 x in f32, 1 y out f32, 2 z inout f32,
// 3 s scalar i32.
std::vector<uint8_t> image_with(const std::vector<Insn>& code) {
  KernelBuilder b("k");
  b.arg_buffer("x", Access::kIn, DType::kF32);
  b.arg_buffer("y", Access::kOut, DType::kF32);
  b.arg_buffer("z", Access::kInOut, DType::kF32);
  b.arg_scalar("s", DType::kI32);
  for (const Insn& insn : code) b.emit(insn);
  return b.build_unverified();
}

Status verify_code(const std::vector<Insn>& code) { return verify_image(image_with(code), kLocal); }

ImageHeader header_of(const std::vector<uint8_t>& bytes) {
  ImageHeader h;
  std::memcpy(&h, bytes.data(), sizeof(h));
  return h;
}

template <typename F>
std::vector<uint8_t> with_header(std::vector<uint8_t> bytes, F change) {
  ImageHeader h = header_of(bytes);
  change(h);
  std::memcpy(bytes.data(), &h, sizeof(h));
  return bytes;
}

template <typename F>
std::vector<uint8_t> with_arg(std::vector<uint8_t> bytes, uint32_t index, F change) {
  const size_t at = header_of(bytes).args_offset + index * sizeof(ArgRecord);
  ArgRecord rec;
  std::memcpy(&rec, bytes.data() + at, sizeof(rec));
  change(rec);
  std::memcpy(bytes.data() + at, &rec, sizeof(rec));
  return bytes;
}

std::vector<uint8_t> copy_bytes() { return copy_kernel().build_unverified(); }

// ---------------------------------------------------------------------------
// Valid images

TEST(Verifier, AcceptsSampleKernels) {
  for (const KernelBuilder& b : {copy_kernel(), every_opcode_kernel(), quant_matvec_kernel()}) {
    const Status s = verify_image(b.build_unverified(), kLocal);
    EXPECT_TRUE(s.ok()) << s.to_string();
  }
}

TEST(Verifier, FromBytesReportsTheVerifierError) {
  std::vector<uint8_t> bytes = with_header(copy_bytes(), [](ImageHeader& h) { h.version = 9; });
  StatusOr<Image> image = Image::from_bytes(bytes);
  ASSERT_FALSE(image.ok());
  EXPECT_EQ(image.status().message(), verify_image(bytes, kLocal).message());
}

// ---------------------------------------------------------------------------
// Header

TEST(VerifierHeader, TruncatedAtEveryLength) {
  const std::vector<uint8_t> bytes = every_opcode_kernel().build_unverified();
  for (size_t len = 0; len < bytes.size(); ++len) {
    const Status s = verify_image(std::span<const uint8_t>(bytes.data(), len), kLocal);
    if (len < sizeof(ImageHeader)) {
      expect_invalid(s, "image is " + std::to_string(len) + " bytes, smaller than the 64-byte header");
    } else {
      expect_invalid(s, "image is " + std::to_string(len) + " bytes but header total_bytes is " +
                            std::to_string(bytes.size()));
    }
  }
}

TEST(VerifierHeader, TrailingBytes) {
  std::vector<uint8_t> bytes = copy_bytes();
  const size_t size = bytes.size();
  bytes.push_back(0);
  expect_invalid(verify_image(bytes, kLocal), "image is " + std::to_string(size + 1) +
                                                  " bytes but header total_bytes is " + std::to_string(size));
}

TEST(VerifierHeader, WrongMagic) {
  auto bytes = with_header(copy_bytes(), [](ImageHeader& h) { h.magic = 0x12345678; });
  expect_invalid(verify_image(bytes, kLocal), "image header: magic 0x12345678 is not 0x49555050");
}

TEST(VerifierHeader, WrongVersion) {
  auto bytes = with_header(copy_bytes(), [](ImageHeader& h) { h.version = 2; });
  expect_invalid(verify_image(bytes, kLocal), "image header: version 2 is not 1");
}

TEST(VerifierHeader, UnknownFlags) {
  auto bytes = with_header(copy_bytes(), [](ImageHeader& h) { h.flags = 4; });
  expect_invalid(verify_image(bytes, kLocal), "image header: flags 4 has unknown bits");
}

TEST(VerifierHeader, NonzeroReserved) {
  auto first = with_header(copy_bytes(), [](ImageHeader& h) { h.reserved[0] = 1; });
  expect_invalid(verify_image(first, kLocal), "reserved fields must be zero (reserved[0] 1, reserved[1] 0)");
  auto second = with_header(copy_bytes(), [](ImageHeader& h) { h.reserved[1] = 7; });
  expect_invalid(verify_image(second, kLocal), "reserved[1] 7");
}

TEST(VerifierHeader, TotalBytesBounds) {
  auto small = with_header(copy_bytes(), [](ImageHeader& h) { h.total_bytes = 32; });
  expect_invalid(verify_image(small, kLocal), "image header: total_bytes 32 is not in [64, 67108864]");
  auto big = with_header(copy_bytes(), [](ImageHeader& h) { h.total_bytes = kMaxImageBytes + 1; });
  expect_invalid(verify_image(big, kLocal), "total_bytes 67108865 is not in [64, 67108864]");
}

TEST(VerifierHeader, TooManyArgs) {
  auto bytes = with_header(copy_bytes(), [](ImageHeader& h) { h.num_args = 33; });
  expect_invalid(verify_image(bytes, kLocal), "image header: num_args 33 exceeds 32");
}

TEST(VerifierHeader, SectionsOutOfRange) {
  const std::vector<uint8_t> base = copy_bytes();
  const uint32_t total = header_of(base).total_bytes;
  const std::string tail = " exceeds total_bytes " + std::to_string(total);

  auto args = with_header(base, [](ImageHeader& h) { h.num_args = 32; });
  expect_invalid(verify_image(args, kLocal), "image header: args section [offset 64, 512 bytes)" + tail);
  auto strings = with_header(base, [&](ImageHeader& h) { h.strings_bytes = total; });
  expect_invalid(verify_image(strings, kLocal), "image header: strings section [offset");
  auto code = with_header(base, [&](ImageHeader& h) { h.code_bytes += 16; });
  expect_invalid(verify_image(code, kLocal), "image header: code section [offset");
  auto consts = with_header(base, [&](ImageHeader& h) { h.const_offset = total + 1; });
  expect_invalid(verify_image(consts, kLocal), "image header: constants section [offset " +
                                                   std::to_string(total + 1) + ", 0 bytes)" + tail);
}

TEST(VerifierHeader, SizeArithmeticDoesNotWrap) {
  // 0xFFFFFFF0 + 0x20 wraps to 0x10 in 32 bits, which would look in range.
  auto code = with_header(copy_bytes(), [](ImageHeader& h) {
    h.code_offset = 0xFFFFFFF0u;
    h.code_bytes = 0x20;
  });
  expect_invalid(verify_image(code, kLocal),
                 "code section [offset 4294967280, 32 bytes) exceeds total_bytes");
  auto consts = with_header(copy_bytes(), [](ImageHeader& h) {
    h.const_offset = 0xFFFFFFFFu;
    h.const_bytes = 1;
  });
  expect_invalid(verify_image(consts, kLocal), "constants section [offset 4294967295, 1 bytes)");
  auto strings = with_header(copy_bytes(), [](ImageHeader& h) {
    h.strings_offset = 100;
    h.strings_bytes = 0xFFFFFFFFu;
  });
  expect_invalid(verify_image(strings, kLocal), "strings section [offset 100, 4294967295 bytes)");
  auto name = with_header(copy_bytes(), [](ImageHeader& h) {
    h.name_offset = 0xFFFFFFFFu;
    h.name_bytes = 2;
  });
  expect_invalid(verify_image(name, kLocal), "kernel name [name_offset 4294967295, name_bytes 2)");
}

TEST(VerifierHeader, CodeAlignmentAndSize) {
  const std::vector<uint8_t> base = copy_bytes();
  const ImageHeader h0 = header_of(base);
  auto misaligned = with_header(base, [](ImageHeader& h) {
    h.code_offset += 8;
    h.code_bytes -= 16;
  });
  expect_invalid(
      verify_image(misaligned, kLocal),
      "image header: code_offset " + std::to_string(h0.code_offset + 8) + " is not 16-byte aligned");
  auto ragged = with_header(base, [](ImageHeader& h) { h.code_bytes -= 8; });
  expect_invalid(verify_image(ragged, kLocal),
                 "code_bytes " + std::to_string(h0.code_bytes - 8) + " is not a non-zero multiple of 16");
  auto empty = with_header(base, [](ImageHeader& h) { h.code_bytes = 0; });
  expect_invalid(verify_image(empty, kLocal), "code_bytes 0 is not a non-zero multiple of 16");
}

TEST(VerifierHeader, OverlappingSections) {
  const std::vector<uint8_t> base = copy_bytes();
  auto into_header = with_header(base, [](ImageHeader& h) { h.args_offset = 32; });
  expect_invalid(verify_image(into_header, kLocal),
                 "image sections overlap: header [0, 64) and args [32, 80)");
  auto strings_args = with_header(base, [](ImageHeader& h) { h.strings_offset = h.args_offset + 8; });
  expect_invalid(verify_image(strings_args, kLocal),
                 "image sections overlap: args [64, 112) and strings [72, ");
  auto code_consts = with_header(base, [](ImageHeader& h) {
    h.const_offset = h.code_offset + 16;
    h.const_bytes = 16;
  });
  const ImageHeader h0 = header_of(base);
  expect_invalid(verify_image(code_consts, kLocal),
                 "image sections overlap: code [" + std::to_string(h0.code_offset) + ", " +
                     std::to_string(h0.code_offset + h0.code_bytes) + ") and constants [");
}

TEST(VerifierHeader, EmptySectionsOverlapNothing) {
  // copy has no constants; an empty section may sit anywhere inside the image.
  auto bytes = with_header(copy_bytes(), [](ImageHeader& h) { h.const_offset = h.code_offset + 16; });
  EXPECT_TRUE(verify_image(bytes, kLocal).ok());
}

TEST(VerifierHeader, NameOutsideStrings) {
  auto bytes = with_header(copy_bytes(), [](ImageHeader& h) { h.name_bytes = h.strings_bytes + 1; });
  const ImageHeader h = header_of(bytes);
  expect_invalid(verify_image(bytes, kLocal),
                 "kernel name [name_offset 0, name_bytes " + std::to_string(h.name_bytes) +
                     ") lies outside the strings section of " + std::to_string(h.strings_bytes) + " bytes");
}

TEST(VerifierHeader, LayoutAcceptsALargerRegion) {
  // A device reads the layout from the whole GM block that holds the image.
  std::vector<uint8_t> bytes = copy_bytes();
  const ImageHeader h = header_of(bytes);
  bytes.resize(bytes.size() + 100, 0xEE);
  StatusOr<ImageLayout> layout = read_image_layout(bytes);
  ASSERT_TRUE(layout.ok()) << layout.status().to_string();
  EXPECT_EQ(layout->total_bytes, h.total_bytes);
  EXPECT_EQ(layout->code_offset, h.code_offset);
  EXPECT_EQ(layout->code_bytes, h.code_bytes);
  EXPECT_EQ(layout->num_args, 3u);
  EXPECT_EQ(layout->local_bytes, 2048u);
  EXPECT_EQ(layout->flags, 0);
}

TEST(VerifierHeader, LayoutRejectsAShorterRegion) {
  const std::vector<uint8_t> bytes = copy_bytes();
  const std::span<const uint8_t> header_only(bytes.data(), sizeof(ImageHeader));
  expect_invalid(read_image_layout(header_only).status(),
                 "image is 64 bytes but header total_bytes is " + std::to_string(bytes.size()));
}

TEST(VerifierLocal, StaticOffsetMustBeAligned) {
  expect_invalid(verify_code({make_insn(Opcode::kTdef, 0, kNoReg, kNoReg, kNoReg, u8(DType::kBF16), 0,
                                           tdef_imm(3, 1, 1))}),
                 "insn 0 (TDEF): imm: local offset 3 is not a multiple of the bf16 element size 2");
  // Register shapes do not change the offset's alignment.
  expect_invalid(
      verify_code({make_insn(Opcode::kTdef, 0, 1, 2, kNoReg, u8(DType::kF32), 0, tdef_imm(6, 0, 0))}),
      "insn 0 (TDEF): imm: local offset 6 is not a multiple of the f32 element size 4");
  // With an offset register the final offset is known only at run time.
  EXPECT_TRUE(
      verify_code({make_insn(Opcode::kTdef, 0, kNoReg, kNoReg, 3, u8(DType::kF32), 0, tdef_imm(6, 1, 1))})
          .ok());
}

// ---------------------------------------------------------------------------
// Argument records

TEST(VerifierArgs, BadRecords) {
  const std::vector<uint8_t> base = copy_bytes();  // 0 x in bf16, 1 y out bf16, 2 n scalar i32
  struct Case {
    uint32_t index;
    void (*change)(ArgRecord&);
    const char* message;
  };
  const Case cases[] = {
      {1, [](ArgRecord& r) { r.kind = 2; }, "arg 1: kind 2 is not buffer (0) or scalar (1)"},
      {0, [](ArgRecord& r) { r.access = 0; }, "arg 0: access 0 is not in (1), out (2) or inout (3)"},
      {0, [](ArgRecord& r) { r.access = 4; }, "arg 0: access 4 is not in (1), out (2) or inout (3)"},
      {1, [](ArgRecord& r) { r.dtype = 9; }, "arg 1: dtype 9 is not a dtype"},
      {0, [](ArgRecord& r) { r.reserved0 = 1; },
       "arg 0: reserved fields must be zero (reserved0 1, reserved1 0)"},
      {0, [](ArgRecord& r) { r.reserved1 = 3; },
       "arg 0: reserved fields must be zero (reserved0 0, reserved1 3)"},
  };
  for (const Case& c : cases) {
    expect_invalid(verify_image(with_arg(base, c.index, c.change), kLocal), c.message);
  }
}

TEST(VerifierArgs, ScalarRules) {
  const std::vector<uint8_t> base = copy_bytes();
  expect_invalid(verify_image(with_arg(base, 2, [](ArgRecord& r) { r.dtype = u8(DType::kF16); }), kLocal),
                 "arg 2: scalar dtype f16 is not f32 or i32");
  expect_invalid(verify_image(with_arg(base, 2, [](ArgRecord& r) { r.access = u8(Access::kOut); }), kLocal),
                 "arg 2: scalar access 2 is not in (1)");
  EXPECT_TRUE(verify_image(with_arg(base, 2, [](ArgRecord& r) { r.dtype = u8(DType::kF32); }), kLocal).ok());
}

TEST(VerifierArgs, NameOutsideStrings) {
  const std::vector<uint8_t> base = copy_bytes();
  const uint32_t strings = header_of(base).strings_bytes;
  auto bytes = with_arg(base, 2, [&](ArgRecord& r) { r.name_offset = strings; });
  expect_invalid(verify_image(bytes, kLocal), "arg 2: name [name_offset " + std::to_string(strings) +
                                                  ", name_bytes 1) lies outside the strings section");
  auto wrap = with_arg(base, 0, [](ArgRecord& r) {
    r.name_offset = 0xFFFFFFFFu;
    r.name_bytes = 1;
  });
  expect_invalid(verify_image(wrap, kLocal), "arg 0: name [name_offset 4294967295, name_bytes 1)");
}

// ---------------------------------------------------------------------------
// Instructions: structure

TEST(VerifierInsn, UnknownOpcode) {
  for (int op : {5, 15, 24, 31, 47, 255}) {
    Insn insn;
    insn.op = static_cast<uint8_t>(op);
    expect_invalid(verify_code({insn}), "insn 0 (UNKNOWN): unknown opcode (got " + std::to_string(op) + ")");
  }
}

TEST(VerifierInsn, ScalarRegisters) {
  expect_invalid(verify_code({make_insn(Opcode::kNop), make_insn(Opcode::kMov, 32, 0)}),
                 "insn 1 (MOV): operand a: scalar register out of range r0..r31 (got 32)");
  expect_invalid(verify_code({make_insn(Opcode::kAlu, 1, 2, 200)}),
                 "insn 0 (ALU): operand c: scalar register out of range r0..r31 (got 200)");
  expect_invalid(verify_code({make_insn(Opcode::kLi, kNoReg)}),
                 "insn 0 (LI): operand a: kNoReg where a scalar register is required (got 255)");
  // Optional registers: kNoReg allowed, other values still range-checked.
  EXPECT_TRUE(verify_code({make_insn(Opcode::kTld, 0, 0, 1, kNoReg, u8(DType::kF32))}).ok());
  expect_invalid(verify_code({make_insn(Opcode::kTld, 0, 0, 1, 40, u8(DType::kF32))}),
                 "insn 0 (TLD): operand d: scalar register out of range r0..r31 (got 40)");
  expect_invalid(verify_code({make_insn(Opcode::kTdef, 0, 33, kNoReg, kNoReg, u8(DType::kF32))}),
                 "insn 0 (TDEF): operand b: scalar register out of range r0..r31 (got 33)");
  // TLDQ and TGATHER strides are not optional in isa.h.
  expect_invalid(verify_code({make_insn(Opcode::kTldq, 0, 0, 1, kNoReg, u8(DType::kQ8_0))}),
                 "insn 0 (TLDQ): operand d: kNoReg where a scalar register is required");
  expect_invalid(verify_code({make_insn(Opcode::kTgather, 0, 0, 1, kNoReg, u8(DType::kF32))}),
                 "insn 0 (TGATHER): operand d: kNoReg where a scalar register is required");
  // The LOOP count register is required.
  expect_invalid(verify_code({make_insn(Opcode::kLoop, kNoReg, 0, 0, 0, 0, 0, 1),
                              make_insn(Opcode::kEndLoop, 0, 0, 0, 0, 0, 0, 0)}),
                 "insn 0 (LOOP): operand a: kNoReg where a scalar register is required");
}

TEST(VerifierInsn, TileRegisters) {
  expect_invalid(verify_code({make_insn(Opcode::kTbin, 1, 2, 16)}),
                 "insn 0 (TBIN): operand c: tile register out of range t0..t15 (got 16)");
  expect_invalid(verify_code({make_insn(Opcode::kTgather, 0, 0, 99, 1, u8(DType::kF32))}),
                 "insn 0 (TGATHER): operand c: tile register out of range t0..t15 (got 99)");
  expect_invalid(verify_code({make_insn(Opcode::kTget, 1, 16, 2)}),
                 "insn 0 (TGET): operand b: tile register out of range t0..t15 (got 16)");
  EXPECT_TRUE(verify_code({make_insn(Opcode::kTbin, 15, 15, 15)}).ok());
}

TEST(VerifierInsn, SubOps) {
  struct Case {
    Insn insn;
    const char* message;
  };
  const Case cases[] = {
      {make_insn(Opcode::kAlu, 1, 2, 3, 0, u8(AluOp::kEnd)), "insn 0 (ALU): sub-op: not an AluOp (got 11)"},
      {make_insn(Opcode::kAluI, 1, 2, 0, 0, 200), "insn 0 (ALUI): sub-op: not an AluOp (got 200)"},
      {make_insn(Opcode::kFalu, 1, 2, 3, 0, u8(FaluOp::kEnd)), "insn 0 (FALU): sub-op: not a FaluOp (got 6)"},
      {make_insn(Opcode::kTbin, 1, 2, 3, 0, u8(BinOp::kEnd)), "insn 0 (TBIN): sub-op: not a BinOp (got 6)"},
      {make_insn(Opcode::kTsop, 1, 2, 3, 0, u8(BinOp::kEnd)), "insn 0 (TSOP): sub-op: not a BinOp (got 6)"},
      {make_insn(Opcode::kTun, 1, 2, 0, 0, u8(UnOp::kEnd)), "insn 0 (TUN): sub-op: not a UnOp (got 12)"},
      {make_insn(Opcode::kTred, 1, 2, 0, 0, u8(RedOp::kEnd)), "insn 0 (TRED): sub-op: not a RedOp (got 4)"},
      {make_insn(Opcode::kSpecial, 1, 0, 0, 0, u8(Special::kEnd)),
       "insn 0 (SPECIAL): sub-op: not a Special value (got 4)"},
      {make_insn(Opcode::kTld, 0, 0, 1, kNoReg, u8(DType::kQ4_0)),
       "insn 0 (TLD): sub-op: dtype is not a plain type (got 17)"},
      {make_insn(Opcode::kTst, 0, 1, 1, kNoReg, 7),
       "insn 0 (TST): sub-op: dtype is not a plain type (got 7)"},
      {make_insn(Opcode::kTdef, 0, kNoReg, kNoReg, kNoReg, u8(DType::kQ6_K)),
       "insn 0 (TDEF): sub-op: dtype is not a plain type (got 21)"},
      {make_insn(Opcode::kTldq, 0, 0, 1, 2, u8(DType::kF32)),
       "insn 0 (TLDQ): sub-op: dtype is not a quantized type (got 0)"},
      {make_insn(Opcode::kTgather, 0, 0, 1, 2, 99), "insn 0 (TGATHER): sub-op: not a dtype (got 99)"},
      {make_insn(Opcode::kMov, 1, 2, 0, 0, 1), "insn 0 (MOV): sub-op: unused sub-op is not zero (got 1)"},
  };
  for (const Case& c : cases) expect_invalid(verify_code({c.insn}), c.message);
  // TGATHER takes any dtype, quantized included.
  EXPECT_TRUE(verify_code({make_insn(Opcode::kTgather, 0, 0, 1, 2, u8(DType::kQ5_K))}).ok());
}

TEST(VerifierInsn, Flags) {
  expect_invalid(verify_code({make_insn(Opcode::kTbin, 1, 2, 3, 0, 0, 3)}),
                 "insn 0 (TBIN): flags: not kBcastNone, kBcastRow or kBcastCol (got 3)");
  expect_invalid(verify_code({make_insn(Opcode::kTbcast, 1, 2, 0, 0, 0, kBcastNone)}),
                 "insn 0 (TBCAST): flags: not kBcastRow or kBcastCol (got 0)");
  expect_invalid(verify_code({make_insn(Opcode::kTmma, 1, 2, 3, 0, 0, 4)}),
                 "insn 0 (TMMA): flags: bits other than kTransB|kAccumulate (got 4)");
  expect_invalid(verify_code({make_insn(Opcode::kLi, 1, 0, 0, 0, 0, 1)}),
                 "insn 0 (LI): flags: must be zero for this opcode (got 1)");
  EXPECT_TRUE(verify_code({make_insn(Opcode::kTmma, 1, 2, 3, 0, 0, kTransB | kAccumulate)}).ok());
}

TEST(VerifierInsn, UnusedBytesMustBeZero) {
  expect_invalid(verify_code({make_insn(Opcode::kNop, 1)}),
                 "insn 0 (NOP): operand a: unused operand byte is not zero (got 1)");
  Insn with_e = make_insn(Opcode::kTld, 0, 0, 1, kNoReg, u8(DType::kF32));
  with_e.e = 1;
  expect_invalid(verify_code({with_e}), "insn 0 (TLD): operand e: unused operand byte is not zero (got 1)");
  expect_invalid(verify_code({make_insn(Opcode::kMov, 1, 2, 0, 0, 0, 0, 5)}),
                 "insn 0 (MOV): imm: unused immediate is not zero (got 5)");
  expect_invalid(verify_code({make_insn(Opcode::kExit, 0, 0, 3)}),
                 "insn 0 (EXIT): operand c: unused operand byte is not zero");
  // A TDEF shape field superseded by a register must be zero.
  expect_invalid(verify_code({make_insn(Opcode::kTdef, 0, 1, kNoReg, kNoReg, 0, 0, tdef_imm(0, 4, 4))}),
                 "insn 0 (TDEF): imm: rows field set but rows come from a register");
  expect_invalid(verify_code({make_insn(Opcode::kTdef, 0, kNoReg, 1, kNoReg, 0, 0, tdef_imm(0, 4, 4))}),
                 "insn 0 (TDEF): imm: cols field set but cols come from a register");
}

TEST(VerifierInsn, SpecialArgumentIndex) {
  EXPECT_TRUE(verify_code({make_insn(Opcode::kSpecial, 1, 0, 0, 0, u8(Special::kArgValue), 0, 3)}).ok());
  expect_invalid(verify_code({make_insn(Opcode::kSpecial, 1, 0, 0, 0, u8(Special::kArgBytes), 0, 4)}),
                 "insn 0 (SPECIAL): imm: arg index 4 >= num_args 4");
  expect_invalid(verify_code({make_insn(Opcode::kSpecial, 1, 0, 0, 0, u8(Special::kArgValue), 0, 40)}),
                 "insn 0 (SPECIAL): imm: arg index out of range 0..31 (got 40)");
  expect_invalid(verify_code({make_insn(Opcode::kSpecial, 1, 0, 0, 0, u8(Special::kArgValue), 0, -1)}),
                 "imm: arg index out of range 0..31 (got -1)");
  expect_invalid(verify_code({make_insn(Opcode::kSpecial, 1, 0, 0, 0, u8(Special::kBlockId), 0, 1)}),
                 "insn 0 (SPECIAL): imm: must be zero for this Special (got 1)");
}

// ---------------------------------------------------------------------------
// Instructions: memory operands against the signature

TEST(VerifierMemory, ArgumentIndex) {
  expect_invalid(verify_code({make_insn(Opcode::kTld, 0, 5, 1, kNoReg, u8(DType::kF32))}),
                 "insn 0 (TLD): operand b: arg index 5 >= num_args 4");
  expect_invalid(verify_code({make_insn(Opcode::kTst, 0, 4, 1, kNoReg, u8(DType::kF32))}),
                 "insn 0 (TST): operand b: arg index 4 >= num_args 4");
  expect_invalid(verify_code({make_insn(Opcode::kTld, 0, 40, 1, kNoReg, u8(DType::kF32))}),
                 "insn 0 (TLD): operand b: arg index out of range 0..31 (got 40)");
  expect_invalid(verify_code({make_insn(Opcode::kTldq, 0, 3, 1, 2, u8(DType::kQ8_0))}),
                 "insn 0 (TLDQ): operand b: arg 3 \"s\" is a scalar, not a buffer");
}

TEST(VerifierMemory, AccessModes) {
  const uint8_t f32 = u8(DType::kF32);
  expect_invalid(verify_code({make_insn(Opcode::kTst, 0, 0, 1, kNoReg, f32)}),
                 "insn 0 (TST): operand b: store into `in` arg 0 \"x\"");
  expect_invalid(verify_code({make_insn(Opcode::kTst, 0, kConstArg, 1, kNoReg, f32)}),
                 "insn 0 (TST): operand b: store into the constant section (got 255)");
  expect_invalid(verify_code({make_insn(Opcode::kTld, 0, 1, 1, kNoReg, f32)}),
                 "insn 0 (TLD): operand b: load from `out` arg 1 \"y\" (an out argument may not be read)");
  expect_invalid(verify_code({make_insn(Opcode::kTldq, 0, 1, 1, 2, u8(DType::kQ4_K))}),
                 "insn 0 (TLDQ): operand b: load from `out` arg 1 \"y\"");
  expect_invalid(verify_code({make_insn(Opcode::kTgather, 0, 1, 1, 2, f32)}),
                 "insn 0 (TGATHER): operand b: load from `out` arg 1 \"y\"");
  // What is allowed: loads from in/inout/constants, stores to out/inout.
  const Status ok = verify_code({
      make_insn(Opcode::kTld, 0, 0, 1, kNoReg, f32),
      make_insn(Opcode::kTld, 0, 2, 1, kNoReg, f32),
      make_insn(Opcode::kTld, 0, kConstArg, 1, kNoReg, f32),
      make_insn(Opcode::kTldq, 0, kConstArg, 1, 2, u8(DType::kQ4_0)),
      make_insn(Opcode::kTgather, 0, kConstArg, 1, 2, f32),
      make_insn(Opcode::kTst, 0, 1, 1, kNoReg, f32),
      make_insn(Opcode::kTst, 0, 2, 1, kNoReg, f32),
  });
  EXPECT_TRUE(ok.ok()) << ok.to_string();
}

// ---------------------------------------------------------------------------
// Loops

Insn loop(uint8_t count, int64_t end) { return make_insn(Opcode::kLoop, count, 0, 0, 0, 0, 0, end); }
Insn endloop(int64_t start) { return make_insn(Opcode::kEndLoop, 0, 0, 0, 0, 0, 0, start); }
Insn nop() { return make_insn(Opcode::kNop); }

TEST(VerifierLoops, NestedAndEmptyLoopsPass) {
  EXPECT_TRUE(verify_code({loop(1, 1), endloop(0)}).ok());
  const Status s =
      verify_code({loop(1, 5), nop(), loop(2, 4), nop(), endloop(2), endloop(0), loop(1, 7), endloop(6)});
  EXPECT_TRUE(s.ok()) << s.to_string();
}

TEST(VerifierLoops, EndLoopWithoutLoop) {
  expect_invalid(verify_code({nop(), endloop(0)}), "insn 1 (ENDLOOP): no open LOOP to close (imm 0)");
}

TEST(VerifierLoops, LoopNeverClosed) {
  expect_invalid(verify_code({loop(1, 2), nop(), nop()}),
                 "insn 0 (LOOP): loop runs past the end of code (end index 2 never closes it)");
}

TEST(VerifierLoops, LoopTargetPastCodeEnd) {
  expect_invalid(verify_code({loop(1, 10), nop(), endloop(0)}),
                 "insn 0 (LOOP): imm: loop target out of range (got 10)");
  expect_invalid(verify_code({loop(1, 1), endloop(-3)}),
                 "insn 1 (ENDLOOP): imm: loop target out of range (got -3)");
}

TEST(VerifierLoops, LoopTargetNotAfterLoop) {
  expect_invalid(verify_code({nop(), loop(1, 0), endloop(1)}),
                 "insn 1 (LOOP): imm: end index 0 is not after the LOOP");
}

TEST(VerifierLoops, MismatchedTargets) {
  expect_invalid(verify_code({loop(1, 2), nop(), endloop(1)}),
                 "insn 2 (ENDLOOP): imm: start index 1 is not the innermost open LOOP (insn 0)");
  expect_invalid(verify_code({loop(1, 3), nop(), endloop(0), nop()}),
                 "insn 0 (LOOP): imm: end index 3 but the matching ENDLOOP is insn 2");
  // Crossed loops: the inner LOOP must close first.
  expect_invalid(verify_code({loop(1, 3), loop(2, 4), nop(), endloop(0), endloop(1)}),
                 "insn 3 (ENDLOOP): imm: start index 0 is not the innermost open LOOP (insn 1)");
}

TEST(VerifierLoops, DepthLimit) {
  const auto nested = [](int depth) {
    std::vector<Insn> code;
    for (int i = 0; i < depth; ++i) code.push_back(loop(1, 2 * depth - 1 - i));
    for (int i = depth - 1; i >= 0; --i) code.push_back(endloop(i));
    return code;
  };
  const Status ok = verify_code(nested(kMaxLoopDepth));
  EXPECT_TRUE(ok.ok()) << ok.to_string();
  expect_invalid(verify_code(nested(kMaxLoopDepth + 1)), "insn 8 (LOOP): loop nesting depth exceeds 8");
}

// ---------------------------------------------------------------------------
// Local memory

TEST(VerifierLocal, StaticTileBeyondDevice) {
  KernelBuilder b("k");
  b.tdef(Tile{0}, DType::kF32, 16, 32, 0);  // [0, 2048)
  b.exit();
  const std::vector<uint8_t> bytes = b.build_unverified();
  EXPECT_TRUE(verify_image(bytes, 2048).ok());
  expect_error(
      verify_image(bytes, 1024), StatusCode::kResourceExhausted,
      "insn 0 (TDEF): tile at local bytes [0, 2048) exceeds the device's 1024 bytes of local memory");
}

TEST(VerifierLocal, StaticTileBeyondHeaderLocalBytes) {
  KernelBuilder b("k");
  b.tdef(Tile{0}, DType::kBF16, 8, 8, 100);  // [100, 228)
  b.exit();
  auto bytes = with_header(b.build_unverified(), [](ImageHeader& h) { h.local_bytes = 200; });
  expect_invalid(verify_image(bytes, kLocal),
                 "insn 0 (TDEF): tile at local bytes [100, 228) exceeds header local_bytes 200");
}

TEST(VerifierLocal, HeaderLocalBytesBeyondDevice) {
  KernelBuilder b("k");
  b.reserve_local(5000);
  b.exit();
  expect_error(verify_image(b.build_unverified(), 4096), StatusCode::kResourceExhausted,
               "header local_bytes 5000 exceeds the device's 4096 bytes of local memory");
}

TEST(VerifierLocal, ExtentArithmeticDoesNotWrap) {
  // offset 0xFFFFFFFC + 65535 x 65535 x 4 bytes: far beyond 32 bits.
  const Insn huge = make_insn(Opcode::kTdef, 0, kNoReg, kNoReg, kNoReg, u8(DType::kF32), 0,
                              tdef_imm(0xFFFFFFFCu, 65535, 65535));
  std::vector<uint8_t> bytes = image_with({huge});
  expect_error(verify_image(bytes, std::numeric_limits<uint32_t>::max()), StatusCode::kResourceExhausted,
               "tile at local bytes [4294967292, 21474312192)");
}

TEST(VerifierLocal, DynamicTilesAreCheckedByTheCore) {
  // Register shape or offset: no static extent, nothing to check here.
  EXPECT_TRUE(verify_code({make_insn(Opcode::kTdef, 0, kNoReg, kNoReg, 3, u8(DType::kF32), 0,
                                     tdef_imm(0, 60000, 60000))})
                  .ok());
  EXPECT_TRUE(
      verify_code({make_insn(Opcode::kTdef, 0, 1, 2, kNoReg, u8(DType::kF32), 0, tdef_imm(4096, 0, 0))})
          .ok());
}

// ---------------------------------------------------------------------------
// Barrier flag

TEST(VerifierBarrier, FlagMustMatchCode) {
  std::vector<uint8_t> with_barrier = image_with({nop(), make_insn(Opcode::kBarrier)});
  EXPECT_TRUE(verify_image(with_barrier, kLocal).ok());
  auto cleared = with_header(with_barrier, [](ImageHeader& h) { h.flags = 0; });
  expect_invalid(verify_image(cleared, kLocal),
                 "code has a BARRIER (insn 1) but header flag kImageUsesBarrier is not set (flags 0)");
  auto set = with_header(image_with({nop()}), [](ImageHeader& h) { h.flags = kImageUsesBarrier; });
  expect_invalid(verify_image(set, kLocal),
                 "header flag kImageUsesBarrier is set (flags 1) but code has no BARRIER");
}

// ---------------------------------------------------------------------------
// The context-free check a core uses on bytes it cannot trust

TEST(InsnStructure, ValidAndInvalid) {
  EXPECT_EQ(insn_structure_error(make_insn(Opcode::kTld, 0, 0, 1, kNoReg, u8(DType::kF32)), 1), nullptr);
  EXPECT_EQ(insn_structure_error(make_insn(Opcode::kTld, 0, 31, 1, kNoReg, u8(DType::kF32)), 1), nullptr)
      << "arg indices are checked against the signature only by verify_image";
  EXPECT_STREQ(insn_structure_error(make_insn(Opcode::kTld, 0, 32, 1, kNoReg, u8(DType::kF32)), 1),
               "operand b: arg index out of range 0..31");
  EXPECT_STREQ(insn_structure_error(make_insn(Opcode::kTgather, 0, 0, 1, 40, u8(DType::kF32)), 1),
               "operand d: scalar register out of range r0..r31");
  Insn bad;
  bad.op = 99;
  EXPECT_STREQ(insn_structure_error(bad, 1), "unknown opcode");
  EXPECT_STREQ(insn_structure_error(make_insn(Opcode::kTun, 0, 1, 0, 0, 77), 1), "sub-op: not a UnOp");
}

TEST(InsnStructure, LoopTargetsBoundedByCodeSize) {
  EXPECT_EQ(insn_structure_error(loop(0, 5), 6), nullptr);
  EXPECT_STREQ(insn_structure_error(loop(0, 5), 5), "imm: loop target out of range");
  EXPECT_STREQ(insn_structure_error(endloop(-1), 5), "imm: loop target out of range");
  const InsnIssue issue = check_insn_structure(loop(0, 5), 5);
  EXPECT_FALSE(issue.ok());
  EXPECT_EQ(issue.value, 5);
}

TEST(InsnStructure, EveryValidInsnOfTheSamplesPasses) {
  for (const KernelBuilder& b : {copy_kernel(), every_opcode_kernel(), quant_matvec_kernel()}) {
    StatusOr<Image> image = b.build();
    ASSERT_TRUE(image.ok());
    const auto n = static_cast<uint32_t>(image->code().size());
    for (const Insn& insn : image->code()) EXPECT_EQ(insn_structure_error(insn, n), nullptr);
  }
}

// ---------------------------------------------------------------------------
// The bounded reader

TEST(ByteReader, KeepsTheFirstError) {
  const uint8_t data[6] = {1, 2, 3, 4, 5, 6};
  ByteReader r(data);
  EXPECT_EQ(r.read<uint32_t>(2, "word"), 0x06050403u);
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.read<uint32_t>(3, "late word"), 0u);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.read<uint16_t>(std::numeric_limits<uint64_t>::max(), "huge"), 0u);
  EXPECT_TRUE(r.slice(5, 2, "tail").empty());
  expect_invalid(r.status(), "late word: bytes [3, +4) lie outside the 6-byte image");
}

TEST(ByteReader, Slices) {
  const uint8_t data[4] = {9, 8, 7, 6};
  ByteReader r(data);
  const std::span<const uint8_t> s = r.slice(1, 3, "s");
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[2], 6);
  EXPECT_TRUE(r.slice(4, 0, "empty at end").empty());
  EXPECT_TRUE(r.ok());
}

// ---------------------------------------------------------------------------
// Hostile bytes: flip every byte of valid images; never crash, always a clean answer.

TEST(VerifierMutation, EveryByteFlipIsHandled) {
  for (const KernelBuilder& b : {copy_kernel(), every_opcode_kernel(), quant_matvec_kernel()}) {
    const std::vector<uint8_t> valid = b.build_unverified();
    size_t accepted = 0;
    size_t rejected = 0;
    for (size_t pos = 0; pos < valid.size(); ++pos) {
      const uint8_t orig = valid[pos];
      for (const uint8_t value : {uint8_t{0x00}, uint8_t{0xFF}, uint8_t(orig ^ 0x01), uint8_t(orig ^ 0x80),
                                  uint8_t(orig + 1), uint8_t(orig ^ 0x10)}) {
        if (value == orig) continue;
        std::vector<uint8_t> bytes = valid;
        bytes[pos] = value;
        const Status s = verify_image(bytes, kLocal);
        if (s.ok()) {
          ++accepted;
          StatusOr<Image> image = Image::from_bytes(bytes, kLocal);
          ASSERT_TRUE(image.ok()) << "pos " << pos << ": " << image.status().to_string();
          EXPECT_FALSE(disassemble(*image).empty());
          continue;
        }
        ++rejected;
        ASSERT_TRUE(s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kResourceExhausted)
            << "pos " << pos << ": " << s.to_string();
        ASSERT_FALSE(s.message().empty());
      }
    }
    // Both outcomes occur: padding/immediates/constants change freely, fields do not.
    EXPECT_GT(accepted, 0u);
    EXPECT_GT(rejected, accepted / 4);
  }
}

TEST(VerifierMutation, HeaderBytesMatter) {
  // Every byte of magic, version and reserved is checked exactly.
  const std::vector<uint8_t> valid = copy_bytes();
  const size_t checked[] = {0, 1, 2, 3, 4, 5, 56, 57, 58, 59, 60, 61, 62, 63};
  for (size_t pos : checked) {
    std::vector<uint8_t> bytes = valid;
    bytes[pos] ^= 0x40;
    EXPECT_FALSE(verify_image(bytes, kLocal).ok()) << "pos " << pos;
  }
}

// ---------------------------------------------------------------------------
// Register use

constexpr uint32_t bit(int r) { return 1u << r; }

TEST(RegisterUse, NamesTheRegistersEachInstructionReadsAndWrites) {
  KernelBuilder b("k");
  const uint8_t w = b.arg_buffer("w", Access::kIn, DType::kQ8_0);
  b.li(Reg{3}, 7);
  b.alu(AluOp::kAdd, Reg{4}, Reg{5}, Reg{6});
  b.alui(AluOp::kMul, Reg{7}, Reg{7}, 2);
  b.special(Reg{8}, Special::kBlockId);
  b.tget(Reg{9}, Tile{1}, Reg{10});
  b.loop_begin(Reg{11});
  b.loop_end();
  b.tdef(Tile{1}, DType::kF32, Reg{12}, 64, 0);
  b.tmv(Tile{2}, w, Reg{13}, Reg{14}, Tile{1}, DType::kQ8_0);
  b.tfill(Tile{2}, Reg{15});
  b.barrier();
  const std::span<const Insn> code = b.code();
  ASSERT_EQ(code.size(), 11u);
  const auto use = [&](size_t i) { return register_use(code[i]); };
  EXPECT_EQ(use(0).writes, bit(3));
  EXPECT_EQ(use(0).reads, 0u);
  EXPECT_EQ(use(1).writes, bit(4));
  EXPECT_EQ(use(1).reads, bit(5) | bit(6));
  EXPECT_EQ(use(2).writes, bit(7));
  EXPECT_EQ(use(2).reads, bit(7));
  EXPECT_EQ(use(3).writes, bit(8));
  EXPECT_EQ(use(4).writes, bit(9));
  EXPECT_EQ(use(4).reads, bit(10));
  EXPECT_EQ(use(5).reads, bit(11));  // LOOP reads its count, writes nothing
  EXPECT_EQ(use(5).writes, 0u);
  EXPECT_EQ(use(7).reads, bit(12));  // kNoReg operands are not registers
  EXPECT_EQ(use(8).reads, bit(13) | bit(14));
  EXPECT_EQ(use(9).reads, bit(15));
  EXPECT_EQ(use(10).reads | use(10).writes, 0u);
  EXPECT_EQ(register_use(Insn{.op = 0xEE}).reads, 0u);  // not an opcode
}

TEST(RegisterUse, ReadFirstFollowsStraightLineCode) {
  KernelBuilder b("k");
  b.li(Reg{1}, 5);
  b.alu(AluOp::kAdd, Reg{2}, Reg{1}, Reg{3});  // r3 read first, r1 written before
  b.mov(Reg{3}, Reg{2});                       // written now, but already read
  b.alu(AluOp::kAdd, Reg{4}, Reg{4}, Reg{4});  // read and written by one instruction
  EXPECT_EQ(registers_read_first(b.code()), bit(3) | bit(4));
}

TEST(RegisterUse, AWriteInsideALoopCountsOnlyInItsBody) {
  KernelBuilder b("k");
  b.li(Reg{0}, 3);
  b.loop_begin(Reg{0});
  b.alui(AluOp::kAdd, Reg{1}, Reg{2}, 1);  // r2 read before its write below: read first
  b.li(Reg{2}, 1);
  b.li(Reg{5}, 9);
  b.mov(Reg{6}, Reg{5});  // written earlier in this body
  b.loop_begin(Reg{0});
  b.li(Reg{7}, 1);
  b.loop_end();
  b.mov(Reg{8}, Reg{7});  // the inner body may not have run
  b.loop_end();
  b.mov(Reg{9}, Reg{5});   // nor the outer one
  b.mov(Reg{10}, Reg{0});  // written before the loops
  EXPECT_EQ(registers_read_first(b.code()), bit(2) | bit(7) | bit(5));
}

TEST(RegisterUse, KernelsThatSetWhatTheyReadReadNothingFirst) {
  EXPECT_EQ(registers_read_first(copy_kernel().code()), 0u);
  EXPECT_EQ(registers_read_first(quant_matvec_kernel().code()), 0u);
}

}  // namespace
}  // namespace npurt::isa
