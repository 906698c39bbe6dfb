// How Gemma-3 is cut over the devices of a group (tensor parallelism), and the bytes
// of each tensor a device holds.
//
// Rank r of N holds: query heads [r*H/N, (r+1)*H/N) (q rows, attention, the output
// projection's columns); their key/value head (split like the query heads when N
// divides the KV heads, else the one KV head they share, replicated); MLP rows
// [r*F/N, (r+1)*F/N) of gate and up and the same columns of down; vocabulary rows
// [r*V/N, (r+1)*V/N) of the tied embedding / LM head. Norms are replicated. The
// output and down projections then give partial sums, added by an all-reduce.
#pragma once

#include <cstdint>
#include <span>

#include "npurt/base/status.h"
#include "npurt/models/gemma3_config.h"
#include "npurt/models/gguf.h"

namespace npurt::models {

struct Gemma3Shard {
  int rank = 0, size = 1;
  int32_t q_heads = 0, first_q_head = 0;
  int32_t kv_heads = 0, first_kv_head = 0;
  uint64_t ffn = 0, first_ffn = 0;
  uint64_t vocab = 0, first_vocab = 0;
  bool parallel() const { return size > 1; }

  // The whole model on one device.
  static Gemma3Shard whole(const Gemma3Config& c);
  // Rank `rank` of `size`; errors say which dimension does not divide (or does not fall
  // on whole quantized blocks of the tensor it cuts).
  static StatusOr<Gemma3Shard> plan(const GgufFile& file, const Gemma3Config& c, int rank, int size);
};

// The part of a tensor one device holds: all of it, rows [first, first + count) of its
// ne[1] rows, or the same elements [first, first + count) of every row.
struct TensorSlice {
  enum class Cut : uint8_t { kWhole, kRows, kColumns };
  Cut cut = Cut::kWhole;
  uint64_t first = 0, count = 0;
  static TensorSlice rows(uint64_t first, uint64_t count) { return {Cut::kRows, first, count}; }
  static TensorSlice columns(uint64_t first, uint64_t count) { return {Cut::kColumns, first, count}; }
};

// Bytes of `t`'s slice, in its stored type.
uint64_t slice_bytes(const GgufTensor& t, const TensorSlice& s);

// A slice as rows of the device's copy, so it can be copied a few rows at a time:
// `rows` rows of `row_bytes`, row i from the file's row `first_row + i`, starting
// `skip` bytes into it.
struct SliceRows {
  uint64_t rows = 0, row_bytes = 0;
  uint64_t first_row = 0, file_row_bytes = 0, skip = 0;

  // The file bytes rows [begin, end) are read from (whole rows of the file).
  std::span<const uint8_t> source(const GgufTensor& t, uint64_t begin, uint64_t end) const;
  // Copies rows [begin, end) to dst, (end - begin) * row_bytes bytes.
  void copy(const GgufTensor& t, uint64_t begin, uint64_t end, uint8_t* dst) const;
};
// `t`'s slice as rows; an error names the tensor when the slice leaves it or cuts its
// quantized blocks.
StatusOr<SliceRows> slice_rows(const GgufTensor& t, const TensorSlice& s);

}  // namespace npurt::models
