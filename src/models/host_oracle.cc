// The host Gemma-3 forward pass: see host_oracle.h.
#include "npurt/models/host_oracle.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "npurt/isa/numeric.h"

namespace npurt::models {
namespace {

// Below this many weights per matvec, starting threads costs more than it saves.
constexpr uint64_t kParallelWeights = uint64_t{1} << 18;

double dot(const float* a, const float* b, int32_t n) {
  // Four partial sums: independent chains the compiler can overlap.
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int32_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += double(a[i]) * b[i];
    s1 += double(a[i + 1]) * b[i + 1];
    s2 += double(a[i + 2]) * b[i + 2];
    s3 += double(a[i + 3]) * b[i + 3];
  }
  for (; i < n; ++i) s0 += double(a[i]) * b[i];
  return (s0 + s1) + (s2 + s3);
}

// dot(a, b[k]) for four vectors b[k], each sum in dot()'s order and so its bits; a's
// values are loaded and widened once for the four. A float product is exact in
// double, so a fused multiply-add rounds as the multiply then add does: the AVX2 form
// (lane j holds partial sum j) gives the portable one's bits.
void dot4_portable(const float* a, const float* const b[4], int32_t n, double out[4]) {
  for (int32_t k = 0; k < 4; ++k) out[k] = dot(a, b[k], n);
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) void dot4_avx2(const float* a, const float* const b[4], int32_t n,
                                                   double out[4]) {
  __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
  int32_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256d x = _mm256_cvtps_pd(_mm_loadu_ps(a + i));
    s0 = _mm256_fmadd_pd(x, _mm256_cvtps_pd(_mm_loadu_ps(b[0] + i)), s0);
    s1 = _mm256_fmadd_pd(x, _mm256_cvtps_pd(_mm_loadu_ps(b[1] + i)), s1);
    s2 = _mm256_fmadd_pd(x, _mm256_cvtps_pd(_mm_loadu_ps(b[2] + i)), s2);
    s3 = _mm256_fmadd_pd(x, _mm256_cvtps_pd(_mm_loadu_ps(b[3] + i)), s3);
  }
  const __m256d sums[4] = {s0, s1, s2, s3};
  for (int32_t k = 0; k < 4; ++k) {
    alignas(32) double lane[4];
    _mm256_store_pd(lane, sums[k]);
    for (int32_t m = i; m < n; ++m) lane[0] += double(a[m]) * b[k][m];
    out[k] = (lane[0] + lane[1]) + (lane[2] + lane[3]);
  }
}

const auto dot4 = [] {
  __builtin_cpu_init();  // before any other static constructor may have run it
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? dot4_avx2 : dot4_portable;
}();
#else
const auto dot4 = dot4_portable;
#endif

// y[t][r] = dot(row r, x[t]) for rows [begin, end) and `tokens` vectors, each row
// decoded once for all of them. Four tokens share a row's pass, or, with fewer tokens,
// four rows share each token's: four sums in flight either way. Each sum is formed as
// dot() forms it (the product of two floats is exact, so dot(x, row) == dot(row, x)).
void matmul_rows(const uint8_t* data, isa::DType dtype, int32_t in, int32_t out, size_t row_bytes,
                 const float* x, int32_t tokens, float* y, int32_t begin, int32_t end) {
  const size_t width = static_cast<size_t>(in);
  std::vector<float> rows(4 * width);
  auto decode = [&](int32_t r, float* into) {
    isa::to_f32(data + static_cast<size_t>(r) * row_bytes, dtype, into, width);
  };
  auto vec = [&](int32_t t) { return x + static_cast<size_t>(t) * width; };
  auto at = [&](int32_t t, int32_t r) -> float& { return y[static_cast<size_t>(t) * out + r]; };
  int32_t r = begin;
  if (tokens < 4) {
    for (; r + 4 <= end; r += 4) {
      for (int32_t k = 0; k < 4; ++k) decode(r + k, rows.data() + k * width);
      const float* const b[4] = {rows.data(), rows.data() + width, rows.data() + 2 * width, rows.data() + 3 * width};
      for (int32_t t = 0; t < tokens; ++t) {
        double sums[4];
        dot4(vec(t), b, in, sums);
        for (int32_t k = 0; k < 4; ++k) at(t, r + k) = static_cast<float>(sums[k]);
      }
    }
  }
  for (; r < end; ++r) {
    decode(r, rows.data());
    int32_t t = 0;
    for (; t + 4 <= tokens; t += 4) {
      const float* const b[4] = {vec(t), vec(t + 1), vec(t + 2), vec(t + 3)};
      double sums[4];
      dot4(rows.data(), b, in, sums);
      for (int32_t k = 0; k < 4; ++k) at(t + k, r) = static_cast<float>(sums[k]);
    }
    for (; t < tokens; ++t) at(t, r) = static_cast<float>(dot(rows.data(), vec(t), in));
  }
}

// rms(x, w) = x / sqrt(mean(x^2) + eps) * w, in place. The stored Gemma weights
// already include the "+1", so w is used as is.
void rms_norm(float* x, int32_t n, const std::vector<float>& w, float eps) {
  double ss = 0;
  for (int32_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const float scale = static_cast<float>(1.0 / std::sqrt(ss / n + eps));
  for (int32_t i = 0; i < n; ++i) x[i] = x[i] * scale * w[static_cast<size_t>(i)];
}

// NeoX RoPE: dimension j rotates with j + d/2 by pos * base^(-2j/d).
void rope(float* x, int32_t d, int32_t pos, double base) {
  const int32_t half = d / 2;
  for (int32_t j = 0; j < half; ++j) {
    const double theta = pos * std::pow(base, -2.0 * j / d);
    const double c = std::cos(theta), s = std::sin(theta);
    const double a = x[j], b = x[j + half];
    x[j] = static_cast<float>(a * c - b * s);
    x[j + half] = static_cast<float>(a * s + b * c);
  }
}

float gelu_tanh(float z) {
  const double zd = z;
  return static_cast<float>(0.5 * zd * (1.0 + std::tanh(0.7978845608 * (zd + 0.044715 * zd * zd * zd))));
}

std::vector<float> load_vector(const GgufTensor& t) {
  return isa::to_f32(t.data.subspan(0, isa::dtype_bytes(t.dtype, t.elements())), t.dtype);
}

}  // namespace

void host_matmul(const uint8_t* data, isa::DType dtype, int32_t in, int32_t out, const float* x,
                 int32_t tokens, float* y) {
  const size_t row_bytes = isa::dtype_bytes(dtype, static_cast<uint64_t>(in));
  const uint64_t weights = uint64_t(in) * uint64_t(out);
  const int32_t hw = static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
  const int32_t n_threads = weights < kParallelWeights ? 1 : std::min(hw, out);
  if (n_threads <= 1) {
    matmul_rows(data, dtype, in, out, row_bytes, x, tokens, y, 0, out);
    return;
  }
  std::vector<std::thread> workers;
  workers.reserve(static_cast<size_t>(n_threads - 1));
  const int32_t chunk = (out + n_threads - 1) / n_threads;
  for (int32_t t = 1; t < n_threads; ++t) {
    const int32_t begin = std::min(out, t * chunk), end = std::min(out, begin + chunk);
    workers.emplace_back(matmul_rows, data, dtype, in, out, row_bytes, x, tokens, y, begin, end);
  }
  matmul_rows(data, dtype, in, out, row_bytes, x, tokens, y, 0, std::min(out, chunk));
  for (std::thread& w : workers) w.join();
}

void host_matvec(const uint8_t* data, isa::DType dtype, int32_t in, int32_t out,
                 const float* x, float* y) {
  host_matmul(data, dtype, in, out, x, 1, y);
}

StatusOr<HostOracle> HostOracle::load(const GgufFile& file) {
  HostOracle o;
  NPURT_ASSIGN_OR_RETURN(o.config_, Gemma3Config::from_gguf(file));
  NPURT_RETURN_IF_ERROR(validate_gemma3_tensors(file, o.config_));

  // Validation guarantees every tensor below exists with the expected shape.
  auto matrix = [](const GgufTensor* t) {
    Matrix m;
    m.data = t->data.data();
    m.dtype = t->dtype;
    m.in = static_cast<int32_t>(t->dims[0]);
    m.out = static_cast<int32_t>(t->dims[1]);
    m.row_bytes = isa::dtype_bytes(t->dtype, t->dims[0]);
    return m;
  };
  auto block = [&](int32_t l, const char* what) {
    return file.tensor(gemma3_block_tensor(l, what));
  };
  o.embed_ = matrix(file.tensor("token_embd.weight"));
  o.output_ = matrix(gemma3_output_weight(file));
  o.output_norm_ = load_vector(*file.tensor("output_norm.weight"));
  o.layers_.resize(static_cast<size_t>(o.config_.n_layers));
  for (int32_t l = 0; l < o.config_.n_layers; ++l) {
    Layer& L = o.layers_[static_cast<size_t>(l)];
    L.q = matrix(block(l, "attn_q"));
    L.k = matrix(block(l, "attn_k"));
    L.v = matrix(block(l, "attn_v"));
    L.o = matrix(block(l, "attn_output"));
    L.gate = matrix(block(l, "ffn_gate"));
    L.up = matrix(block(l, "ffn_up"));
    L.down = matrix(block(l, "ffn_down"));
    L.attn_norm = load_vector(*block(l, "attn_norm"));
    L.q_norm = load_vector(*block(l, "attn_q_norm"));
    L.k_norm = load_vector(*block(l, "attn_k_norm"));
    L.post_attn_norm = load_vector(*block(l, "post_attention_norm"));
    L.ffn_norm = load_vector(*block(l, "ffn_norm"));
    L.post_ffw_norm = load_vector(*block(l, "post_ffw_norm"));
  }
  o.logits_.resize(static_cast<size_t>(o.config_.vocab));
  return o;
}

Status HostOracle::reset() {
  for (Layer& L : layers_) {
    L.k_cache.clear();
    L.v_cache.clear();
  }
  position_ = 0;
  return ok_status();
}

Status HostOracle::check(std::span<const int32_t> tokens) const {
  const Gemma3Config& c = config_;
  for (int32_t token : tokens) {
    if (token < 0 || token >= c.vocab) {
      return invalid_argument("host oracle: token " + std::to_string(token) +
                              " is outside the vocabulary of " + std::to_string(c.vocab));
    }
  }
  if (position_ + static_cast<int64_t>(tokens.size()) > c.context_length) {
    // The first position that does not fit.
    return out_of_range("host oracle: position " + std::to_string(std::max(position_, c.context_length)) +
                        " is past the context length " + std::to_string(c.context_length));
  }
  return ok_status();
}

StatusOr<std::span<const float>> HostOracle::step(int32_t token, bool logits) {
  const Gemma3Config& c = config_;
  NPURT_RETURN_IF_ERROR(check(std::span<const int32_t>(&token, 1)));
  std::vector<float> h = forward(std::span<const int32_t>(&token, 1));
  if (!logits) return std::span<const float>();
  rms_norm(h.data(), c.hidden, output_norm_, c.rms_eps);
  host_matvec(output_.data, output_.dtype, output_.in, output_.out, h.data(), logits_.data());
  return std::span<const float>(logits_);
}

Status HostOracle::prefill(std::span<const int32_t> tokens) {
  NPURT_RETURN_IF_ERROR(check(tokens));
  // Chunks bound the activations' memory ([chunk][ffn] floats and the like).
  constexpr size_t kChunk = 256;
  for (size_t done = 0; done < tokens.size(); done += kChunk) {
    forward(tokens.subspan(done, std::min(kChunk, tokens.size() - done)));
  }
  return ok_status();
}

std::vector<float> HostOracle::forward(std::span<const int32_t> tokens) {
  const Gemma3Config& c = config_;
  const int32_t n = static_cast<int32_t>(tokens.size());
  const size_t hidden = static_cast<size_t>(c.hidden);
  // Gemma scales the embedding by sqrt(hidden), rounded to f32 first.
  std::vector<float> h(static_cast<size_t>(n) * hidden);
  const float embed_scale = static_cast<float>(std::sqrt(double(c.hidden)));
  for (int32_t t = 0; t < n; ++t) {
    float* ht = h.data() + static_cast<size_t>(t) * hidden;
    isa::to_f32(embed_.data + static_cast<size_t>(tokens[static_cast<size_t>(t)]) * embed_.row_bytes, embed_.dtype,
                ht, hidden);
    for (size_t i = 0; i < hidden; ++i) ht[i] *= embed_scale;
  }
  for (int32_t l = 0; l < c.n_layers; ++l) {
    attention_block(l, n, h);
    ffn_block(l, n, h);
  }
  position_ += n;
  h.erase(h.begin(), h.end() - static_cast<std::ptrdiff_t>(hidden));
  return h;
}

// Every vector of `x` ([n][width]) normalized by `w`, in place.
void HostOracle::rms_norm_rows(std::vector<float>& x, int32_t n, int32_t width, const std::vector<float>& w) const {
  for (int32_t t = 0; t < n; ++t) rms_norm(x.data() + static_cast<size_t>(t) * width, width, w, config_.rms_eps);
}

void HostOracle::attention_block(int32_t l, int32_t n, std::vector<float>& h) {
  const Gemma3Config& c = config_;
  Layer& L = layers_[static_cast<size_t>(l)];
  std::vector<float> x = h;
  rms_norm_rows(x, n, c.hidden, L.attn_norm);

  const size_t rows = static_cast<size_t>(n);
  std::vector<float> q(rows * L.q.out), k(rows * L.k.out), v(rows * L.v.out);
  matmul(L.q, x.data(), n, q.data());
  matmul(L.k, x.data(), n, k.data());
  matmul(L.v, x.data(), n, v.data());

  const double base = c.rope_base(l);
  const float q_scale = static_cast<float>(1.0 / std::sqrt(double(c.head_dim)));
  for (int32_t t = 0; t < n; ++t) {
    for (int32_t hd = 0; hd < c.n_heads; ++hd) {
      float* qh = q.data() + static_cast<size_t>(t) * L.q.out + static_cast<size_t>(hd) * c.head_dim;
      rms_norm(qh, c.head_dim, L.q_norm, c.rms_eps);
      rope(qh, c.head_dim, position_ + t, base);
      for (int32_t i = 0; i < c.head_dim; ++i) qh[i] *= q_scale;
    }
    for (int32_t hd = 0; hd < c.n_kv_heads; ++hd) {
      float* kh = k.data() + static_cast<size_t>(t) * L.k.out + static_cast<size_t>(hd) * c.head_dim;
      rms_norm(kh, c.head_dim, L.k_norm, c.rms_eps);
      rope(kh, c.head_dim, position_ + t, base);
    }
  }
  // A token's keys and values depend on it alone, so the cache holds all n before any
  // attends; each reads only the positions up to its own.
  L.k_cache.insert(L.k_cache.end(), k.begin(), k.end());
  L.v_cache.insert(L.v_cache.end(), v.begin(), v.end());

  std::vector<float> heads(rows * L.o.in);
  for (int32_t t = 0; t < n; ++t) {
    attend(L, c.is_global(l), position_ + t, q.data() + static_cast<size_t>(t) * L.q.out,
           heads.data() + static_cast<size_t>(t) * L.o.in);
  }
  std::vector<float> a(rows * c.hidden);
  matmul(L.o, heads.data(), n, a.data());
  rms_norm_rows(a, n, c.hidden, L.post_attn_norm);
  for (size_t i = 0; i < h.size(); ++i) h[i] += a[i];
}

// Causal attention of position p over the cache; local layers see only the last
// sliding_window positions. Query head hd reads KV head hd / group.
void HostOracle::attend(const Layer& L, bool global, int32_t p, const float* q, float* out) const {
  const Gemma3Config& c = config_;
  const int32_t first = global ? 0 : std::max(0, p - c.sliding_window + 1);
  const size_t k_stride = static_cast<size_t>(c.n_kv_heads) * c.head_dim;
  const size_t v_stride = static_cast<size_t>(c.n_kv_heads) * c.value_dim;
  std::vector<float> scores(static_cast<size_t>(p - first + 1));
  for (int32_t hd = 0; hd < c.n_heads; ++hd) {
    const int32_t kv = hd / c.group();
    const float* qh = q + static_cast<size_t>(hd) * c.head_dim;
    float max_score = -INFINITY;
    for (int32_t t = first; t <= p; ++t) {
      const float* kt = L.k_cache.data() + t * k_stride + static_cast<size_t>(kv) * c.head_dim;
      const float s = static_cast<float>(dot(qh, kt, c.head_dim));
      scores[static_cast<size_t>(t - first)] = s;
      max_score = std::max(max_score, s);
    }
    double sum = 0;
    for (float& s : scores) {
      s = std::exp(s - max_score);
      sum += s;
    }
    float* oh = out + static_cast<size_t>(hd) * c.value_dim;
    std::vector<double> acc(static_cast<size_t>(c.value_dim), 0.0);
    for (int32_t t = first; t <= p; ++t) {
      const double w = scores[static_cast<size_t>(t - first)] / sum;
      const float* vt = L.v_cache.data() + t * v_stride + static_cast<size_t>(kv) * c.value_dim;
      for (int32_t i = 0; i < c.value_dim; ++i) acc[static_cast<size_t>(i)] += w * vt[i];
    }
    for (int32_t i = 0; i < c.value_dim; ++i) oh[i] = static_cast<float>(acc[static_cast<size_t>(i)]);
  }
}

void HostOracle::ffn_block(int32_t l, int32_t n, std::vector<float>& h) {
  const Gemma3Config& c = config_;
  Layer& L = layers_[static_cast<size_t>(l)];
  std::vector<float> x = h;
  rms_norm_rows(x, n, c.hidden, L.ffn_norm);
  const size_t rows = static_cast<size_t>(n);
  std::vector<float> g(rows * c.ffn), u(rows * c.ffn);
  matmul(L.gate, x.data(), n, g.data());
  matmul(L.up, x.data(), n, u.data());
  for (size_t i = 0; i < g.size(); ++i) g[i] = gelu_tanh(g[i]) * u[i];
  std::vector<float> f(rows * c.hidden);
  matmul(L.down, g.data(), n, f.data());
  rms_norm_rows(f, n, c.hidden, L.post_ffw_norm);
  for (size_t i = 0; i < h.size(); ++i) h[i] += f[i];
}

void HostOracle::matmul(const Matrix& m, const float* x, int32_t n, float* y) {
  host_matmul(m.data, m.dtype, m.in, m.out, x, n, y);
}

StatusOr<int32_t> HostTokenModel::step(int32_t token) {
  NPURT_ASSIGN_OR_RETURN(std::span<const float> logits, oracle_.step(token));
  logits_.assign(logits.begin(), logits.end());
  // Ties go to the lowest id, as the device's first-max argmax does.
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

StatusOr<std::vector<float>> HostTokenModel::logits() const {
  if (logits_.empty()) return failed_precondition("host oracle: no step yet");
  return logits_;
}

StatusOr<int32_t> HostTokenModel::prefill(std::span<const int32_t> tokens) {
  if (tokens.empty()) return invalid_argument("host oracle: prefill of an empty prompt");
  NPURT_RETURN_IF_ERROR(oracle_.prefill(tokens.first(tokens.size() - 1)));
  return step(tokens.back());
}

StatusOr<std::vector<int32_t>> greedy(HostOracle& oracle, const std::vector<int32_t>& prompt,
                                      int max_new_tokens, const Tokenizer* stop) {
  HostTokenModel model(oracle);
  return generate(model, prompt, max_new_tokens, stop);
}

}  // namespace npurt::models
