// GGUF encoders for tests that build model files in memory.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "npurt/models/gguf.h"

namespace npurt::models {

// Little-endian GGUF primitives: fixed-size values and length-prefixed strings.
struct GgufBytes {
  template <typename T>
  void put(T v) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    data.insert(data.end(), b, b + sizeof(T));
  }
  void str(std::string_view s) {
    put<uint64_t>(s.size());
    data.insert(data.end(), s.begin(), s.end());
  }
  std::vector<uint8_t> data;
};

// A well-formed GGUF header and key/value table (no tensors), built key by key.
class GgufWriter : public GgufBytes {
 public:
  void key(std::string_view k, GgufType t) {
    ++n_kv_;
    str(k);
    put(static_cast<uint32_t>(t));
  }
  void kv_u32(std::string_view k, uint32_t v) { key(k, GgufType::kU32); put(v); }
  void kv_bool(std::string_view k, bool v) { key(k, GgufType::kBool); put<uint8_t>(v); }
  void kv_str(std::string_view k, std::string_view v) { key(k, GgufType::kString); str(v); }
  void kv_strings(std::string_view k, const std::vector<std::string>& v) {
    array_header(k, GgufType::kString, v.size());
    for (const std::string& s : v) str(s);
  }
  void kv_floats(std::string_view k, const std::vector<float>& v) {
    array_header(k, GgufType::kF32, v.size());
    for (float f : v) put(f);
  }
  void kv_ints(std::string_view k, const std::vector<int32_t>& v) {
    array_header(k, GgufType::kI32, v.size());
    for (int32_t i : v) put(i);
  }

  std::vector<uint8_t> bytes() const {
    GgufWriter head;
    head.put<uint32_t>(0x46554747);  // "GGUF"
    head.put<uint32_t>(3);
    head.put<uint64_t>(0);  // tensors
    head.put<uint64_t>(n_kv_);
    std::vector<uint8_t> out = head.data;
    out.insert(out.end(), data.begin(), data.end());
    return out;
  }

 private:
  void array_header(std::string_view k, GgufType elem, uint64_t n) {
    key(k, GgufType::kArray);
    put(static_cast<uint32_t>(elem));
    put(n);
  }

  uint64_t n_kv_ = 0;
};

}  // namespace npurt::models
