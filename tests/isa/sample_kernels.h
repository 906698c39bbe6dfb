// Small valid kernels shared by the ISA tests and the fuzz seed generator.
//
// Each returns the builder (not the image) so a test can build it verified, take
// the unverified bytes, or append to it.
#pragma once

#include <array>
#include <span>

#include "npurt/isa/builder.h"

namespace npurt::isa::testing {

// A strided copy: each block copies `n` rows of 64 bf16 from x to y.
inline KernelBuilder copy_kernel() {
  KernelBuilder b("copy");
  const uint8_t x = b.arg_buffer("x", Access::kIn, DType::kBF16);
  const uint8_t y = b.arg_buffer("y", Access::kOut, DType::kBF16);
  const uint8_t n = b.arg_scalar("n", DType::kI32);
  const Reg block{0}, offset{1}, stride{2}, count{3};
  const Tile t{0};
  b.block_id(block);
  b.alui(AluOp::kMul, offset, block, 16 * 64 * 2);
  b.li(stride, 64);
  b.arg_value(count, n);
  b.tdef(t, DType::kBF16, 16, 64);
  b.loop_begin(count);
  b.tld(t, x, offset, DType::kBF16, stride);
  b.tst(t, y, offset, DType::kBF16, stride);
  b.loop_end();
  b.exit();
  return b;
}

// Uses every opcode at least once, with nested loops, constants and a barrier.
inline KernelBuilder every_opcode_kernel() {
  KernelBuilder b("every_opcode");
  const uint8_t x = b.arg_buffer("x", Access::kIn, DType::kBF16);
  const uint8_t w = b.arg_buffer("w", Access::kIn, DType::kQ4_K);
  const uint8_t y = b.arg_buffer("y", Access::kOut, DType::kF32);
  const uint8_t acc = b.arg_buffer("acc", Access::kInOut, DType::kF32);
  const uint8_t alpha = b.arg_scalar("alpha", DType::kF32);
  const std::array<float, 4> table = {1.0f, 2.0f, 3.0f, 4.0f};
  const uint32_t table_offset = b.add_constant_values(std::span<const float>(table));

  const Reg r0{0}, r1{1}, r2{2}, r3{3}, r4{4}, r5{5}, r6{6}, r7{7}, r8{8}, r9{9}, r10{10};
  b.nop();
  b.block_id(r0);
  b.block_count(r1);
  b.arg_value(r2, alpha);
  b.arg_bytes(r3, x);
  b.li(r4, table_offset);
  b.mov(r5, r4);
  b.alu(AluOp::kAdd, r6, r0, r1);
  b.alui(AluOp::kShl, r7, r0, 4);
  b.falu(FaluOp::kMul, r8, r2, r2);
  b.i2f(r9, r1);
  b.f2i(r10, r9);

  const Tile t0{0}, t1{1}, t2{2}, t3{3}, t4{4}, t5{5}, t6{6};
  b.tdef(t0, DType::kF32, 16, 64, 0);
  b.tdef(t1, DType::kBF16, 16, 64, 4096);
  b.tdef(t2, DType::kF32, r1, 64, 8192, r7);
  b.tdef(t3, DType::kI32, 16, 1, 6144);
  b.tdef(t4, DType::kF32, 16, 256, 16384);
  b.tdef(t5, DType::kF32, 16, 1, 6208);
  b.tdef(t6, DType::kF32, 64, 64, 32768);
  b.tld(t1, x, r0, DType::kBF16);
  b.tld(t1, x, r0, DType::kBF16, r6);
  b.tcvt(t0, t1);
  b.tldq(t4, w, r0, r6, DType::kQ4_K);
  b.tgather(t1, x, t3, r6, DType::kBF16);
  b.tfill(t2, r8);
  b.tbin(BinOp::kAdd, t0, t0, t0);
  b.tbin(BinOp::kMul, t0, t0, t5, kBcastCol);
  b.tun(UnOp::kExp, t0, t0);
  b.tsop(BinOp::kMul, t0, t0, r2);
  b.tred(RedOp::kSum, t5, t0);
  b.tbcast(t0, t5, kBcastCol);
  b.tmma(t6, t0, t6, kTransB | kAccumulate);
  b.tget(r9, t0, r0);
  b.li(r10, 2);
  b.loop_begin(r10);
  b.tld(t0, kConstArg, r4, DType::kF32);
  b.loop_begin(r10);
  b.tst(t0, y, r0, DType::kF32);
  b.loop_end();
  b.loop_end();
  b.barrier();
  b.tld(t0, acc, r0, DType::kF32);
  b.tst(t0, acc, r0, DType::kF32);
  b.exit();
  return b;
}

// A dequantizing matrix-vector step: y = w (q8_0) * x, reduced per row.
inline KernelBuilder quant_matvec_kernel() {
  KernelBuilder b("q8_matvec");
  const uint8_t w = b.arg_buffer("w", Access::kIn, DType::kQ8_0);
  const uint8_t x = b.arg_buffer("x", Access::kIn, DType::kF32);
  const uint8_t y = b.arg_buffer("y", Access::kOut, DType::kF32);
  const Reg zero{0}, row_bytes{1}, blocks{2};
  const Tile wt{0}, xt{1}, prod{2}, sum{3};
  b.li(zero, 0);
  b.li(row_bytes, 8 * 34);
  b.li(blocks, 4);
  b.tdef(wt, DType::kF32, 8, 256, 0);
  b.tdef(xt, DType::kF32, 1, 256, 8192);
  b.tdef(prod, DType::kF32, 8, 256, 9216);
  b.tdef(sum, DType::kF32, 8, 1, 17408);
  b.loop_begin(blocks);
  b.tldq(wt, w, zero, row_bytes, DType::kQ8_0);
  b.tld(xt, x, zero, DType::kF32);
  b.tbin(BinOp::kMul, prod, wt, xt, kBcastRow);
  b.tred(RedOp::kSum, sum, prod);
  b.tst(sum, y, zero, DType::kF32);
  b.loop_end();
  b.exit();
  return b;
}

}  // namespace npurt::isa::testing
