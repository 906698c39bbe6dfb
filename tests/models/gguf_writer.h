// GGUF encoders for tests that build model files in memory.
//
// GgufWriter writes a header and key/value table; tensors added with tensor() or
// tensor_f32() follow as descriptors and an aligned data section (32 bytes, the
// GGUF default). Without tensors the output is just header + key/values.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
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
  void kv_f32(std::string_view k, float v) { key(k, GgufType::kF32); put(v); }
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

  // A tensor with dims ne[0] first, a GGML type id and its raw stored bytes.
  void tensor(std::string_view name, std::vector<uint64_t> dims, uint32_t ggml_type,
              std::vector<uint8_t> raw) {
    tensors_.push_back({std::string(name), std::move(dims), ggml_type, std::move(raw)});
  }
  void tensor_f32(std::string_view name, std::vector<uint64_t> dims, const std::vector<float>& v) {
    std::vector<uint8_t> raw(v.size() * sizeof(float));
    if (!v.empty()) std::memcpy(raw.data(), v.data(), raw.size());
    tensor(name, std::move(dims), 0, std::move(raw));
  }

  std::vector<uint8_t> bytes() const {
    GgufWriter head;
    head.put<uint32_t>(0x46554747);  // "GGUF"
    head.put<uint32_t>(3);
    head.put<uint64_t>(tensors_.size());
    head.put<uint64_t>(n_kv_);
    std::vector<uint8_t> out = head.data;
    out.insert(out.end(), data.begin(), data.end());
    if (tensors_.empty()) return out;

    GgufBytes infos;
    uint64_t offset = 0;
    for (const Tensor& t : tensors_) {
      infos.str(t.name);
      infos.put(static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) infos.put(d);
      infos.put(t.ggml_type);
      infos.put(offset);
      offset = align(offset + t.raw.size());
    }
    out.insert(out.end(), infos.data.begin(), infos.data.end());
    out.resize(align(out.size()), 0);
    for (const Tensor& t : tensors_) {
      out.insert(out.end(), t.raw.begin(), t.raw.end());
      out.resize(align(out.size()), 0);
    }
    return out;
  }

 private:
  void array_header(std::string_view k, GgufType elem, uint64_t n) {
    key(k, GgufType::kArray);
    put(static_cast<uint32_t>(elem));
    put(n);
  }

  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t ggml_type;
    std::vector<uint8_t> raw;
  };
  static constexpr uint64_t kAlignment = 32;
  static uint64_t align(uint64_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

  uint64_t n_kv_ = 0;
  std::vector<Tensor> tensors_;
};

}  // namespace npurt::models
