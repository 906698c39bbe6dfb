// GGUF model files: a zero-copy reader over a read-only memory mapping.
//
// GGUF (llama.cpp's container) is a header, a key/value metadata table, a table of
// tensor descriptors and an aligned data section holding the tensors:
//
//   StatusOr<models::GgufFile> f = models::GgufFile::open("gemma-3-270m-q4_k_m.gguf");
//   StatusOr<uint64_t> layers = f->get_uint("gemma3.block_count");
//   const models::GgufTensor* w = f->tensor("blk.0.attn_q.weight");  // w->data: raw blocks
//
// Nothing is copied: strings and tensor data are views into the mapping (or into the
// caller's bytes for parse()) and stay valid while the GgufFile (or those bytes) live.
//
// Files are untrusted input. Every count, length, dimension, offset and size is
// checked against the bytes that remain before it is used, and a count is checked
// against the smallest possible encoding of its elements before anything is
// allocated for it, so a hostile file costs at most a few times its own size. A
// malformed file is a kInvalidArgument whose message names the field and its byte
// offset ("gguf: tensor 'x' offset 96 at byte 412 is not a multiple of the alignment 32").
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "npurt/base/status.h"
#include "npurt/isa/isa.h"

namespace npurt::models {

// Metadata value types; the codes are part of the format.
enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

std::string_view gguf_type_name(GgufType t);
// Encoded size of one value of a fixed-size type (each element of a packed array);
// 0 for strings and arrays.
uint64_t gguf_fixed_size(GgufType t);

// One metadata value. Scalars are decoded into the field matching their kind;
// arrays keep their elements where the file has them (see below).
struct GgufValue {
  GgufType type = GgufType::kU8;
  uint64_t byte_offset = 0;  // where the value starts in the file, for messages

  uint64_t u = 0;       // kU8, kU16, kU32, kU64, kBool (0/1)
  int64_t i = 0;        // kI8, kI16, kI32, kI64
  double f = 0;         // kF32, kF64
  std::string_view s;   // kString

  // kArray: the element type and count. Fixed-size elements stay packed in `raw`
  // (little-endian, count * size bytes) so a 262144-entry score table costs nothing;
  // strings and nested arrays are decoded into `strings` / `arrays`.
  GgufType elem_type = GgufType::kU8;
  uint64_t count = 0;
  std::span<const uint8_t> raw;
  std::vector<std::string_view> strings;
  std::vector<GgufValue> arrays;
};

struct GgufTensor {
  std::string_view name;
  std::vector<uint64_t> dims;  // ne[0] first: the contiguous dimension
  isa::DType dtype = isa::DType::kF32;
  uint32_t ggml_type = 0;      // the type id as stored
  uint64_t offset = 0;         // absolute byte offset of the data in the file
  uint64_t bytes = 0;
  std::span<const uint8_t> data;

  uint64_t elements() const;
};

class GgufFile {
 public:
  // Maps `path` read-only; the mapping is released with the GgufFile.
  static StatusOr<GgufFile> open(const std::string& path);
  // Parses bytes the caller keeps alive for the GgufFile's lifetime (no copy).
  static StatusOr<GgufFile> parse(std::span<const uint8_t> bytes);

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  ~GgufFile();

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // start of the data section
  std::span<const uint8_t> bytes() const { return bytes_; }

  // Metadata keys in file order.
  const std::vector<std::string_view>& keys() const { return keys_; }
  const GgufValue* find(std::string_view key) const;

  // Typed getters: kNotFound for a missing key, kInvalidArgument naming the key, the
  // expected and the actual type otherwise.
  StatusOr<uint64_t> get_uint(std::string_view key) const;  // any non-negative integer
  StatusOr<float> get_float(std::string_view key) const;    // f32 or f64
  StatusOr<std::string_view> get_string(std::string_view key) const;
  StatusOr<std::vector<std::string_view>> get_string_array(std::string_view key) const;
  StatusOr<std::vector<float>> get_float_array(std::string_view key) const;
  // Any integer element type whose values all fit in int32.
  StatusOr<std::vector<int32_t>> get_int_array(std::string_view key) const;

  const GgufTensor* tensor(std::string_view name) const;
  const std::vector<GgufTensor>& tensors() const { return tensors_; }

  // The mapped pages wholly inside `range` (a part of bytes()) leave the process's
  // resident memory; touched again, they are read from the file again. For bytes
  // copied elsewhere (weights on a device). Nothing to do for a parse()d file.
  void release_pages(std::span<const uint8_t> range) const;

 private:
  GgufFile() = default;
  void unmap();

  // The mapping owned by an open()ed file; null for parse().
  void* map_addr_ = nullptr;
  size_t map_len_ = 0;

  std::span<const uint8_t> bytes_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::string_view> keys_;
  std::vector<GgufValue> values_;  // parallel to keys_
  std::unordered_map<std::string_view, size_t> key_index_;
  std::vector<GgufTensor> tensors_;
  std::unordered_map<std::string_view, size_t> tensor_index_;

  friend class GgufParser;
};

}  // namespace npurt::models
