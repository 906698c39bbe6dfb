// Kernel images: the self-describing binary a core executes.
//
// Layout (all little-endian, offsets relative to the image start, every section
// inside `total_bytes`, sections do not overlap):
//
//   ImageHeader (64 B) | ArgRecord[num_args] (16 B each) | strings | code | constants
//
//   * name: UTF-8 kernel name in the string section (for errors and traces)
//   * ArgRecord: kind (buffer/scalar), access (in/out/inout), dtype, name
//   * code: num_insns * 16 B, 16-byte aligned (see isa.h)
//   * constants: read-only bytes addressed by memory operands with arg kConstArg
//
// An Image owns its bytes and has passed verification: every field and every
// instruction operand is bounds-checked (see verifier.h). Devices only accept
// verified images; cores still fault cleanly on any instruction they cannot decode,
// because a stale instruction cache may hand them bytes of another image.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "npurt/base/status.h"
#include "npurt/isa/isa.h"

namespace npurt::isa {

inline constexpr uint32_t kImageMagic = 0x49555050;  // "PPUI" little-endian bytes 'P','P','U','I'
inline constexpr uint16_t kImageVersion = 1;
inline constexpr uint16_t kImageUsesBarrier = 1;  // header flag: code contains BARRIER
inline constexpr uint32_t kMaxImageBytes = 64u << 20;

enum class ArgKind : uint8_t { kBuffer = 0, kScalar = 1 };
enum class Access : uint8_t { kIn = 1, kOut = 2, kInOut = 3 };

std::string_view access_name(Access a);

#pragma pack(push, 1)
struct ImageHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t flags;
  uint32_t total_bytes;
  uint32_t name_offset;     // within strings section
  uint32_t name_bytes;
  uint32_t args_offset;
  uint32_t num_args;
  uint32_t strings_offset;
  uint32_t strings_bytes;
  uint32_t code_offset;     // 16-byte aligned
  uint32_t code_bytes;      // multiple of 16, > 0
  uint32_t const_offset;
  uint32_t const_bytes;
  uint32_t local_bytes;     // local memory the kernel's static tiles need
  uint32_t reserved[2];     // must be zero
};
struct ArgRecord {
  uint8_t kind;    // ArgKind
  uint8_t access;  // Access
  uint8_t dtype;   // DType (buffers: element type; scalars: kF32 or kI32)
  uint8_t reserved0;
  uint32_t name_offset;  // within strings section
  uint32_t name_bytes;
  uint32_t reserved1;
};
#pragma pack(pop)
static_assert(sizeof(ImageHeader) == 64);
static_assert(sizeof(ArgRecord) == 16);

// One kernel argument, from the image (Image::args) to operator signatures and graphs.
// The element count is not part of an image (ArgRecord has no field for it), so an
// image's bytes and content hash depend only on names, kinds, accesses and dtypes; the
// args an image decodes to have elements 0.
struct ArgSpec {
  std::string name;
  ArgKind kind = ArgKind::kBuffer;
  Access access = Access::kIn;
  DType dtype = DType::kF32;
  // Buffers: element count (whole blocks for quantized types), 0 where not known;
  // scalars: 0.
  uint64_t elements = 0;

  static ArgSpec buffer(std::string name, Access access, DType dtype, uint64_t elements) {
    return {std::move(name), ArgKind::kBuffer, access, dtype, elements};
  }
  static ArgSpec scalar(std::string name, DType dtype) {
    return {std::move(name), ArgKind::kScalar, Access::kIn, dtype, 0};
  }
  bool is_scalar() const { return kind == ArgKind::kScalar; }
  bool writes() const { return access != Access::kIn; }
  bool reads() const { return access != Access::kOut; }
  // Byte size of a buffer argument of `elements` elements (0 for scalars).
  uint64_t bytes() const;
};

// Section bounds read from a header, checked only for self-consistency (magic,
// version, every section inside total_bytes, code aligned and non-empty). Devices use
// this at launch to locate the code of an image already resident in GM.
struct ImageLayout {
  uint32_t total_bytes = 0;
  uint16_t flags = 0;
  uint32_t num_args = 0;
  uint32_t code_offset = 0;
  uint32_t code_bytes = 0;
  uint32_t const_offset = 0;
  uint32_t const_bytes = 0;
  uint32_t local_bytes = 0;
};
StatusOr<ImageLayout> read_image_layout(std::span<const uint8_t> bytes);

// A verified image. Cheap to move; copy copies the bytes.
class Image {
 public:
  // Verifies `bytes` (see verifier.h) and takes them.
  static StatusOr<Image> from_bytes(std::vector<uint8_t> bytes, uint32_t max_local_bytes = 1u << 20);

  std::span<const uint8_t> bytes() const { return bytes_; }
  const std::string& name() const { return name_; }
  const std::vector<ArgSpec>& args() const { return args_; }
  const ImageLayout& layout() const { return layout_; }
  std::span<const Insn> code() const;
  std::span<const uint8_t> constants() const;
  bool uses_barrier() const { return (layout_.flags & kImageUsesBarrier) != 0; }

 private:
  Image() = default;
  std::vector<uint8_t> bytes_;
  std::string name_;
  std::vector<ArgSpec> args_;
  ImageLayout layout_;
};

}  // namespace npurt::isa
