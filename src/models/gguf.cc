// GGUF reader: bounds-checked parsing of the header, metadata and tensor table.
#include "npurt/models/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "npurt/base/math.h"
#include "npurt/isa/numeric.h"

namespace npurt::models {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;
// Nested arrays recurse; a bound keeps a hostile file from exhausting the stack.
constexpr int kMaxArrayDepth = 8;
constexpr uint32_t kNumTypes = 13;

std::string quoted(std::string_view s) { return "'" + std::string(s) + "'"; }

// The fewest bytes one element of type t can occupy: what a count is checked
// against before anything is allocated for it.
uint64_t min_encoded_size(GgufType t) {
  if (t == GgufType::kString) return 8;   // u64 length
  if (t == GgufType::kArray) return 12;   // u32 type + u64 count
  return gguf_fixed_size(t);
}

bool is_integer(GgufType t) {
  switch (t) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kU16: case GgufType::kI16:
    case GgufType::kU32: case GgufType::kI32: case GgufType::kU64: case GgufType::kI64:
      return true;
    default:
      return false;
  }
}

bool is_signed(GgufType t) {
  return t == GgufType::kI8 || t == GgufType::kI16 || t == GgufType::kI32 || t == GgufType::kI64;
}

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Decodes one packed fixed-size integer as a signed 64-bit value (u64 above
// INT64_MAX saturates, which every caller then rejects as out of range).
int64_t load_int(GgufType t, const uint8_t* p) {
  switch (t) {
    case GgufType::kU8: return load<uint8_t>(p);
    case GgufType::kI8: return load<int8_t>(p);
    case GgufType::kU16: return load<uint16_t>(p);
    case GgufType::kI16: return load<int16_t>(p);
    case GgufType::kU32: return load<uint32_t>(p);
    case GgufType::kI32: return load<int32_t>(p);
    case GgufType::kI64: return load<int64_t>(p);
    case GgufType::kU64: {
      const uint64_t v = load<uint64_t>(p);
      return v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
                 ? std::numeric_limits<int64_t>::max()
                 : static_cast<int64_t>(v);
    }
    default: return 0;
  }
}

// GGML tensor type ids this runtime can hold, and their ISA dtypes.
bool ggml_type_to_dtype(uint32_t id, isa::DType* out) {
  switch (id) {
    case 0: *out = isa::DType::kF32; return true;
    case 1: *out = isa::DType::kF16; return true;
    case 2: *out = isa::DType::kQ4_0; return true;
    case 6: *out = isa::DType::kQ5_0; return true;
    case 8: *out = isa::DType::kQ8_0; return true;
    case 12: *out = isa::DType::kQ4_K; return true;
    case 13: *out = isa::DType::kQ5_K; return true;
    case 14: *out = isa::DType::kQ6_K; return true;
    case 30: *out = isa::DType::kBF16; return true;
    default: return false;
  }
}

Status type_error(std::string_view key, std::string_view expected, const GgufValue& v) {
  std::string actual(gguf_type_name(v.type));
  if (v.type == GgufType::kArray) actual += " of " + std::string(gguf_type_name(v.elem_type));
  return invalid_argument("gguf: key " + quoted(key) + " has type " + actual + ", expected " +
                          std::string(expected));
}

}  // namespace

uint64_t gguf_fixed_size(GgufType t) {
  switch (t) {
    case GgufType::kU8: case GgufType::kI8: case GgufType::kBool: return 1;
    case GgufType::kU16: case GgufType::kI16: return 2;
    case GgufType::kU32: case GgufType::kI32: case GgufType::kF32: return 4;
    case GgufType::kU64: case GgufType::kI64: case GgufType::kF64: return 8;
    case GgufType::kString: case GgufType::kArray: return 0;
  }
  return 0;
}

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::kU8: return "u8";
    case GgufType::kI8: return "i8";
    case GgufType::kU16: return "u16";
    case GgufType::kI16: return "i16";
    case GgufType::kU32: return "u32";
    case GgufType::kI32: return "i32";
    case GgufType::kF32: return "f32";
    case GgufType::kBool: return "bool";
    case GgufType::kString: return "string";
    case GgufType::kArray: return "array";
    case GgufType::kU64: return "u64";
    case GgufType::kI64: return "i64";
    case GgufType::kF64: return "f64";
  }
  return "unknown";
}

uint64_t GgufTensor::elements() const {
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;  // validated at parse time not to overflow
  return n;
}

// A cursor over the file that refuses to read past its end.
class GgufParser {
 public:
  explicit GgufParser(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  Status run(GgufFile& f);

 private:
  uint64_t remaining() const { return bytes_.size() - pos_; }

  Status need(uint64_t n, std::string_view what) const {
    if (n <= remaining()) return ok_status();
    return invalid_argument("gguf: file truncated reading " + std::string(what) + " at byte " +
                            std::to_string(pos_) + ": needs " + std::to_string(n) +
                            " bytes, " + std::to_string(remaining()) + " left");
  }

  template <typename T>
  StatusOr<T> read(std::string_view what) {
    NPURT_RETURN_IF_ERROR(need(sizeof(T), what));
    T v = load<T>(bytes_.data() + pos_);
    pos_ += sizeof(T);
    return v;
  }

  StatusOr<std::span<const uint8_t>> take(uint64_t n, std::string_view what) {
    NPURT_RETURN_IF_ERROR(need(n, what));
    std::span<const uint8_t> s = bytes_.subspan(pos_, n);
    pos_ += n;
    return s;
  }

  StatusOr<std::string_view> read_string(std::string_view what) {
    const uint64_t at = pos_;
    NPURT_ASSIGN_OR_RETURN(uint64_t len, read<uint64_t>(what));
    if (len > remaining()) {
      return invalid_argument("gguf: " + std::string(what) + " length " + std::to_string(len) +
                              " at byte " + std::to_string(at) + " exceeds the " +
                              std::to_string(remaining()) + " bytes left");
    }
    NPURT_ASSIGN_OR_RETURN(std::span<const uint8_t> s, take(len, what));
    return std::string_view(reinterpret_cast<const char*>(s.data()), s.size());
  }

  StatusOr<GgufType> read_type(std::string_view what) {
    const uint64_t at = pos_;
    NPURT_ASSIGN_OR_RETURN(uint32_t t, read<uint32_t>(what));
    if (t >= kNumTypes) {
      return invalid_argument("gguf: " + std::string(what) + " " + std::to_string(t) +
                              " at byte " + std::to_string(at) + " is not a value type");
    }
    return static_cast<GgufType>(t);
  }

  Status read_value(GgufType type, std::string_view key, int depth, GgufValue& v);
  Status read_array(std::string_view key, int depth, GgufValue& v);
  Status read_metadata(GgufFile& f, uint64_t n_kv);
  Status read_tensor_info(GgufFile& f, uint64_t index);
  Status place_tensors(GgufFile& f);

  std::span<const uint8_t> bytes_;
  uint64_t pos_ = 0;
  std::vector<uint64_t> info_offsets_;  // byte offset of each tensor's offset field
};

Status GgufParser::read_value(GgufType type, std::string_view key, int depth, GgufValue& v) {
  v.type = type;
  v.byte_offset = pos_;
  const std::string what = "value of key " + quoted(key);
  switch (type) {
    case GgufType::kU8: { NPURT_ASSIGN_OR_RETURN(v.u, read<uint8_t>(what)); break; }
    case GgufType::kU16: { NPURT_ASSIGN_OR_RETURN(v.u, read<uint16_t>(what)); break; }
    case GgufType::kU32: { NPURT_ASSIGN_OR_RETURN(v.u, read<uint32_t>(what)); break; }
    case GgufType::kU64: { NPURT_ASSIGN_OR_RETURN(v.u, read<uint64_t>(what)); break; }
    case GgufType::kI8: { NPURT_ASSIGN_OR_RETURN(v.i, read<int8_t>(what)); break; }
    case GgufType::kI16: { NPURT_ASSIGN_OR_RETURN(v.i, read<int16_t>(what)); break; }
    case GgufType::kI32: { NPURT_ASSIGN_OR_RETURN(v.i, read<int32_t>(what)); break; }
    case GgufType::kI64: { NPURT_ASSIGN_OR_RETURN(v.i, read<int64_t>(what)); break; }
    case GgufType::kF32: { NPURT_ASSIGN_OR_RETURN(v.f, read<float>(what)); break; }
    case GgufType::kF64: { NPURT_ASSIGN_OR_RETURN(v.f, read<double>(what)); break; }
    case GgufType::kBool: {
      NPURT_ASSIGN_OR_RETURN(uint8_t b, read<uint8_t>(what));
      v.u = b != 0;
      break;
    }
    case GgufType::kString: { NPURT_ASSIGN_OR_RETURN(v.s, read_string(what)); break; }
    case GgufType::kArray: return read_array(key, depth, v);
  }
  return ok_status();
}

Status GgufParser::read_array(std::string_view key, int depth, GgufValue& v) {
  const std::string what = "array of key " + quoted(key);
  if (depth >= kMaxArrayDepth) {
    return invalid_argument("gguf: " + what + " at byte " + std::to_string(pos_) +
                            " nests deeper than " + std::to_string(kMaxArrayDepth) + " levels");
  }
  NPURT_ASSIGN_OR_RETURN(v.elem_type, read_type(what + " element type"));
  const uint64_t count_at = pos_;
  NPURT_ASSIGN_OR_RETURN(v.count, read<uint64_t>(what + " length"));
  const uint64_t min_size = min_encoded_size(v.elem_type);
  if (v.count > remaining() / min_size) {
    return invalid_argument("gguf: " + what + " length " + std::to_string(v.count) +
                            " at byte " + std::to_string(count_at) + " cannot fit in the " +
                            std::to_string(remaining()) + " bytes left");
  }
  if (v.elem_type == GgufType::kString) {
    v.strings.reserve(v.count);
    for (uint64_t i = 0; i < v.count; ++i) {
      NPURT_ASSIGN_OR_RETURN(std::string_view s, read_string(what + " element"));
      v.strings.push_back(s);
    }
  } else if (v.elem_type == GgufType::kArray) {
    v.arrays.resize(v.count);
    for (uint64_t i = 0; i < v.count; ++i) {
      v.arrays[i].byte_offset = pos_;
      v.arrays[i].type = GgufType::kArray;
      NPURT_RETURN_IF_ERROR(read_array(key, depth + 1, v.arrays[i]));
    }
  } else {
    NPURT_ASSIGN_OR_RETURN(v.raw, take(v.count * min_size, what));
  }
  return ok_status();
}

Status GgufParser::read_metadata(GgufFile& f, uint64_t n_kv) {
  f.keys_.reserve(n_kv);
  f.values_.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    const uint64_t key_at = pos_;
    NPURT_ASSIGN_OR_RETURN(std::string_view key, read_string("key " + std::to_string(i)));
    if (f.key_index_.count(key) != 0) {
      return invalid_argument("gguf: duplicate key " + quoted(key) + " at byte " +
                              std::to_string(key_at));
    }
    NPURT_ASSIGN_OR_RETURN(GgufType type, read_type("type of key " + quoted(key)));
    GgufValue v;
    NPURT_RETURN_IF_ERROR(read_value(type, key, 0, v));
    f.key_index_.emplace(key, f.keys_.size());
    f.keys_.push_back(key);
    f.values_.push_back(std::move(v));
  }
  return ok_status();
}

Status GgufParser::read_tensor_info(GgufFile& f, uint64_t index) {
  const uint64_t name_at = pos_;
  GgufTensor t;
  NPURT_ASSIGN_OR_RETURN(t.name, read_string("name of tensor " + std::to_string(index)));
  if (f.tensor_index_.count(t.name) != 0) {
    return invalid_argument("gguf: duplicate tensor name " + quoted(t.name) + " at byte " +
                            std::to_string(name_at));
  }
  const std::string what = "tensor " + quoted(t.name);
  const uint64_t ndims_at = pos_;
  NPURT_ASSIGN_OR_RETURN(uint32_t n_dims, read<uint32_t>(what + " dimension count"));
  if (n_dims > kMaxDims) {
    return invalid_argument("gguf: " + what + " dimension count " + std::to_string(n_dims) +
                            " at byte " + std::to_string(ndims_at) + " exceeds " +
                            std::to_string(kMaxDims));
  }
  uint64_t elements = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    const uint64_t dim_at = pos_;
    NPURT_ASSIGN_OR_RETURN(uint64_t ne, read<uint64_t>(what + " dimension"));
    if (ne == 0) {
      return invalid_argument("gguf: " + what + " dimension " + std::to_string(d) +
                              " at byte " + std::to_string(dim_at) + " is zero");
    }
    // INT64_MAX, not UINT64_MAX: consumers index elements with signed arithmetic.
    if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / elements) {
      return invalid_argument("gguf: " + what + " element count overflows at dimension " +
                              std::to_string(d) + " (byte " + std::to_string(dim_at) + ")");
    }
    elements *= ne;
    t.dims.push_back(ne);
  }
  const uint64_t type_at = pos_;
  NPURT_ASSIGN_OR_RETURN(t.ggml_type, read<uint32_t>(what + " type"));
  if (!ggml_type_to_dtype(t.ggml_type, &t.dtype)) {
    return invalid_argument("gguf: " + what + " has unsupported ggml type " +
                            std::to_string(t.ggml_type) + " at byte " + std::to_string(type_at));
  }
  const uint64_t block = isa::dtype_block_elems(t.dtype);
  const uint64_t row = t.dims.empty() ? 1 : t.dims[0];
  if (row % block != 0) {
    return invalid_argument("gguf: " + what + " row length ne[0] = " + std::to_string(row) +
                            " is not a multiple of the " + std::string(isa::dtype_name(t.dtype)) +
                            " block of " + std::to_string(block));
  }
  // dtype_bytes multiplies; make sure that cannot wrap before calling it.
  const uint64_t block_bytes = isa::dtype_block_bytes(t.dtype);
  if (elements / block > std::numeric_limits<uint64_t>::max() / block_bytes) {
    return invalid_argument("gguf: " + what + " byte size overflows");
  }
  t.bytes = isa::dtype_bytes(t.dtype, elements);
  if (t.bytes == 0) return invalid_argument("gguf: " + what + " has no byte size");
  info_offsets_.push_back(pos_);
  NPURT_ASSIGN_OR_RETURN(t.offset, read<uint64_t>(what + " offset"));  // relative for now
  f.tensor_index_.emplace(t.name, f.tensors_.size());
  f.tensors_.push_back(std::move(t));
  return ok_status();
}

Status GgufParser::place_tensors(GgufFile& f) {
  // The data section starts at the next multiple of the alignment; a file without
  // tensors may end before it.
  const uint64_t size = bytes_.size();
  const uint64_t start = round_up(pos_, f.alignment_);
  f.data_offset_ = start;
  const uint64_t section = start <= size ? size - start : 0;
  for (size_t i = 0; i < f.tensors_.size(); ++i) {
    GgufTensor& t = f.tensors_[i];
    const std::string at = " at byte " + std::to_string(info_offsets_[i]);
    const uint64_t rel = t.offset;
    if (rel % f.alignment_ != 0) {
      return invalid_argument("gguf: tensor " + quoted(t.name) + " offset " + std::to_string(rel) +
                              at + " is not a multiple of the alignment " +
                              std::to_string(f.alignment_));
    }
    if (rel >= section) {
      return invalid_argument("gguf: tensor " + quoted(t.name) + " offset " + std::to_string(rel) +
                              at + " is outside the data section (" + std::to_string(section) +
                              " bytes from byte " + std::to_string(start) + ")");
    }
    if (t.bytes > section - rel) {
      return invalid_argument("gguf: tensor " + quoted(t.name) + " data of " +
                              std::to_string(t.bytes) + " bytes at offset " + std::to_string(rel) +
                              at + " runs past the end of the file (" + std::to_string(size) +
                              " bytes)");
    }
    t.offset = start + rel;
    t.data = bytes_.subspan(t.offset, t.bytes);
  }
  return ok_status();
}

Status GgufParser::run(GgufFile& f) {
  f.bytes_ = bytes_;
  NPURT_ASSIGN_OR_RETURN(uint32_t magic, read<uint32_t>("magic"));
  if (magic != kMagic) return invalid_argument("gguf: bad magic at byte 0: not a GGUF file");
  NPURT_ASSIGN_OR_RETURN(f.version_, read<uint32_t>("version"));
  if (f.version_ != 2 && f.version_ != 3) {
    return invalid_argument("gguf: version " + std::to_string(f.version_) +
                            " at byte 4 is not supported (2 or 3)");
  }
  NPURT_ASSIGN_OR_RETURN(uint64_t n_tensors, read<uint64_t>("tensor count"));
  NPURT_ASSIGN_OR_RETURN(uint64_t n_kv, read<uint64_t>("kv count"));
  // Smallest encodings: a kv is key length + type + a 1-byte value; a tensor info is
  // name length + n_dims + type + offset.
  if (n_kv > remaining() / 13) {
    return invalid_argument("gguf: kv count " + std::to_string(n_kv) +
                            " at byte 16 cannot fit in the " + std::to_string(remaining()) +
                            " bytes left");
  }
  if (n_tensors > remaining() / 24) {
    return invalid_argument("gguf: tensor count " + std::to_string(n_tensors) +
                            " at byte 8 cannot fit in the " + std::to_string(remaining()) +
                            " bytes left");
  }
  NPURT_RETURN_IF_ERROR(read_metadata(f, n_kv));

  if (const GgufValue* a = f.find("general.alignment")) {
    uint64_t align = 0;
    if (a->type == GgufType::kU32 || a->type == GgufType::kU64) {
      align = a->u;
    } else {
      return invalid_argument("gguf: general.alignment at byte " + std::to_string(a->byte_offset) +
                              " has type " + std::string(gguf_type_name(a->type)) +
                              ", expected u32");
    }
    if (align == 0 || !std::has_single_bit(align) || align > (1u << 30)) {
      return invalid_argument("gguf: general.alignment " + std::to_string(align) + " at byte " +
                              std::to_string(a->byte_offset) + " is not a power of two up to 2^30");
    }
    f.alignment_ = align;
  } else {
    f.alignment_ = kDefaultAlignment;
  }

  f.tensors_.reserve(n_tensors);
  info_offsets_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) NPURT_RETURN_IF_ERROR(read_tensor_info(f, i));
  return place_tensors(f);
}

StatusOr<GgufFile> GgufFile::parse(std::span<const uint8_t> bytes) {
  GgufFile f;
  GgufParser p(bytes);
  NPURT_RETURN_IF_ERROR(p.run(f));
  return f;
}

StatusOr<GgufFile> GgufFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return not_found("gguf: cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return invalid_argument("gguf: cannot stat " + path + ": " + std::strerror(err));
  }
  const size_t len = static_cast<size_t>(st.st_size);
  void* addr = nullptr;
  if (len > 0) {
    addr = ::mmap(nullptr, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (addr == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return resource_exhausted("gguf: cannot map " + path + ": " + std::strerror(err));
    }
  }
  ::close(fd);  // the mapping keeps the file alive
  std::span<const uint8_t> bytes(static_cast<const uint8_t*>(addr), len);
  GgufFile f;
  f.map_addr_ = addr;
  f.map_len_ = len;
  GgufParser p(bytes);
  NPURT_RETURN_IF_ERROR_CTX(p.run(f), path);  // on error, f's destructor unmaps
  return f;
}

void GgufFile::release_pages(std::span<const uint8_t> range) const {
  if (map_addr_ == nullptr || range.empty()) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<uintptr_t>(range.data()) + page - 1) & ~(page - 1);
  const auto end = (reinterpret_cast<uintptr_t>(range.data()) + range.size()) & ~(page - 1);
  const auto map_begin = reinterpret_cast<uintptr_t>(map_addr_);
  if (begin >= end || begin < map_begin || end > map_begin + map_len_) return;
  // A read-only private mapping never written: the pages are the file's, so dropping
  // them loses nothing. Only a hint; a failure changes nothing.
  (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

GgufFile::GgufFile(GgufFile&& o) noexcept { *this = std::move(o); }

GgufFile& GgufFile::operator=(GgufFile&& o) noexcept {
  if (this == &o) return *this;
  unmap();
  map_addr_ = std::exchange(o.map_addr_, nullptr);
  map_len_ = std::exchange(o.map_len_, 0);
  bytes_ = std::exchange(o.bytes_, {});
  version_ = o.version_;
  alignment_ = o.alignment_;
  data_offset_ = o.data_offset_;
  // The views point into the mapping, which does not move, so they stay valid.
  keys_ = std::move(o.keys_);
  values_ = std::move(o.values_);
  key_index_ = std::move(o.key_index_);
  tensors_ = std::move(o.tensors_);
  tensor_index_ = std::move(o.tensor_index_);
  return *this;
}

GgufFile::~GgufFile() { unmap(); }

void GgufFile::unmap() {
  if (map_addr_ != nullptr) ::munmap(map_addr_, map_len_);
  map_addr_ = nullptr;
  map_len_ = 0;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = key_index_.find(key);
  return it == key_index_.end() ? nullptr : &values_[it->second];
}

const GgufTensor* GgufFile::tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

StatusOr<const GgufValue*> lookup(const GgufFile& f, std::string_view key) {
  const GgufValue* v = f.find(key);
  if (v == nullptr) return not_found("gguf: key " + quoted(key) + " not found");
  return v;
}

}  // namespace

StatusOr<uint64_t> GgufFile::get_uint(std::string_view key) const {
  NPURT_ASSIGN_OR_RETURN(const GgufValue* v, lookup(*this, key));
  if (!is_integer(v->type)) return type_error(key, "an unsigned integer", *v);
  if (!is_signed(v->type)) return v->u;
  if (v->i < 0) {
    return invalid_argument("gguf: key " + quoted(key) + " is " + std::to_string(v->i) +
                            ", expected an unsigned integer");
  }
  return static_cast<uint64_t>(v->i);
}

StatusOr<float> GgufFile::get_float(std::string_view key) const {
  NPURT_ASSIGN_OR_RETURN(const GgufValue* v, lookup(*this, key));
  if (v->type != GgufType::kF32 && v->type != GgufType::kF64) return type_error(key, "f32", *v);
  return static_cast<float>(v->f);
}

StatusOr<std::string_view> GgufFile::get_string(std::string_view key) const {
  NPURT_ASSIGN_OR_RETURN(const GgufValue* v, lookup(*this, key));
  if (v->type != GgufType::kString) return type_error(key, "string", *v);
  return v->s;
}

StatusOr<std::vector<std::string_view>> GgufFile::get_string_array(std::string_view key) const {
  NPURT_ASSIGN_OR_RETURN(const GgufValue* v, lookup(*this, key));
  if (v->type != GgufType::kArray || v->elem_type != GgufType::kString) {
    return type_error(key, "array of string", *v);
  }
  return v->strings;
}

StatusOr<std::vector<float>> GgufFile::get_float_array(std::string_view key) const {
  NPURT_ASSIGN_OR_RETURN(const GgufValue* v, lookup(*this, key));
  if (v->type != GgufType::kArray ||
      (v->elem_type != GgufType::kF32 && v->elem_type != GgufType::kF64)) {
    return type_error(key, "array of f32", *v);
  }
  std::vector<float> out(v->count);
  for (uint64_t i = 0; i < v->count; ++i) {
    out[i] = v->elem_type == GgufType::kF32
                 ? load<float>(v->raw.data() + 4 * i)
                 : static_cast<float>(load<double>(v->raw.data() + 8 * i));
  }
  return out;
}

StatusOr<std::vector<int32_t>> GgufFile::get_int_array(std::string_view key) const {
  NPURT_ASSIGN_OR_RETURN(const GgufValue* v, lookup(*this, key));
  if (v->type != GgufType::kArray || !is_integer(v->elem_type)) {
    return type_error(key, "array of i32", *v);
  }
  const uint64_t size = gguf_fixed_size(v->elem_type);
  std::vector<int32_t> out(v->count);
  for (uint64_t i = 0; i < v->count; ++i) {
    const int64_t x = load_int(v->elem_type, v->raw.data() + size * i);
    if (x < std::numeric_limits<int32_t>::min() || x > std::numeric_limits<int32_t>::max()) {
      return invalid_argument("gguf: key " + quoted(key) + " element " + std::to_string(i) +
                              " does not fit in i32");
    }
    out[i] = static_cast<int32_t>(x);
  }
  return out;
}

}  // namespace npurt::models
