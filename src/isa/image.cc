#include "npurt/isa/image.h"

#include <string>
#include <utility>

#include "npurt/base/math.h"
#include "npurt/isa/numeric.h"
#include "npurt/isa/verifier.h"

namespace npurt::isa {
namespace {

// A section [offset, offset + bytes) must end inside the image. The sum is formed in
// 64 bits so a huge offset cannot wrap around to a small one.
Status check_section(std::string_view name, uint32_t offset, uint64_t bytes, uint32_t total_bytes) {
  if (uint64_t{offset} + bytes <= total_bytes) return ok_status();
  return invalid_argument("image header: " + std::string(name) + " section [offset " +
                          std::to_string(offset) + ", " + std::to_string(bytes) +
                          " bytes) exceeds total_bytes " + std::to_string(total_bytes));
}

Status check_identity(const ImageHeader& h) {
  if (h.magic != kImageMagic) {
    return invalid_argument("image header: magic " + hex(h.magic, 8) + " is not " + hex(kImageMagic, 8));
  }
  if (h.version != kImageVersion) {
    return invalid_argument("image header: version " + std::to_string(h.version) + " is not " +
                            std::to_string(kImageVersion));
  }
  if ((h.flags & ~kImageUsesBarrier) != 0) {
    return invalid_argument("image header: flags " + std::to_string(h.flags) + " has unknown bits");
  }
  if (h.reserved[0] != 0 || h.reserved[1] != 0) {
    return invalid_argument("image header: reserved fields must be zero (reserved[0] " +
                            std::to_string(h.reserved[0]) + ", reserved[1] " + std::to_string(h.reserved[1]) +
                            ")");
  }
  return ok_status();
}

Status check_sizes(const ImageHeader& h) {
  if (h.total_bytes < sizeof(ImageHeader) || h.total_bytes > kMaxImageBytes) {
    return invalid_argument("image header: total_bytes " + std::to_string(h.total_bytes) + " is not in [" +
                            std::to_string(sizeof(ImageHeader)) + ", " + std::to_string(kMaxImageBytes) +
                            "]");
  }
  if (h.num_args > static_cast<uint32_t>(kMaxArgs)) {
    return invalid_argument("image header: num_args " + std::to_string(h.num_args) + " exceeds " +
                            std::to_string(kMaxArgs));
  }
  NPURT_RETURN_IF_ERROR(
      check_section("args", h.args_offset, uint64_t{h.num_args} * sizeof(ArgRecord), h.total_bytes));
  NPURT_RETURN_IF_ERROR(check_section("strings", h.strings_offset, h.strings_bytes, h.total_bytes));
  NPURT_RETURN_IF_ERROR(check_section("code", h.code_offset, h.code_bytes, h.total_bytes));
  NPURT_RETURN_IF_ERROR(check_section("constants", h.const_offset, h.const_bytes, h.total_bytes));
  if (h.code_offset % kInsnBytes != 0) {
    return invalid_argument("image header: code_offset " + std::to_string(h.code_offset) +
                            " is not 16-byte aligned");
  }
  if (h.code_bytes == 0 || h.code_bytes % kInsnBytes != 0) {
    return invalid_argument("image header: code_bytes " + std::to_string(h.code_bytes) +
                            " is not a non-zero multiple of 16");
  }
  return ok_status();
}

}  // namespace

std::string_view access_name(Access a) {
  switch (a) {
    case Access::kIn: return "in";
    case Access::kOut: return "out";
    case Access::kInOut: return "inout";
  }
  return "invalid";
}

uint64_t ArgSpec::bytes() const { return is_scalar() ? 0 : dtype_bytes(dtype, elements); }

// `bytes` may be exactly the image or a larger region that starts with it (a device
// passes the rest of the GM block holding the image). Sections are checked against
// total_bytes, and total_bytes against the bytes available, so a caller can index
// any section of the result without further checks.
StatusOr<ImageLayout> read_image_layout(std::span<const uint8_t> bytes) {
  if (bytes.size() < sizeof(ImageHeader)) {
    return invalid_argument("image is " + std::to_string(bytes.size()) + " bytes, smaller than the " +
                            std::to_string(sizeof(ImageHeader)) + "-byte header");
  }
  ByteReader reader(bytes);
  const auto h = reader.read<ImageHeader>(0, "image header");
  NPURT_RETURN_IF_ERROR(reader.status());
  NPURT_RETURN_IF_ERROR(check_identity(h));
  NPURT_RETURN_IF_ERROR(check_sizes(h));
  if (h.total_bytes > bytes.size()) {
    return invalid_argument("image is " + std::to_string(bytes.size()) + " bytes but header total_bytes is " +
                            std::to_string(h.total_bytes));
  }
  ImageLayout layout;
  layout.total_bytes = h.total_bytes;
  layout.flags = h.flags;
  layout.num_args = h.num_args;
  layout.code_offset = h.code_offset;
  layout.code_bytes = h.code_bytes;
  layout.const_offset = h.const_offset;
  layout.const_bytes = h.const_bytes;
  layout.local_bytes = h.local_bytes;
  return layout;
}

StatusOr<Image> Image::from_bytes(std::vector<uint8_t> bytes, uint32_t max_local_bytes) {
  NPURT_RETURN_IF_ERROR(verify_image(bytes, max_local_bytes));
  // Verified: every read below is in bounds, so the reader cannot fail; keep the
  // checks anyway so a verifier bug surfaces as an error rather than a bad read.
  ByteReader reader(bytes);
  const auto h = reader.read<ImageHeader>(0, "image header");
  Image image;
  NPURT_ASSIGN_OR_RETURN(image.layout_, read_image_layout(bytes));
  const auto text = [&](uint32_t offset, uint32_t size) {
    const std::span<const uint8_t> s = reader.slice(uint64_t{h.strings_offset} + offset, size, "string");
    return std::string(s.begin(), s.end());
  };
  image.name_ = text(h.name_offset, h.name_bytes);
  image.args_.reserve(h.num_args);
  for (uint32_t i = 0; i < h.num_args; ++i) {
    const auto rec =
        reader.read<ArgRecord>(uint64_t{h.args_offset} + uint64_t{i} * sizeof(ArgRecord), "arg record");
    image.args_.push_back(ArgSpec{text(rec.name_offset, rec.name_bytes), static_cast<ArgKind>(rec.kind),
                                  static_cast<Access>(rec.access), static_cast<DType>(rec.dtype)});
  }
  if (!reader.ok()) return internal_error("verified image failed to parse: " + reader.status().message());
  image.bytes_ = std::move(bytes);
  return image;
}

std::span<const Insn> Image::code() const {
  // Insn is packed (alignment 1), so any byte offset is a valid place to view it.
  static_assert(alignof(Insn) == 1);
  const auto* first = reinterpret_cast<const Insn*>(bytes_.data() + layout_.code_offset);
  return {first, layout_.code_bytes / kInsnBytes};
}

std::span<const uint8_t> Image::constants() const {
  return std::span<const uint8_t>(bytes_).subspan(layout_.const_offset, layout_.const_bytes);
}

}  // namespace npurt::isa
