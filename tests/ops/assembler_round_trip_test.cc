// Every library operator's kernel, listed by the disassembler and assembled again,
// gives the same image bytes: over each operator class, several shapes and dtypes,
// and targets of different core counts and local memory.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "npurt/isa/assembler.h"
#include "npurt/isa/disasm.h"
#include "npurt/ops/argmax.h"
#include "npurt/ops/attention.h"
#include "npurt/ops/copy.h"
#include "npurt/ops/elementwise.h"
#include "npurt/ops/embedding.h"
#include "npurt/ops/gemm.h"
#include "npurt/ops/gemv.h"
#include "npurt/ops/image_operator.h"
#include "npurt/ops/paged_attention.h"
#include "npurt/ops/prefill_attention.h"
#include "npurt/ops/rmsnorm.h"
#include "npurt/ops/rope.h"
#include "npurt/ops/softmax.h"
#include "npurt/ops/weight_gemm.h"

namespace npurt::ops {
namespace {

using isa::DType;

const DType kAllWeights[] = {DType::kF32,  DType::kBF16, DType::kF16,  DType::kQ8_0, DType::kQ4_0,
                             DType::kQ5_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};
const DType kKvTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

// The targets every operator is compiled for: the default, a small device with
// little local memory, and a wide one.
const Target kTargets[] = {{8, 256u << 10}, {1, 64u << 10}, {3, 128u << 10}, {64, 1u << 20}};

std::vector<std::shared_ptr<Operator>> operators() {
  std::vector<std::shared_ptr<Operator>> v;
  const auto add = [&v](auto op) { v.push_back(std::make_shared<decltype(op)>(std::move(op))); };

  add(Argmax({.n = 1}));
  add(Argmax({.n = 1000, .chunk = 7}));
  add(Argmax({.n = 262144 + 13, .chunk = 1000}));
  add(Argmax({.n = 5000, .with_value = true, .index_base = 100}));
  add(Argmax({.n = 4096, .vectors = 8, .vectors_runtime = true}));

  for (DType kv : kKvTypes) {
    add(DecodeAttention({.n_heads = 4, .n_kv_heads = 1, .head_dim = 256, .max_len = 1024, .kv_dtype = kv}));
    add(DecodeAttention({.n_heads = 2, .n_kv_heads = 2, .head_dim = 64, .max_len = 100, .window = 30,
                         .kv_dtype = kv, .tile_t = 7}));
  }
  add(DecodeAttention({.n_heads = 8, .n_kv_heads = 2, .head_dim = 33, .max_len = 50, .kv_dtype = DType::kF16,
                       .tile_t = 9, .cores = 4}));
  add(DecodeAttention({.n_heads = 4, .n_kv_heads = 1, .head_dim = 64, .max_len = 32, .queries = 4,
                       .queries_runtime = true}));
  add(DecodeAttention({.n_heads = 4, .n_kv_heads = 1, .head_dim = 64, .max_len = 512, .split_positions = true}));

  add(Copy({.n = 1}));
  add(Copy({.n = 4097, .src_dtype = DType::kF32, .dst_dtype = DType::kBF16, .tile = 512, .cores = 3}));
  add(Copy({.n = 333, .src_dtype = DType::kF16, .dst_dtype = DType::kBF16}));
  add(StridedCopy({.rows = 512, .cols = 256, .dst_rows = 1100, .dst_row_runtime = true, .rows_runtime = true}));
  add(StridedCopy({.rows = 1, .cols = 640, .src_rows = 512, .src_row_runtime = true}));
  add(StridedCopy({.rows = 10, .cols = 33, .src_stride = 40, .dst_stride = 50, .src_dtype = DType::kBF16}));
  add(StridedCopy({.rows = 16, .cols = 64, .dst_rows = 100, .dst_row_index = true}));
  // Transposes carry an identity matrix in their constants.
  add(Transpose({.rows = 5, .cols = 7}));
  add(Transpose({.rows = 64, .cols = 640, .dtype = DType::kBF16}));
  add(Transpose({.rows = 33, .cols = 129, .dtype = DType::kF16, .tile_rows = 32, .tile_cols = 64, .cores = 3}));

  for (ElementwiseKind kind : {ElementwiseKind::kAdd, ElementwiseKind::kMul, ElementwiseKind::kGeluTanh,
                               ElementwiseKind::kSilu, ElementwiseKind::kGeluTanhMul}) {
    add(Elementwise({.kind = kind, .n = 1000}));
    add(Elementwise({.kind = kind, .n = 65536 + 3, .dtype = DType::kBF16, .tile = 512, .cores = 3}));
  }
  add(Elementwise({.kind = ElementwiseKind::kGeluTanhMul, .n = 512 * 2048, .row_elems = 2048}));

  for (DType t : kAllWeights) {
    const uint32_t dim = isa::dtype_is_quantized(t) ? 512 : 640;
    add(Embedding({.vocab = 1000, .dim = dim, .dtype = t, .scale = 2.0f}));
    add(Embedding({.vocab = 1000, .dim = dim, .dtype = t, .scale = 22.6f, .tokens = 64}));
  }
  add(Embedding({.vocab = 4, .dim = 256, .dtype = DType::kQ4_K, .shard = true, .first_row = 8}));

  for (DType in : {DType::kF32, DType::kBF16}) {
    for (GemmBLayout layout : {GemmBLayout::kRowMajor, GemmBLayout::kColMajor}) {
      add(Gemm({.m = 17, .n = 33, .k = 65, .dtype = in, .out_dtype = DType::kBF16, .b_layout = layout}));
      add(Gemm({.m = 128, .n = 256, .k = 640, .dtype = in, .b_layout = layout}));
    }
  }

  for (DType t : kAllWeights) {
    add(Gemv({.m = 1024, .k = 2048, .weight = t}));
    add(Gemv({.m = 77, .k = 1024, .weight = t, .rows_per_tile = 5, .cores = 3}));
    add(Gemv({.m = 256, .k = 512, .weight = t, .batch = 4}));
  }
  add(Gemv({.m = 2048, .k = 640, .weight = DType::kQ5_0, .epilogue = GemvEpilogue::kGeluTanh}));
  add(Gemv({.m = 2048, .k = 640, .weight = DType::kBF16, .epilogue = GemvEpilogue::kSilu}));
  add(Gemv({.m = 640, .k = 640, .weight = DType::kQ8_0, .batch = 16, .batch_runtime = true}));

  add(PagedDecodeAttention({.n_heads = 4, .n_kv_heads = 1, .head_dim = 256, .block_positions = 16, .blocks = 80,
                            .max_blocks = 16, .sequences = 4}));
  add(PagedDecodeAttention({.n_heads = 8, .n_kv_heads = 2, .head_dim = 64, .block_positions = 5, .blocks = 60,
                            .max_blocks = 12, .sequences = 4, .window = 13, .kv_dtype = DType::kF16}));
  add(PagedDecodeAttention({.n_heads = 4, .n_kv_heads = 4, .head_dim = 32, .block_positions = 7, .blocks = 40,
                            .max_blocks = 8, .sequences = 5, .scale = 0.3f, .kv_dtype = DType::kBF16,
                            .cores = 3}));

  // Prefill attention carries its causal masks in its constants.
  for (DType kv : kKvTypes) {
    add(PrefillAttention({.n_heads = 4, .n_kv_heads = 1, .head_dim = 256, .max_len = 1100, .tokens = 512,
                          .kv_dtype = kv}));
  }
  add(PrefillAttention(
      {.n_heads = 4, .n_kv_heads = 1, .head_dim = 256, .max_len = 1100, .tokens = 512, .window = 512}));
  add(PrefillAttention({.n_heads = 8, .n_kv_heads = 2, .head_dim = 64, .max_len = 300, .tokens = 64, .window = 8}));

  add(RmsNorm({.rows = 1, .dim = 640}));
  add(RmsNorm({.rows = 1000, .dim = 64, .weighted = false, .rows_per_tile = 16, .cores = 3}));
  add(RmsNorm({.rows = 9, .dim = 640, .dtype = DType::kBF16, .rows_per_tile = 2, .cores = 3}));
  add(RmsNorm({.rows = 512, .dim = 640, .rows_runtime = true}));

  // Rope carries its frequency exponents (and, batched, row-to-token maps) in its
  // constants.
  add(Rope({.n_heads = 4, .head_dim = 256}));
  add(Rope({.n_heads = 7, .head_dim = 64, .rotary_dim = 48, .heads_per_tile = 2, .cores = 3}));
  add(Rope({.n_heads = 4, .head_dim = 256, .tokens = 512}));
  add(Rope({.n_heads = 1, .head_dim = 256, .cores = 3, .tokens = 11, .positions = true}));

  add(Softmax({.rows = 1, .cols = 1}));
  add(Softmax({.rows = 7, .cols = 333, .rows_per_tile = 2, .cores = 3}));
  add(Softmax({.rows = 12, .cols = 20, .causal = true, .window = 4}));
  add(Softmax({.rows = 6, .cols = 9, .causal = true, .offset = -3, .rows_per_tile = 2, .cores = 3}));
  add(Softmax({.rows = 1, .cols = 32768}));

  for (DType t : kAllWeights) {
    const uint64_t k = isa::dtype_block_elems(t) == 256 ? 2048 : 640;
    add(WeightGemm({.m = 100, .k = k, .rows = 512, .weight = t}));
    add(WeightGemm({.m = 64, .k = k, .rows = 7, .weight = t, .rows_runtime = true}));
  }
  return v;
}

std::vector<uint8_t> bytes_of(const isa::Image& image) { return {image.bytes().begin(), image.bytes().end()}; }

// Compiles `op` for `target` and checks the round trip; returns the image for the
// coverage counts (nullopt when the operator does not fit the target).
std::optional<isa::Image> check_round_trip(const Operator& op, const Target& target) {
  StatusOr<Kernel> kernel = op.compile(target);
  if (!kernel.ok()) return std::nullopt;
  const std::string text = isa::disassemble(kernel->image);
  StatusOr<isa::Image> back = isa::assemble(text, target.local_bytes);
  EXPECT_TRUE(back.ok()) << op.name() << ": " << back.status().to_string();
  if (!back.ok()) return std::nullopt;
  EXPECT_EQ(bytes_of(*back), bytes_of(kernel->image)) << op.name() << "\n" << text;
  EXPECT_EQ(isa::disassemble(*back), text) << op.name();
  return kernel->image;
}

TEST(AssemblerRoundTrip, EveryOperatorImage) {
  size_t images = 0, with_constants = 0;
  std::set<std::string> kinds_with_constants;
  std::set<uint8_t> opcodes;
  for (const std::shared_ptr<Operator>& op : operators()) {
    ASSERT_TRUE(op->validate().ok()) << op->name() << ": " << op->validate().to_string();
    bool compiled = false;
    for (const Target& target : kTargets) {
      SCOPED_TRACE(op->name() + " on " + std::to_string(target.cores) + " cores, " +
                   std::to_string(target.local_bytes) + " B local");
      const std::optional<isa::Image> image = check_round_trip(*op, target);
      if (!image) continue;
      compiled = true;
      ++images;
      for (const isa::Insn& insn : image->code()) opcodes.insert(insn.op);
      if (image->constants().empty()) continue;
      ++with_constants;
      kinds_with_constants.insert(op->name().substr(0, op->name().find(' ')));
    }
    // Every case fits the default target at least.
    EXPECT_TRUE(compiled) << op->name() << ": " << op->compile().status().to_string();
  }
  RecordProperty("images", std::to_string(images));
  EXPECT_GT(images, 300u);
  EXPECT_GT(with_constants, 20u);
  // The operators known to carry constants did, so the constant lines were exercised.
  for (const char* kind : {"rope", "transpose", "prefill_attention"}) {
    EXPECT_TRUE(kinds_with_constants.count(kind)) << kind << " had no constants; with constants: "
                                                  << ::testing::PrintToString(kinds_with_constants);
  }
  // Library code reaches most of the instruction set; what it misses, the ISA tests cover.
  EXPECT_GE(opcodes.size(), 20u);
}

// An image made outside the library (here: assembled text) compiled through
// ImageOperator comes back with its own bytes, and its listing round-trips.
TEST(AssemblerRoundTrip, ImageOperator) {
  const char* text =
      "kernel \"double\": 2 args, 6 insns, local 256 B, constants 0 B\n"
      "  arg0 x: in buffer f32\n"
      "  arg1 y: out buffer f32\n"
      "  0000: li r0, 0\n"
      "  0001: tdef t0, f32, 1 x 64, local 0\n"
      "  0002: tld t0, arg0[r0], f32\n"
      "  0003: tbin.add t0, t0, t0\n"
      "  0004: tst t0, arg1[r0], f32\n"
      "  0005: exit\n";
  StatusOr<isa::Image> image = isa::assemble(text);
  ASSERT_TRUE(image.ok()) << image.status().to_string();
  ImageOperator op({.image = *image, .grid = 1, .elements = {{"x", 64}, {"y", 64}}, .reference = {}});
  const std::optional<isa::Image> compiled = check_round_trip(op, Target{});
  ASSERT_TRUE(compiled.has_value()) << op.compile().status().to_string();
  EXPECT_EQ(bytes_of(*compiled), bytes_of(*image));
  EXPECT_EQ(isa::disassemble(*compiled), text);
}

// Listings of a few small operators are seeds of fuzz/fuzz_assembler.cc:
// NPURT_WRITE_ASM_SEEDS=<dir> writes them (the ISA test checks the committed ones
// assemble).
TEST(AssemblerRoundTrip, FuzzSeedOperators) {
  const char* out_dir = std::getenv("NPURT_WRITE_ASM_SEEDS");
  const std::vector<std::pair<std::string, std::shared_ptr<Operator>>> seeds = {
      {"rope.s", std::make_shared<Rope>(RopeParams{.n_heads = 2, .head_dim = 64, .cores = 2, .tokens = 4})},
      {"transpose.s", std::make_shared<Transpose>(TransposeParams{.rows = 8, .cols = 8, .cores = 1})},
      {"gemv_q4_k.s", std::make_shared<Gemv>(GemvParams{.m = 16, .k = 256, .weight = DType::kQ4_K, .cores = 2})},
      {"softmax_causal.s",
       std::make_shared<Softmax>(SoftmaxParams{.rows = 4, .cols = 8, .causal = true, .cores = 2})},
  };
  for (const auto& [file, op] : seeds) {
    SCOPED_TRACE(file);
    const std::optional<isa::Image> image = check_round_trip(*op, Target{});
    ASSERT_TRUE(image.has_value()) << op->compile().status().to_string();
    if (out_dir == nullptr) continue;
    std::ofstream out(std::string(out_dir) + "/" + file, std::ios::binary);
    out << isa::disassemble(*image);
    ASSERT_TRUE(out.good());
  }
}

}  // namespace
}  // namespace npurt::ops
