// `npurt info MODEL`: what a GGUF file holds — header, metadata and tensor table —
// as the loader sees it, so a model's shape can be read off without other tools.
#include <cinttypes>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "npurt/models/gguf.h"

namespace npurt::cli {
namespace {

using models::GgufFile;
using models::GgufTensor;
using models::GgufType;
using models::GgufValue;

constexpr size_t kMaxString = 96;    // longer strings are cut (chat templates run to kilobytes)
constexpr uint64_t kArrayHead = 6;   // array elements shown before "..."

std::string quoted(std::string_view s) {
  std::string out = "\"";
  for (char c : s.substr(0, kMaxString)) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '"' || c == '\\') out += std::string("\\") + c;
    else if (static_cast<unsigned char>(c) < 0x20) out += '?';
    else out += c;
  }
  out += '"';
  if (s.size() > kMaxString) out += "... (" + std::to_string(s.size()) + " chars)";
  return out;
}

// Decodes element `i` of a packed little-endian array into a scalar GgufValue, so
// arrays and scalars print through the same code.
GgufValue packed_element(const GgufValue& v, uint64_t i) {
  const size_t n = models::gguf_fixed_size(v.elem_type);
  GgufValue e;
  e.type = v.elem_type;
  if (n == 0) return e;  // not a packed type; the parser does not produce these
  uint64_t bits = 0;
  std::memcpy(&bits, v.raw.data() + i * n, n);  // GGUF is little-endian, as are our hosts
  const uint64_t sign = uint64_t{1} << (n * 8 - 1);
  switch (v.elem_type) {
    case GgufType::kI8: case GgufType::kI16: case GgufType::kI32: case GgufType::kI64:
      e.i = static_cast<int64_t>((bits ^ sign) - sign);  // sign-extend from n bytes
      break;
    case GgufType::kF32: { float f; std::memcpy(&f, &bits, 4); e.f = f; break; }
    case GgufType::kF64: std::memcpy(&e.f, &bits, 8); break;
    default: e.u = bits;
  }
  return e;
}

std::string format_value(const GgufValue& v);

std::string format_array(const GgufValue& v) {
  std::string out = "array<" + std::string(models::gguf_type_name(v.elem_type)) + ">[" +
                    std::to_string(v.count) + "] [";
  const uint64_t shown = std::min(v.count, kArrayHead);
  for (uint64_t i = 0; i < shown; ++i) {
    if (i > 0) out += ", ";
    if (v.elem_type == GgufType::kString) out += quoted(v.strings[i]);
    else if (v.elem_type == GgufType::kArray) out += format_array(v.arrays[i]);
    else out += format_value(packed_element(v, i));
  }
  return out + (v.count > shown ? ", ...]" : "]");
}

std::string format_value(const GgufValue& v) {
  char buf[64];
  switch (v.type) {
    case GgufType::kString: return quoted(v.s);
    case GgufType::kArray: return format_array(v);
    case GgufType::kBool: return v.u ? "true" : "false";
    case GgufType::kF32: case GgufType::kF64: std::snprintf(buf, sizeof buf, "%.9g", v.f); return buf;
    case GgufType::kI8: case GgufType::kI16: case GgufType::kI32: case GgufType::kI64:
      return std::to_string(v.i);
    default: return std::to_string(v.u);
  }
}

void print_header(const std::string& path, const GgufFile& f) {
  const double mib = static_cast<double>(f.bytes().size()) / (1 << 20);
  std::printf("file:         %s\n", path.c_str());
  std::printf("size:         %zu bytes (%.1f MiB)\n", f.bytes().size(), mib);
  std::printf("gguf version: %u\n", f.version());
  std::printf("alignment:    %" PRIu64 "\n", f.alignment());
  std::printf("data offset:  %" PRIu64 "\n", f.data_offset());
  std::printf("tensors:      %zu\n", f.tensors().size());
  std::printf("metadata:     %zu keys\n", f.keys().size());
}

void print_metadata(const GgufFile& f) {
  std::printf("\nmetadata:\n");
  for (std::string_view key : f.keys()) {
    const GgufValue* v = f.find(key);
    std::printf("  %-44.*s %-7s %s\n", static_cast<int>(key.size()), key.data(),
                std::string(models::gguf_type_name(v->type)).c_str(), format_value(*v).c_str());
  }
}

std::string format_dims(const GgufTensor& t) {
  std::string out = "[";
  for (size_t i = 0; i < t.dims.size(); ++i) out += (i ? ", " : "") + std::to_string(t.dims[i]);
  return out + "]";
}

void print_tensors(const GgufFile& f) {
  std::printf("\ntensors (dims: contiguous dimension first; offset: absolute in the file):\n");
  std::printf("  %-36s %-6s %-18s %12s %12s\n", "name", "dtype", "dims", "bytes", "offset");
  for (const GgufTensor& t : f.tensors()) {
    std::printf("  %-36.*s %-6s %-18s %12" PRIu64 " %12" PRIu64 "\n", static_cast<int>(t.name.size()),
                t.name.data(), std::string(isa::dtype_name(t.dtype)).c_str(), format_dims(t).c_str(),
                t.bytes, t.offset);
  }
}

struct Totals {
  uint64_t tensors = 0, elements = 0, bytes = 0;
};

void print_total_row(const std::string& name, const Totals& s) {
  std::printf("  %-6s %8" PRIu64 " %14" PRIu64 " %14" PRIu64 "\n", name.c_str(), s.tensors, s.elements,
              s.bytes);
}

void print_totals(const GgufFile& f) {
  std::map<std::string, Totals> by_dtype;  // sorted, so the output is stable
  Totals all;
  for (const GgufTensor& t : f.tensors()) {
    for (Totals* s : {&by_dtype[std::string(isa::dtype_name(t.dtype))], &all}) {
      s->tensors += 1;
      s->elements += t.elements();
      s->bytes += t.bytes;
    }
  }
  std::printf("\ntotals by dtype:\n");
  std::printf("  %-6s %8s %14s %14s\n", "dtype", "tensors", "elements", "bytes");
  for (const auto& [name, s] : by_dtype) print_total_row(name, s);
  print_total_row("all", all);
}

}  // namespace

int run_info(const std::string& path) {
  auto file = GgufFile::open(path);
  if (!file.ok()) {
    std::fprintf(stderr, "npurt info: %s\n", file.status().to_string().c_str());
    return 1;
  }
  print_header(path, *file);
  print_metadata(*file);
  print_tensors(*file);
  print_totals(*file);
  return 0;
}

}  // namespace npurt::cli
