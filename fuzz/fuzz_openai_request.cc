// libFuzzer entry point for `npurt serve`'s request decoding (serve/openai_api.h).
//
// The first byte picks the endpoint (even: /v1/completions, odd: chat); the rest is the
// body. parse_completion() must either refuse it with an error that names a reason
// and a 4xx status, or give a request the engine would take: a non-empty prompt of
// vocabulary ids within the context, max_tokens >= 1 that fits, n in 1 .. max_n, and
// sampling parameters check_sampling() accepts. Answers to an accepted request, and
// their JSON text, must build for any tokens of the vocabulary.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "models/synthetic_vocab.h"
#include "npurt/models/sampler.h"
#include "npurt/models/tokenizer.h"
#include "serve/openai_api.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

const npurt::models::Tokenizer& tokenizer() {
  static const npurt::models::Tokenizer* t = [] {
    npurt::models::SyntheticVocab v;
    v.add_word_pieces();
    auto built = npurt::models::Tokenizer::from_vocab(v.tokens, v.scores, v.types, {});
    check(built.ok());
    return new npurt::models::Tokenizer(std::move(built).value());
  }();
  return *t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  using namespace npurt::serve;
  const bool chat = data[0] % 2 == 1;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  const ApiLimits limits{.model_id = "m", .max_context = 64, .max_n = 4};
  const auto parsed = parse_completion(body, chat, tokenizer(), limits);
  if (const auto* e = std::get_if<ApiError>(&parsed)) {
    check(e->status >= 400 && e->status < 500 && !e->message.empty());
    check(!dump(error_json(*e)).empty());
    return 0;
  }
  const CompletionRequest& r = std::get<CompletionRequest>(parsed);
  const auto& er = r.engine;
  check(!er.prompt.empty() && er.max_tokens >= 1);
  check(er.prompt.size() + static_cast<size_t>(er.max_tokens) - 1 <= limits.max_context);
  for (int32_t id : er.prompt) check(id >= 0 && id < tokenizer().size());
  check(r.n >= 1 && r.n <= limits.max_n);
  check(npurt::models::check_sampling(er.sampling).ok());
  for (const auto& s : er.stop_strings) check(!s.empty());
  const Choice c{.tokens = er.prompt, .reason = npurt::models::FinishReason::kStopString, .logprobs = {}};
  check(!dump(completion_json(r, "x", 0, "m", {c}, er.prompt.size(), tokenizer())).empty());
  check(!dump(chunk_json(r, "x", 0, "m", 0, "t", nullptr, true)).empty());
  return 0;
}
