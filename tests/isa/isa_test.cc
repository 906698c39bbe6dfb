// Builder -> image -> verifier -> disassembler round trips, dtype/opcode tables,
// and the fuzz seed generator.
#include "npurt/isa/isa.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "isa/sample_kernels.h"
#include "npurt/isa/builder.h"
#include "npurt/isa/disasm.h"
#include "npurt/isa/image.h"
#include "npurt/isa/verifier.h"

namespace npurt::isa {
namespace {

using testing::copy_kernel;
using testing::every_opcode_kernel;
using testing::quant_matvec_kernel;

void expect_error(const Status& s, StatusCode code, const std::string& substring) {
  EXPECT_EQ(s.code(), code) << s.to_string();
  EXPECT_NE(s.message().find(substring), std::string::npos)
      << "message: " << s.message() << "\nexpected: " << substring;
}

ImageHeader header_of(std::span<const uint8_t> bytes) {
  ImageHeader h;
  std::memcpy(&h, bytes.data(), sizeof(h));
  return h;
}

// ---------------------------------------------------------------------------
// dtype and opcode tables

TEST(DType, PlainSizes) {
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kF16), 2u);
  EXPECT_EQ(dtype_size(DType::kI32), 4u);
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
    EXPECT_TRUE(dtype_is_plain(t));
    EXPECT_FALSE(dtype_is_quantized(t));
    EXPECT_EQ(dtype_block_elems(t), 1u);
    EXPECT_EQ(dtype_block_bytes(t), dtype_size(t));
  }
}

TEST(DType, QuantizedBlocksMatchGgml) {
  struct Row {
    DType t;
    size_t elems, bytes;
    const char* name;
  };
  const Row rows[] = {{DType::kQ8_0, 32, 34, "q8_0"},   {DType::kQ4_0, 32, 18, "q4_0"},
                      {DType::kQ5_0, 32, 22, "q5_0"},   {DType::kQ4_K, 256, 144, "q4_K"},
                      {DType::kQ5_K, 256, 176, "q5_K"}, {DType::kQ6_K, 256, 210, "q6_K"}};
  for (const Row& r : rows) {
    EXPECT_TRUE(dtype_is_quantized(r.t)) << r.name;
    EXPECT_FALSE(dtype_is_plain(r.t)) << r.name;
    EXPECT_EQ(dtype_size(r.t), 0u) << r.name;
    EXPECT_EQ(dtype_block_elems(r.t), r.elems) << r.name;
    EXPECT_EQ(dtype_block_bytes(r.t), r.bytes) << r.name;
    EXPECT_EQ(dtype_name(r.t), r.name);
  }
}

TEST(DType, ValidCodesAreExactlyTheEnumerators) {
  const std::set<int> valid = {0, 1, 2, 3, 16, 17, 18, 19, 20, 21};
  for (int code = 0; code < 256; ++code) {
    const bool expected = valid.count(code) != 0;
    EXPECT_EQ(dtype_is_valid(static_cast<uint8_t>(code)), expected) << code;
    const auto t = static_cast<DType>(code);
    // Every valid type is exactly one of plain / quantized; invalid ones neither.
    EXPECT_EQ(dtype_is_plain(t) || dtype_is_quantized(t), expected) << code;
    EXPECT_FALSE(dtype_is_plain(t) && dtype_is_quantized(t)) << code;
    if (!expected) {
      EXPECT_EQ(dtype_name(t), "invalid");
      EXPECT_EQ(dtype_size(t), 0u);
      EXPECT_EQ(dtype_block_bytes(t), 0u);
    }
  }
}

TEST(Opcode, NamesKnownAndUnknown) {
  EXPECT_EQ(opcode_name(static_cast<uint8_t>(Opcode::kTld)), "TLD");
  EXPECT_EQ(opcode_name(static_cast<uint8_t>(Opcode::kEndLoop)), "ENDLOOP");
  EXPECT_EQ(opcode_name(static_cast<uint8_t>(Opcode::kTget)), "TGET");
  EXPECT_EQ(opcode_name(5), "UNKNOWN");
  EXPECT_EQ(opcode_name(static_cast<uint8_t>(Opcode::kOpcodeEnd)), "UNKNOWN");
  EXPECT_EQ(opcode_name(255), "UNKNOWN");
}

TEST(Access, Names) {
  EXPECT_EQ(access_name(Access::kIn), "in");
  EXPECT_EQ(access_name(Access::kOut), "out");
  EXPECT_EQ(access_name(Access::kInOut), "inout");
  EXPECT_EQ(access_name(static_cast<Access>(9)), "invalid");
}

TEST(Tdef, ImmediatePacking) {
  const int64_t imm = tdef_imm(0xDEADBEEF, 0x1234, 0xFEDC);
  EXPECT_EQ(tdef_offset(imm), 0xDEADBEEFu);
  EXPECT_EQ(tdef_rows(imm), 0x1234);
  EXPECT_EQ(tdef_cols(imm), 0xFEDC);
}

// ---------------------------------------------------------------------------
// One instruction at a time: build, verify, disassemble, re-parse.

// Arguments every case can use: 0 x in bf16, 1 y out f32, 2 z inout f32,
// 3 s scalar f32, 4 q in q4_0.
KernelBuilder case_builder() {
  KernelBuilder b("case");
  b.arg_buffer("x", Access::kIn, DType::kBF16);
  b.arg_buffer("y", Access::kOut, DType::kF32);
  b.arg_buffer("z", Access::kInOut, DType::kF32);
  b.arg_scalar("s", DType::kF32);
  b.arg_buffer("q", Access::kIn, DType::kQ4_0);
  return b;
}

struct OpCase {
  const char* label;
  std::function<void(KernelBuilder&)> emit;
  std::vector<std::string> lines;  // expected listing lines, in order
};

std::vector<OpCase> op_cases() {
  const Reg r0{0}, r1{1}, r2{2}, r3{3}, r4{4}, r5{5};
  const Tile t1{1}, t2{2}, t3{3}, t4{4};
  return {
      {"nop", [](KernelBuilder& b) { b.nop(); }, {"0000: nop"}},
      {"exit", [](KernelBuilder& b) { b.exit(); }, {"0000: exit"}},
      {"barrier", [](KernelBuilder& b) { b.barrier(); }, {"0000: barrier"}},
      {"loop",
       [=](KernelBuilder& b) {
         b.li(r1, 3);
         b.loop_begin(r1);
         b.nop();
         b.loop_end();
       },
       {"0000: li r1, 3", "0001: loop r1 -> 0003", "0002:   nop", "0003: endloop -> 0001"}},
      {"li", [=](KernelBuilder& b) { b.li(r3, -42); }, {"0000: li r3, -42"}},
      {"mov", [=](KernelBuilder& b) { b.mov(r1, r2); }, {"0000: mov r1, r2"}},
      {"block_id", [=](KernelBuilder& b) { b.block_id(r0); }, {"0000: special r0, block_id"}},
      {"block_count", [=](KernelBuilder& b) { b.block_count(r1); }, {"0000: special r1, block_count"}},
      {"arg_value", [=](KernelBuilder& b) { b.arg_value(r5, 3); }, {"0000: special r5, arg_value arg3"}},
      {"arg_bytes", [=](KernelBuilder& b) { b.arg_bytes(r5, 0); }, {"0000: special r5, arg_bytes arg0"}},
      {"alu", [=](KernelBuilder& b) { b.alu(AluOp::kSub, r1, r2, r3); }, {"0000: alu.sub r1, r2, r3"}},
      {"alui", [=](KernelBuilder& b) { b.alui(AluOp::kShr, r1, r2, 5); }, {"0000: alui.shr r1, r2, 5"}},
      {"falu", [=](KernelBuilder& b) { b.falu(FaluOp::kMax, r1, r2, r3); }, {"0000: falu.max r1, r2, r3"}},
      {"i2f", [=](KernelBuilder& b) { b.i2f(r1, r2); }, {"0000: i2f r1, r2"}},
      {"f2i", [=](KernelBuilder& b) { b.f2i(r2, r1); }, {"0000: f2i r2, r1"}},
      {"tdef_static",
       [=](KernelBuilder& b) { b.tdef(t2, DType::kBF16, 8, 32, 512); },
       {"0000: tdef t2, bf16, 8 x 32, local 512"}},
      {"tdef_dynamic",
       [=](KernelBuilder& b) { b.tdef(t2, DType::kF16, r4, 32, 64, r5); },
       {"0000: tdef t2, f16, r4 x 32, local 64 + r5"}},
      {"tld",
       [=](KernelBuilder& b) { b.tld(t3, 0, r4, DType::kBF16, r5); },
       {"0000: tld t3, arg0[r4], stride r5, bf16"}},
      {"tld_const",
       [=](KernelBuilder& b) { b.tld(t3, kConstArg, r4, DType::kF32); },
       {"0000: tld t3, const[r4], f32"}},
      {"tst", [=](KernelBuilder& b) { b.tst(t3, 1, r4, DType::kF32); }, {"0000: tst t3, arg1[r4], f32"}},
      {"tst_inout",
       [=](KernelBuilder& b) { b.tst(t3, 2, r4, DType::kF16, r1); },
       {"0000: tst t3, arg2[r4], stride r1, f16"}},
      {"tldq",
       [=](KernelBuilder& b) { b.tldq(t3, 4, r4, r5, DType::kQ4_0); },
       {"0000: tldq t3, arg4[r4], stride_bytes r5, q4_0"}},
      {"tgather",
       [=](KernelBuilder& b) { b.tgather(t3, 0, t4, r5, DType::kBF16); },
       {"0000: tgather t3, arg0[t4], pitch_bytes r5, bf16"}},
      {"tfill", [=](KernelBuilder& b) { b.tfill(t1, r2); }, {"0000: tfill t1, r2"}},
      {"tcvt", [=](KernelBuilder& b) { b.tcvt(t1, t2); }, {"0000: tcvt t1, t2"}},
      {"tbin",
       [=](KernelBuilder& b) { b.tbin(BinOp::kDiv, t1, t2, t3, kBcastRow); },
       {"0000: tbin.div t1, t2, t3, bcast_row"}},
      {"tbin_plain",
       [=](KernelBuilder& b) { b.tbin(BinOp::kMin, t1, t2, t3); },
       {"0000: tbin.min t1, t2, t3"}},
      {"tun", [=](KernelBuilder& b) { b.tun(UnOp::kGeluTanh, t1, t2); }, {"0000: tun.gelu_tanh t1, t2"}},
      {"tsop", [=](KernelBuilder& b) { b.tsop(BinOp::kMax, t1, t2, r3); }, {"0000: tsop.max t1, t2, r3"}},
      {"tred", [=](KernelBuilder& b) { b.tred(RedOp::kArgmax, t1, t2); }, {"0000: tred.argmax t1, t2"}},
      {"tbcast_row", [=](KernelBuilder& b) { b.tbcast(t1, t2, kBcastRow); }, {"0000: tbcast t1, t2, row"}},
      {"tbcast_col", [=](KernelBuilder& b) { b.tbcast(t1, t2, kBcastCol); }, {"0000: tbcast t1, t2, col"}},
      {"tmma", [=](KernelBuilder& b) { b.tmma(t1, t2, t3, kTransB); }, {"0000: tmma t1, t2, t3, trans_b"}},
      {"tmma_acc",
       [=](KernelBuilder& b) { b.tmma(t1, t2, t3, kTransB | kAccumulate); },
       {"0000: tmma t1, t2, t3, trans_b, accumulate"}},
      {"tget", [=](KernelBuilder& b) { b.tget(r1, t2, r3); }, {"0000: tget r1, t2[r3]"}},
      {"tmv", [=](KernelBuilder& b) { b.tmv(t1, 4, r2, r3, t4, DType::kQ4_0); },
       {"0000: tmv t1, arg4[r2], stride_bytes r3, t4, q4_0"}},
      {"tmv_acc", [=](KernelBuilder& b) { b.tmv(t1, 0, r2, r3, t4, DType::kBF16, true); },
       {"0000: tmv t1, arg0[r2], stride_bytes r3, t4, bf16, accumulate"}},
  };
}

TEST(RoundTrip, EveryInstruction) {
  for (const OpCase& c : op_cases()) {
    SCOPED_TRACE(c.label);
    KernelBuilder b = case_builder();
    c.emit(b);
    StatusOr<Image> image = b.build();
    ASSERT_TRUE(image.ok()) << image.status().to_string();
    ASSERT_TRUE(verify_image(image->bytes(), 1u << 20).ok());

    const std::string text = disassemble(*image);
    size_t pos = 0;
    for (const std::string& line : c.lines) {
      const size_t found = text.find("  " + line + "\n", pos);
      ASSERT_NE(found, std::string::npos) << "missing line '" << line << "' in\n" << text;
      pos = found + line.size();
    }

    // Re-parse the bytes: the same image, the same listing.
    std::vector<uint8_t> bytes(image->bytes().begin(), image->bytes().end());
    StatusOr<Image> again = Image::from_bytes(bytes);
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    EXPECT_EQ(again->name(), "case");
    ASSERT_EQ(again->args().size(), 5u);
    EXPECT_EQ(again->args()[3].name, "s");
    EXPECT_EQ(again->args()[3].kind, ArgKind::kScalar);
    EXPECT_EQ(again->args()[4].dtype, DType::kQ4_0);
    EXPECT_EQ(again->code().size(), image->code().size());
    EXPECT_EQ(0, std::memcmp(again->code().data(), image->code().data(), image->code().size_bytes()));
    EXPECT_EQ(disassemble(*again), text);
    StatusOr<std::string> from_bytes = disassemble_bytes(bytes);
    ASSERT_TRUE(from_bytes.ok());
    EXPECT_EQ(*from_bytes, text);
  }
}

TEST(RoundTrip, CasesCoverEveryOpcode) {
  std::set<uint8_t> seen;
  for (const OpCase& c : op_cases()) {
    KernelBuilder b = case_builder();
    c.emit(b);
    StatusOr<Image> image = b.build();
    ASSERT_TRUE(image.ok()) << c.label;
    for (const Insn& insn : image->code()) seen.insert(insn.op);
  }
  for (int op = 0; op < 256; ++op) {
    if (opcode_name(static_cast<uint8_t>(op)) == "UNKNOWN") continue;
    EXPECT_TRUE(seen.count(static_cast<uint8_t>(op)))
        << "no round-trip case for " << opcode_name(static_cast<uint8_t>(op));
  }
}

TEST(RoundTrip, SampleKernelsVerifyAndReparse) {
  for (KernelBuilder b : {copy_kernel(), every_opcode_kernel(), quant_matvec_kernel()}) {
    StatusOr<Image> image = b.build();
    ASSERT_TRUE(image.ok()) << image.status().to_string();
    std::vector<uint8_t> bytes(image->bytes().begin(), image->bytes().end());
    EXPECT_EQ(bytes, b.build_unverified());
    StatusOr<Image> again = Image::from_bytes(bytes);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(disassemble(*again), disassemble(*image));
  }
}

TEST(Disasm, CopyKernelListingIsStable) {
  StatusOr<Image> image = copy_kernel().build();
  ASSERT_TRUE(image.ok()) << image.status().to_string();
  const char* expected =
      "kernel \"copy\": 3 args, 10 insns, local 2048 B, constants 0 B\n"
      "  arg0 x: in buffer bf16\n"
      "  arg1 y: out buffer bf16\n"
      "  arg2 n: in scalar i32\n"
      "  0000: special r0, block_id\n"
      "  0001: alui.mul r1, r0, 2048\n"
      "  0002: li r2, 64\n"
      "  0003: special r3, arg_value arg2\n"
      "  0004: tdef t0, bf16, 16 x 64, local 0\n"
      "  0005: loop r3 -> 0008\n"
      "  0006:   tld t0, arg0[r1], stride r2, bf16\n"
      "  0007:   tst t0, arg1[r1], stride r2, bf16\n"
      "  0008: endloop -> 0005\n"
      "  0009: exit\n";
  EXPECT_EQ(disassemble(*image), expected);
}

TEST(Disasm, NestedLoopsIndentAndBarrierIsInHeader) {
  StatusOr<Image> image = every_opcode_kernel().build();
  ASSERT_TRUE(image.ok()) << image.status().to_string();
  const std::string text = disassemble(*image);
  EXPECT_NE(text.find("kernel \"every_opcode\": 5 args, "), std::string::npos) << text;
  EXPECT_NE(text.find(", local 49152 B, constants 16 B, barrier\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  arg3 acc: inout buffer f32\n"), std::string::npos);
  EXPECT_NE(text.find("  arg4 alpha: in scalar f32\n"), std::string::npos);
  EXPECT_NE(text.find(":   tld t0, const[r4], f32\n"), std::string::npos) << text;
  EXPECT_NE(text.find(":     tst t0, arg2[r0], f32\n"), std::string::npos) << text;
  EXPECT_NE(text.find(":   endloop -> "), std::string::npos) << text;
}

TEST(Disasm, EscapesNames) {
  KernelBuilder b("bad\nname\"");
  b.arg_buffer("a\\b", Access::kIn, DType::kF32);
  b.exit();
  StatusOr<Image> image = b.build();
  ASSERT_TRUE(image.ok());
  const std::string text = disassemble(*image);
  EXPECT_NE(text.find("kernel \"bad\\x0aname\\x22\""), std::string::npos) << text;
  EXPECT_NE(text.find("arg0 a\\x5cb: in buffer f32"), std::string::npos) << text;
}

TEST(Disasm, BytesAreVerifiedFirst) {
  std::vector<uint8_t> bytes = copy_kernel().build_unverified();
  bytes[0] ^= 0xFF;
  StatusOr<std::string> text = disassemble_bytes(bytes);
  ASSERT_FALSE(text.ok());
  expect_error(text.status(), StatusCode::kInvalidArgument, "magic");
}

TEST(Disasm, BytesIgnoreTheDeviceLocalLimit) {
  KernelBuilder b("big");
  b.reserve_local(64u << 20);
  b.exit();
  const std::vector<uint8_t> bytes = b.build_unverified();
  expect_error(verify_image(bytes, 1u << 20), StatusCode::kResourceExhausted, "local_bytes 67108864");
  StatusOr<std::string> text = disassemble_bytes(bytes);
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  EXPECT_NE(text->find("local 67108864 B"), std::string::npos);
}

// ---------------------------------------------------------------------------
// Builder layout and bookkeeping

TEST(Builder, LayoutFollowsTheImageFormat) {
  KernelBuilder b = every_opcode_kernel();
  StatusOr<Image> image = b.build();
  ASSERT_TRUE(image.ok()) << image.status().to_string();
  const ImageHeader h = header_of(image->bytes());
  EXPECT_EQ(h.magic, kImageMagic);
  EXPECT_EQ(h.version, kImageVersion);
  EXPECT_EQ(h.flags, kImageUsesBarrier);
  EXPECT_EQ(h.total_bytes, image->bytes().size());
  EXPECT_EQ(h.args_offset, sizeof(ImageHeader));
  EXPECT_EQ(h.num_args, 5u);
  EXPECT_EQ(h.strings_offset, sizeof(ImageHeader) + 5 * sizeof(ArgRecord));
  EXPECT_EQ(h.strings_bytes, std::string("every_opcode"
                                         "x"
                                         "w"
                                         "y"
                                         "acc"
                                         "alpha")
                                 .size());
  EXPECT_EQ(h.code_offset % 16, 0u);
  EXPECT_GE(h.code_offset, h.strings_offset + h.strings_bytes);
  EXPECT_EQ(h.code_bytes, image->code().size() * kInsnBytes);
  EXPECT_EQ(h.const_offset % 16, 0u);
  EXPECT_EQ(h.const_bytes, 16u);
  EXPECT_EQ(h.reserved[0], 0u);
  EXPECT_EQ(h.reserved[1], 0u);
  // Largest static tile: t6, 64 x 64 f32 at 32768.
  EXPECT_EQ(h.local_bytes, 32768u + 64 * 64 * 4);
  EXPECT_EQ(image->layout().local_bytes, h.local_bytes);
  EXPECT_TRUE(image->uses_barrier());
}

TEST(Builder, ConstantsAreAlignedAndReadable) {
  KernelBuilder b("consts");
  const uint8_t three[3] = {1, 2, 3};
  const uint8_t two[2] = {7, 8};
  EXPECT_EQ(b.add_constants(three), 0u);
  EXPECT_EQ(b.add_constants(two), 16u);
  const float f[1] = {1.5f};
  EXPECT_EQ(b.add_constant_values(std::span<const float>(f)), 32u);
  b.exit();
  StatusOr<Image> image = b.build();
  ASSERT_TRUE(image.ok());
  const std::span<const uint8_t> c = image->constants();
  ASSERT_EQ(c.size(), 36u);
  EXPECT_EQ(c[0], 1);
  EXPECT_EQ(c[2], 3);
  EXPECT_EQ(c[3], 0);  // padding is zero
  EXPECT_EQ(c[16], 7);
  EXPECT_EQ(c[17], 8);
  float back = 0;
  std::memcpy(&back, c.data() + 32, 4);
  EXPECT_EQ(back, 1.5f);
  EXPECT_EQ(image->layout().const_offset % 16, 0u);
}

TEST(Builder, LocalBytesCoverStaticTilesAndReservations) {
  KernelBuilder b("local");
  b.tdef(Tile{0}, DType::kF16, 10, 10, 1000);           // ends at 1200
  b.tdef(Tile{1}, DType::kF32, 4, 4, 100);              // ends at 164
  b.tdef(Tile{2}, DType::kF32, 1000, 1000, 0, Reg{1});  // offset register: not static
  b.exit();
  StatusOr<Image> image = b.build();
  ASSERT_TRUE(image.ok()) << image.status().to_string();
  EXPECT_EQ(image->layout().local_bytes, 1200u);

  b.reserve_local(5000);
  image = b.build();
  ASSERT_TRUE(image.ok());
  EXPECT_EQ(image->layout().local_bytes, 5000u);
  EXPECT_FALSE(image->uses_barrier());
}

TEST(Builder, CodeIsWhatWasEmitted) {
  KernelBuilder b("raw");
  Insn insn;
  insn.op = static_cast<uint8_t>(Opcode::kLi);
  insn.a = 7;
  insn.imm = -123456789012345;
  EXPECT_EQ(b.emit(insn), 0u);
  EXPECT_EQ(b.num_insns(), 1u);
  b.exit();
  StatusOr<Image> image = b.build();
  ASSERT_TRUE(image.ok());
  ASSERT_EQ(image->code().size(), 2u);
  EXPECT_EQ(image->code()[0].a, 7);
  EXPECT_EQ(image->code()[0].imm, -123456789012345);
  EXPECT_EQ(image->code()[1].op, static_cast<uint8_t>(Opcode::kExit));
}

TEST(Builder, ImageCopiesOwnTheirBytes) {
  StatusOr<Image> image = copy_kernel().build();
  ASSERT_TRUE(image.ok());
  const Image copy = *image;
  EXPECT_NE(copy.bytes().data(), image->bytes().data());
  EXPECT_EQ(disassemble(copy), disassemble(*image));
  const Image moved = std::move(*image);
  EXPECT_EQ(disassemble(moved), disassemble(copy));
}

TEST(BuilderErrors, LoopEndWithoutBegin) {
  KernelBuilder b("k");
  b.nop();
  b.loop_end();
  b.exit();
  StatusOr<Image> image = b.build();
  ASSERT_FALSE(image.ok());
  expect_error(image.status(), StatusCode::kInvalidArgument,
               "kernel \"k\": loop_end() at insn 1 without a loop_begin()");
}

TEST(BuilderErrors, UnclosedLoop) {
  KernelBuilder b("k");
  b.li(Reg{0}, 2);
  b.loop_begin(Reg{0});
  b.nop();
  StatusOr<Image> image = b.build();
  ASSERT_FALSE(image.ok());
  expect_error(image.status(), StatusCode::kInvalidArgument, "loop_begin() at insn 1 has no loop_end()");
  // The raw bytes exist and the verifier rejects the open loop on its own.
  expect_error(verify_image(b.build_unverified(), 1u << 20), StatusCode::kInvalidArgument,
               "insn 1 (LOOP): imm: loop target out of range (got -1)");
}

TEST(BuilderErrors, DimensionsMustFitTheEncoding) {
  KernelBuilder b("k");
  b.tdef(Tile{0}, DType::kF32, 70000, 1);
  b.exit();
  StatusOr<Image> image = b.build();
  ASSERT_FALSE(image.ok());
  expect_error(image.status(), StatusCode::kInvalidArgument, "tdef at insn 0: shape 70000 x 1 does not fit");

  KernelBuilder neg("k");
  neg.tdef(Tile{0}, DType::kF32, 1, -1);
  neg.exit();
  expect_error(neg.build().status(), StatusCode::kInvalidArgument, "shape 1 x -1 does not fit");
}

TEST(BuilderErrors, TooManyArguments) {
  KernelBuilder b("k");
  for (int i = 0; i <= kMaxArgs; ++i) b.arg_buffer("a" + std::to_string(i), Access::kIn, DType::kF32);
  b.exit();
  expect_error(b.build().status(), StatusCode::kInvalidArgument, "more than 32 arguments (adding \"a32\")");
}

TEST(BuilderErrors, EmptyKernel) {
  KernelBuilder b("empty");
  expect_error(b.build().status(), StatusCode::kInvalidArgument,
               "code_bytes 0 is not a non-zero multiple of 16");
}

TEST(BuilderErrors, MisuseIsReportedByTheVerifier) {
  KernelBuilder b("k");
  const uint8_t x = b.arg_buffer("x", Access::kIn, DType::kF32);
  b.tst(Tile{0}, x, Reg{0}, DType::kF32);
  expect_error(b.build().status(), StatusCode::kInvalidArgument,
               "kernel \"k\": insn 0 (TST): operand b: store into `in` arg 0 \"x\"");

  KernelBuilder r("k");
  r.mov(Reg{32}, Reg{0});
  expect_error(r.build().status(), StatusCode::kInvalidArgument,
               "insn 0 (MOV): operand a: scalar register out of range r0..r31 (got 32)");

  KernelBuilder s("k");
  s.arg_scalar("s", DType::kBF16);
  s.exit();
  expect_error(s.build().status(), StatusCode::kInvalidArgument,
               "arg 0: scalar dtype bf16 is not f32 or i32");
}

TEST(BuilderErrors, TileLargerThanLocalMemory) {
  KernelBuilder b("k");
  b.tdef(Tile{0}, DType::kF32, 64, 64);  // 16 KiB
  b.exit();
  ASSERT_TRUE(b.build(16384).ok());
  expect_error(
      b.build(16383).status(), StatusCode::kResourceExhausted,
      "insn 0 (TDEF): tile at local bytes [0, 16384) exceeds the device's 16383 bytes of local memory");
}

// ---------------------------------------------------------------------------
// Fuzz seeds: the sample kernels' bytes, committed under fuzz/seeds/verifier/.
// NPURT_WRITE_SEEDS=<dir> rewrites them; otherwise the committed copies must match.

struct Seed {
  const char* file;
  std::vector<uint8_t> bytes;
};

std::vector<Seed> seeds() {
  return {{"copy.img", copy_kernel().build_unverified()},
          {"every_opcode.img", every_opcode_kernel().build_unverified()},
          {"q8_matvec.img", quant_matvec_kernel().build_unverified()}};
}

TEST(FuzzSeeds, AreValidAndCommitted) {
  const char* out_dir = std::getenv("NPURT_WRITE_SEEDS");
  for (const Seed& seed : seeds()) {
    SCOPED_TRACE(seed.file);
    ASSERT_TRUE(verify_image(seed.bytes, 1u << 20).ok());
    if (out_dir != nullptr) {
      std::ofstream out(std::string(out_dir) + "/" + seed.file, std::ios::binary);
      out.write(reinterpret_cast<const char*>(seed.bytes.data()),
                static_cast<std::streamsize>(seed.bytes.size()));
      ASSERT_TRUE(out.good());
      continue;
    }
    std::ifstream in(std::string(NPURT_SOURCE_DIR) + "/fuzz/seeds/verifier/" + seed.file, std::ios::binary);
    ASSERT_TRUE(in.good()) << "seed missing; regenerate with NPURT_WRITE_SEEDS=fuzz/seeds/verifier";
    const std::vector<uint8_t> committed((std::istreambuf_iterator<char>(in)),
                                         std::istreambuf_iterator<char>());
    EXPECT_EQ(committed, seed.bytes)
        << "seed is stale; regenerate with NPURT_WRITE_SEEDS=fuzz/seeds/verifier";
  }
}

}  // namespace
}  // namespace npurt::isa
