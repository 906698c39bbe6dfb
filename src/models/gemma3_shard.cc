#include "models/gemma3_shard.h"

#include <cstring>
#include <string>

#include "npurt/isa/numeric.h"

namespace npurt::models {
namespace {

Status not_divisible(const char* what, int64_t n, int size) {
  return invalid_argument("gemma3: " + std::string(what) + " (" + std::to_string(n) + ") cannot be split over " +
                          std::to_string(size) + " devices");
}

// A column cut of `name` at multiples of `count` must fall on whole blocks.
Status check_column_cut(const GgufFile& file, const std::string& name, uint64_t count, int size) {
  const GgufTensor* t = file.tensor(name);
  if (t == nullptr) return not_found("gemma3: no tensor '" + name + "'");
  const uint64_t block = isa::dtype_block_elems(t->dtype);
  if (block == 0 || count % block == 0) return ok_status();
  return invalid_argument("gemma3: " + name + " (" + std::string(isa::dtype_name(t->dtype)) + ", blocks of " +
                          std::to_string(block) + ") cannot be cut into " + std::to_string(size) +
                          " column ranges of " + std::to_string(count) + " elements");
}

}  // namespace

Gemma3Shard Gemma3Shard::whole(const Gemma3Config& c) {
  Gemma3Shard s;
  s.q_heads = c.n_heads;
  s.kv_heads = c.n_kv_heads;
  s.ffn = static_cast<uint64_t>(c.ffn);
  s.vocab = static_cast<uint64_t>(c.vocab);
  return s;
}

StatusOr<Gemma3Shard> Gemma3Shard::plan(const GgufFile& file, const Gemma3Config& c, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) {
    return invalid_argument("gemma3: rank " + std::to_string(rank) + " of " + std::to_string(size));
  }
  Gemma3Shard s = whole(c);
  s.rank = rank;
  s.size = size;
  if (size == 1) return s;
  if (c.n_heads % size != 0) return not_divisible("the query heads", c.n_heads, size);
  if (c.n_kv_heads % size != 0 && size % c.n_kv_heads != 0) return not_divisible("the key/value heads", c.n_kv_heads, size);
  if (c.ffn % size != 0) return not_divisible("the MLP width", c.ffn, size);
  if (c.vocab % size != 0) return not_divisible("the vocabulary", c.vocab, size);
  s.q_heads = c.n_heads / size;
  s.first_q_head = rank * s.q_heads;
  // Fewer KV heads than devices: each device keeps the one its query heads use.
  s.kv_heads = c.n_kv_heads % size == 0 ? c.n_kv_heads / size : 1;
  s.first_kv_head = c.n_kv_heads % size == 0 ? rank * s.kv_heads : s.first_q_head / c.group();
  s.ffn = static_cast<uint64_t>(c.ffn / size);
  s.first_ffn = rank * s.ffn;
  s.vocab = static_cast<uint64_t>(c.vocab / size);
  s.first_vocab = rank * s.vocab;
  const uint64_t q_cols = static_cast<uint64_t>(s.q_heads) * c.head_dim;
  for (int32_t l = 0; l < c.n_layers; ++l) {
    NPURT_RETURN_IF_ERROR(check_column_cut(file, gemma3_block_tensor(l, "attn_output"), q_cols, size));
    NPURT_RETURN_IF_ERROR(check_column_cut(file, gemma3_block_tensor(l, "ffn_down"), s.ffn, size));
  }
  return s;
}

uint64_t slice_bytes(const GgufTensor& t, const TensorSlice& s) {
  if (s.cut == TensorSlice::Cut::kWhole) return t.data.size();
  const uint64_t cols = t.dims.empty() ? 0 : t.dims[0];
  const uint64_t rows = cols == 0 ? 0 : t.elements() / cols;
  if (s.cut == TensorSlice::Cut::kRows) return isa::dtype_bytes(t.dtype, s.count * cols);
  return rows * isa::dtype_bytes(t.dtype, s.count);
}

StatusOr<SliceRows> slice_rows(const GgufTensor& t, const TensorSlice& s) {
  const auto fail = [&](const std::string& why) {
    return invalid_argument("gemma3: tensor '" + std::string(t.name) + "': " + why);
  };
  const uint64_t cols = t.dims.empty() ? 0 : t.dims[0];
  const uint64_t rows = cols == 0 ? 0 : t.elements() / cols;
  const uint64_t row_bytes = isa::dtype_bytes(t.dtype, cols);
  if (rows * row_bytes != t.data.size()) return fail("its rows do not fill its data");
  switch (s.cut) {
    case TensorSlice::Cut::kWhole: return SliceRows{rows, row_bytes, 0, row_bytes, 0};
    case TensorSlice::Cut::kRows:
      if (s.first + s.count > rows) return fail("rows past its end");
      return SliceRows{s.count, row_bytes, s.first, row_bytes, 0};
    case TensorSlice::Cut::kColumns: break;
  }
  const uint64_t skip = isa::dtype_bytes(t.dtype, s.first), take = isa::dtype_bytes(t.dtype, s.count);
  if (s.first + s.count > cols || (s.first != 0 && skip == 0) || take == 0) return fail("columns off its blocks");
  return SliceRows{rows, take, 0, row_bytes, skip};
}

std::span<const uint8_t> SliceRows::source(const GgufTensor& t, uint64_t begin, uint64_t end) const {
  return t.data.subspan((first_row + begin) * file_row_bytes, (end - begin) * file_row_bytes);
}

void SliceRows::copy(const GgufTensor& t, uint64_t begin, uint64_t end, uint8_t* dst) const {
  if (row_bytes == file_row_bytes) {  // whole rows: one run
    std::memcpy(dst, source(t, begin, end).data(), (end - begin) * row_bytes);
    return;
  }
  for (uint64_t r = begin; r < end; ++r, dst += row_bytes) {
    std::memcpy(dst, t.data.data() + (first_row + r) * file_row_bytes + skip, row_bytes);
  }
}

}  // namespace npurt::models
