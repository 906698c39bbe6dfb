// The smallest useful kernel, shared by the CLI demo, the benchmarks and the
// simulator tests: out = x <op> y over f32, one tile of `tile` elements per block.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "npurt/isa/builder.h"

namespace npurt::isa {

// Arguments x (in), y (in), out (out); n elements take n / tile blocks. Returns the
// builder, so a caller can append to it (e.g. exit()) before building.
inline KernelBuilder elementwise_builder(std::string name, BinOp op, uint32_t tile) {
  KernelBuilder b(std::move(name));
  const uint8_t x = b.arg_buffer("x", Access::kIn, DType::kF32);
  const uint8_t y = b.arg_buffer("y", Access::kIn, DType::kF32);
  const uint8_t out = b.arg_buffer("out", Access::kOut, DType::kF32);
  const Reg bid{0}, off{1};
  const Tile tx{0}, ty{1};
  b.block_id(bid);
  b.alui(AluOp::kMul, off, bid, tile * 4);
  b.tdef(tx, DType::kF32, 1, static_cast<int>(tile), 0);
  b.tdef(ty, DType::kF32, 1, static_cast<int>(tile), tile * 4);
  b.tld(tx, x, off, DType::kF32);
  b.tld(ty, y, off, DType::kF32);
  b.tbin(op, tx, tx, ty);
  b.tst(tx, out, off, DType::kF32);
  return b;
}

}  // namespace npurt::isa
