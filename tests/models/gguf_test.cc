// The GGUF reader against files built in memory: a well-formed file with every value
// type and three tensor types, a round trip through open(), and one malformed file
// per validation rule, each expecting the error that names the problem.
#include "npurt/models/gguf.h"

#include <gtest/gtest.h>

#include "models/gguf_writer.h"
#include "npurt/base/math.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <unistd.h>
#include <vector>

namespace npurt::models {
namespace {

// Low-level GGUF encoder for building test files, malformed ones included.
class Writer : public GgufBytes {
 public:
  void u32(uint32_t v) { put(v); }
  void u64(uint64_t v) { put(v); }
  void str(const std::string& s) { GgufBytes::str(s); }
  void pad_to(uint64_t alignment) {
    while (data.size() % alignment != 0) data.push_back(0);
  }
  void type(GgufType t) { u32(static_cast<uint32_t>(t)); }
  // A key and its value's type; the value follows.
  void key(const std::string& k, GgufType t) {
    str(k);
    type(t);
  }
  // A key whose value is an array of n elements of type `elem`; the elements follow.
  void array(const std::string& k, GgufType elem, uint64_t n) {
    key(k, GgufType::kArray);
    type(elem);
    u64(n);
  }
  template <typename T>
  void kv(const std::string& k, GgufType t, T v) {
    key(k, t);
    put(v);
  }
  void kv_str(const std::string& k, const std::string& v) {
    key(k, GgufType::kString);
    str(v);
  }
};

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t type = 0;
  uint64_t bytes = 0;                   // data size
  std::optional<uint64_t> offset;       // relative; default: packed and aligned
};

struct FileSpec {
  uint32_t magic = 0x46554747;
  uint32_t version = 3;
  std::optional<uint64_t> n_kv;         // default: kvs.size()
  std::vector<std::function<void(Writer&)>> kvs;
  std::vector<TensorSpec> tensors;
  uint64_t alignment = 32;              // used for padding and default offsets
  bool write_data = true;
};

// Fills a tensor's data with a pattern derived from its index.
uint8_t pattern(size_t tensor, size_t i) { return static_cast<uint8_t>(tensor * 37 + i * 7 + 1); }

std::vector<uint8_t> build(const FileSpec& spec) {
  Writer w;
  w.u32(spec.magic);
  w.u32(spec.version);
  w.u64(spec.tensors.size());
  w.u64(spec.n_kv.value_or(spec.kvs.size()));
  for (const auto& kv : spec.kvs) kv(w);
  std::vector<uint64_t> offsets;
  uint64_t next = 0;
  for (const TensorSpec& t : spec.tensors) {
    w.str(t.name);
    w.u32(static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) w.u64(d);
    w.u32(t.type);
    const uint64_t off = t.offset.value_or(next);
    w.u64(off);
    offsets.push_back(off);
    next = round_up(off + t.bytes, spec.alignment);
  }
  if (!spec.write_data || spec.tensors.empty()) return w.data;
  w.pad_to(spec.alignment);
  const uint64_t start = w.data.size();
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    if (offsets[i] > (1u << 20)) continue;  // a deliberately absurd offset: no data
    if (w.data.size() < start + offsets[i]) w.data.resize(start + offsets[i], 0);
    for (uint64_t j = 0; j < spec.tensors[i].bytes; ++j) w.data.push_back(pattern(i, j));
  }
  return w.data;
}

// The well-formed file: every value type, alignment 64, F32 / Q8_0 / Q4_K tensors.
FileSpec good_spec() {
  FileSpec s;
  s.alignment = 64;
  s.kvs = {
      [](Writer& w) { w.kv("general.alignment", GgufType::kU32, uint32_t{64}); },
      [](Writer& w) { w.kv_str("general.architecture", "gemma3"); },
      [](Writer& w) { w.kv("t.u8", GgufType::kU8, uint8_t{200}); },
      [](Writer& w) { w.kv("t.i8", GgufType::kI8, int8_t{-5}); },
      [](Writer& w) { w.kv("t.u16", GgufType::kU16, uint16_t{60000}); },
      [](Writer& w) { w.kv("t.i16", GgufType::kI16, int16_t{-300}); },
      [](Writer& w) { w.kv("t.u32", GgufType::kU32, uint32_t{4000000000u}); },
      [](Writer& w) { w.kv("t.i32", GgufType::kI32, int32_t{-7}); },
      [](Writer& w) { w.kv("t.f32", GgufType::kF32, 1e-6f); },
      [](Writer& w) { w.kv("t.bool", GgufType::kBool, uint8_t{1}); },
      [](Writer& w) { w.kv("t.u64", GgufType::kU64, uint64_t{1} << 40); },
      [](Writer& w) { w.kv("t.i64", GgufType::kI64, int64_t{-(int64_t{1} << 40)}); },
      [](Writer& w) { w.kv("t.f64", GgufType::kF64, 1e6); },
      [](Writer& w) {
        w.array("tokenizer.ggml.tokens", GgufType::kString, 3);
        w.str("<pad>");
        w.str("");
        w.str("\xE2\x96\x81Paris");
      },
      [](Writer& w) {
        w.array("tokenizer.ggml.scores", GgufType::kF32, 3);
        w.put(0.0f);
        w.put(-1.5f);
        w.put(2.25f);
      },
      [](Writer& w) {
        w.array("tokenizer.ggml.token_type", GgufType::kI32, 3);
        w.put(int32_t{3});
        w.put(int32_t{1});
        w.put(int32_t{-6});
      },
      [](Writer& w) {  // [["a", "bc"], []]
        w.array("t.nested", GgufType::kArray, 2);
        w.type(GgufType::kString);
        w.u64(2);
        w.str("a");
        w.str("bc");
        w.type(GgufType::kString);
        w.u64(0);
      },
  };
  s.tensors = {
      {"a.f32", {4, 2}, 0, 32, std::nullopt},
      {"blk.0.attn_q.weight", {64, 2}, 8, 4 * 34, std::nullopt},
      {"c.q4k", {256, 1}, 12, 144, std::nullopt},
  };
  return s;
}

// A minimal valid file with one F32 tensor, for mutating single fields.
FileSpec one_tensor_spec(TensorSpec t) {
  FileSpec s;
  s.tensors = {std::move(t)};
  return s;
}

void expect_error(const std::vector<uint8_t>& bytes, const std::string& substring) {
  StatusOr<GgufFile> f = GgufFile::parse(bytes);
  ASSERT_FALSE(f.ok()) << "accepted a file expected to fail with '" << substring << "'";
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument) << f.status().to_string();
  EXPECT_NE(f.status().message().find(substring), std::string::npos)
      << "message: " << f.status().message() << "\nexpected to contain: " << substring;
}

void check_good_file(const GgufFile& f) {
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 64u);
  ASSERT_EQ(f.keys().size(), 17u);
  EXPECT_EQ(f.keys()[0], "general.alignment");
  EXPECT_EQ(f.keys()[16], "t.nested");

  EXPECT_EQ(*f.get_string("general.architecture"), "gemma3");
  EXPECT_EQ(*f.get_uint("t.u8"), 200u);
  EXPECT_EQ(f.find("t.i8")->i, -5);
  EXPECT_EQ(*f.get_uint("t.u16"), 60000u);
  EXPECT_EQ(f.find("t.i16")->i, -300);
  EXPECT_EQ(*f.get_uint("t.u32"), 4000000000u);
  EXPECT_EQ(f.find("t.i32")->i, -7);
  EXPECT_EQ(*f.get_float("t.f32"), 1e-6f);
  EXPECT_EQ(f.find("t.bool")->type, GgufType::kBool);
  EXPECT_EQ(f.find("t.bool")->u, 1u);
  EXPECT_EQ(*f.get_uint("t.u64"), uint64_t{1} << 40);
  EXPECT_EQ(f.find("t.i64")->i, -(int64_t{1} << 40));
  EXPECT_EQ(*f.get_float("t.f64"), 1e6f);

  StatusOr<std::vector<std::string_view>> tokens = f.get_string_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok()) << tokens.status().to_string();
  EXPECT_EQ(*tokens, (std::vector<std::string_view>{"<pad>", "", "\xE2\x96\x81Paris"}));
  EXPECT_EQ(*f.get_float_array("tokenizer.ggml.scores"), (std::vector<float>{0.0f, -1.5f, 2.25f}));
  EXPECT_EQ(*f.get_int_array("tokenizer.ggml.token_type"), (std::vector<int32_t>{3, 1, -6}));

  const GgufValue* nested = f.find("t.nested");
  ASSERT_NE(nested, nullptr);
  EXPECT_EQ(nested->elem_type, GgufType::kArray);
  ASSERT_EQ(nested->arrays.size(), 2u);
  EXPECT_EQ(nested->arrays[0].elem_type, GgufType::kString);
  EXPECT_EQ(nested->arrays[0].strings, (std::vector<std::string_view>{"a", "bc"}));
  EXPECT_EQ(nested->arrays[1].count, 0u);

  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  const struct {
    const char* name;
    std::vector<uint64_t> dims;
    isa::DType dtype;
    uint32_t ggml_type;
    uint64_t rel;
    uint64_t bytes;
  } want[] = {
      {"a.f32", {4, 2}, isa::DType::kF32, 0, 0, 32},
      {"blk.0.attn_q.weight", {64, 2}, isa::DType::kQ8_0, 8, 64, 136},
      {"c.q4k", {256, 1}, isa::DType::kQ4_K, 12, 256, 144},
  };
  for (size_t i = 0; i < 3; ++i) {
    const GgufTensor* t = f.tensor(want[i].name);
    ASSERT_NE(t, nullptr) << want[i].name;
    EXPECT_EQ(t, &f.tensors()[i]);
    EXPECT_EQ(t->dims, want[i].dims);
    EXPECT_EQ(t->dtype, want[i].dtype);
    EXPECT_EQ(t->ggml_type, want[i].ggml_type);
    EXPECT_EQ(t->offset, f.data_offset() + want[i].rel);
    EXPECT_EQ(t->bytes, want[i].bytes);
    ASSERT_EQ(t->data.size(), want[i].bytes);
    EXPECT_EQ(t->data.data(), f.bytes().data() + t->offset);
    for (size_t j = 0; j < t->data.size(); ++j) ASSERT_EQ(t->data[j], pattern(i, j)) << j;
  }
  EXPECT_EQ(f.tensor("missing"), nullptr);
}

TEST(Gguf, ParsesEveryValueTypeAndTensors) {
  const std::vector<uint8_t> bytes = build(good_spec());
  StatusOr<GgufFile> f = GgufFile::parse(bytes);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  check_good_file(*f);
}

TEST(Gguf, Version2AndDefaultAlignment) {
  FileSpec s = one_tensor_spec({"w", {8}, 0, 32, std::nullopt});
  s.version = 2;
  const std::vector<uint8_t> bytes = build(s);
  StatusOr<GgufFile> f = GgufFile::parse(bytes);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->data_offset() % 32, 0u);
  EXPECT_EQ(f->tensor("w")->elements(), 8u);
}

TEST(Gguf, GettersNameKeyAndTypes) {
  const std::vector<uint8_t> bytes = build(good_spec());
  StatusOr<GgufFile> f = GgufFile::parse(bytes);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  StatusOr<uint64_t> missing = f->get_uint("nope");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("'nope'"), std::string::npos);

  StatusOr<uint64_t> neg = f->get_uint("t.i8");
  EXPECT_FALSE(neg.ok());
  StatusOr<float> fl = f->get_float("general.architecture");
  EXPECT_EQ(fl.status().message(),
            "gguf: key 'general.architecture' has type string, expected f32");
  StatusOr<std::string_view> st = f->get_string("t.u8");
  EXPECT_EQ(st.status().message(), "gguf: key 't.u8' has type u8, expected string");
  StatusOr<std::vector<std::string_view>> sa = f->get_string_array("tokenizer.ggml.scores");
  EXPECT_EQ(sa.status().message(),
            "gguf: key 'tokenizer.ggml.scores' has type array of f32, expected array of string");
  EXPECT_FALSE(f->get_float_array("tokenizer.ggml.tokens").ok());
  EXPECT_FALSE(f->get_int_array("tokenizer.ggml.scores").ok());
}

TEST(Gguf, OpenRoundTripsThroughAFile) {
  const std::vector<uint8_t> bytes = build(good_spec());
  char path[] = "/tmp/npurt_gguf_test_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  close(fd);
  {
    StatusOr<GgufFile> f = GgufFile::open(path);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    GgufFile moved = std::move(f).value();  // the views survive a move
    check_good_file(moved);
  }
  unlink(path);

  StatusOr<GgufFile> gone = GgufFile::open(path);
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound);

  // An empty file is malformed, not a mapping failure.
  char empty[] = "/tmp/npurt_gguf_empty_XXXXXX";
  const int efd = mkstemp(empty);
  ASSERT_GE(efd, 0);
  close(efd);
  StatusOr<GgufFile> e = GgufFile::open(empty);
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  unlink(empty);
}

TEST(Gguf, EveryTruncationFails) {
  const std::vector<uint8_t> bytes = build(good_spec());
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    // A copy of exactly `cut` bytes, so ASan catches any read past the end.
    const std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + cut);
    StatusOr<GgufFile> f = GgufFile::parse(prefix);
    ASSERT_FALSE(f.ok()) << "accepted a file cut at byte " << cut;
    EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
    const std::string& m = f.status().message();
    EXPECT_TRUE(m.find("truncated") != std::string::npos ||
                m.find("bytes left") != std::string::npos ||
                m.find("past the end") != std::string::npos ||
                m.find("outside the data section") != std::string::npos)
        << "cut " << cut << ": " << m;
  }
}

TEST(Gguf, RejectsBadHeader) {
  FileSpec s = good_spec();
  s.magic = 0x46554746;
  expect_error(build(s), "bad magic");
  s = good_spec();
  s.version = 1;
  expect_error(build(s), "version 1 at byte 4");
  s.version = 4;
  expect_error(build(s), "version 4 at byte 4");
}

TEST(Gguf, RejectsHugeCountsWithoutAllocating) {
  FileSpec s = good_spec();
  s.n_kv = uint64_t{1} << 60;
  expect_error(build(s), "kv count 1152921504606846976 at byte 16");

  s = good_spec();
  s.kvs = {[](Writer& w) { w.u64(uint64_t{1} << 62); }};  // key length
  expect_error(build(s), "key 0 length 4611686018427387904 at byte 24");

  s = good_spec();
  s.kvs = {[](Writer& w) {
    w.key("k", GgufType::kString);
    w.u64(~uint64_t{0});
  }};
  expect_error(build(s), "value of key 'k' length 18446744073709551615");

  s = good_spec();
  s.kvs = {[](Writer& w) { w.array("arr", GgufType::kU32, uint64_t{1} << 61); }};
  expect_error(build(s), "array of key 'arr' length 2305843009213693952");

  s = good_spec();  // huge arrays of strings and arrays too
  s.kvs = {[](Writer& w) { w.array("arr", GgufType::kArray, uint64_t{1} << 59); }};
  expect_error(build(s), "cannot fit");

  Writer w;  // tensor count
  w.u32(0x46554747);
  w.u32(3);
  w.u64(uint64_t{1} << 58);
  w.u64(0);
  expect_error(w.data, "tensor count 288230376151711744 at byte 8");
}

TEST(Gguf, RejectsBadValueTypesAndDeepNesting) {
  FileSpec s = good_spec();
  s.kvs = {[](Writer& w) {
    w.str("k");
    w.u32(13);
  }};
  expect_error(build(s), "type of key 'k' 13");

  s.kvs = {[](Writer& w) {
    w.key("deep", GgufType::kArray);
    for (int i = 0; i < 20; ++i) {
      w.type(GgufType::kArray);
      w.u64(1);
    }
    w.type(GgufType::kU8);
    w.u64(0);
  }};
  expect_error(build(s), "nests deeper");
}

TEST(Gguf, RejectsBadDimensions) {
  expect_error(build(one_tensor_spec({"w", {1, 1, 1, 1, 8}, 0, 32, std::nullopt})),
               "tensor 'w' dimension count 5");
  expect_error(build(one_tensor_spec({"w", {8, 0}, 0, 32, std::nullopt})),
               "tensor 'w' dimension 1 at byte");
  expect_error(build(one_tensor_spec({"w", {uint64_t{1} << 32, uint64_t{1} << 32}, 0, 32,
                                      std::nullopt})),
               "tensor 'w' element count overflows at dimension 1");
  // Fits in the element count but not in bytes.
  expect_error(build(one_tensor_spec({"w", {uint64_t{1} << 62}, 0, 32, std::nullopt})),
               "tensor 'w' byte size overflows");
}

TEST(Gguf, RejectsBadTypes) {
  expect_error(build(one_tensor_spec({"w", {32}, 3, 20, std::nullopt})),
               "tensor 'w' has unsupported ggml type 3");
  expect_error(build(one_tensor_spec({"blk.0.attn_q.weight", {48, 2}, 8, 102, std::nullopt})),
               "tensor 'blk.0.attn_q.weight' row length ne[0] = 48 is not a multiple of the");
  expect_error(build(one_tensor_spec({"w", {128}, 12, 144, std::nullopt})),
               "block of 256");
}

TEST(Gguf, RejectsBadOffsets) {
  expect_error(build(one_tensor_spec({"w", {8}, 0, 32, 4})),
               "tensor 'w' offset 4 at byte");
  expect_error(build(one_tensor_spec({"w", {8}, 0, 32, uint64_t{1} << 40})),
               "tensor 'w' offset 1099511627776 at byte");
  FileSpec s = one_tensor_spec({"w", {8}, 0, 32, std::nullopt});
  std::vector<uint8_t> bytes = build(s);
  bytes.pop_back();  // one byte short of the data
  expect_error(bytes, "tensor 'w' data of 32 bytes at offset 0");
  // A tensor declared bigger than the data written.
  s = one_tensor_spec({"w", {16}, 0, 32, std::nullopt});
  expect_error(build(s), "runs past the end of the file");
}

TEST(Gguf, RejectsDuplicates) {
  FileSpec s = good_spec();
  s.tensors[2].name = "a.f32";
  expect_error(build(s), "duplicate tensor name 'a.f32' at byte");
  s = good_spec();
  s.kvs.push_back([](Writer& w) { w.kv("t.u8", GgufType::kU8, uint8_t{1}); });
  expect_error(build(s), "duplicate key 't.u8' at byte");
}

TEST(Gguf, RejectsBadAlignment) {
  FileSpec s = one_tensor_spec({"w", {8}, 0, 32, std::nullopt});
  s.kvs = {[](Writer& w) { w.kv("general.alignment", GgufType::kU32, uint32_t{24}); }};
  expect_error(build(s), "general.alignment 24 at byte");
  s.kvs = {[](Writer& w) { w.kv("general.alignment", GgufType::kU32, uint32_t{0}); }};
  expect_error(build(s), "general.alignment 0 at byte");
  s.kvs = {[](Writer& w) { w.kv_str("general.alignment", "32"); }};
  expect_error(build(s), "general.alignment at byte");
}

}  // namespace
}  // namespace npurt::models
