// The OpenAI wire format of `npurt serve`: request bodies of /v1/completions and
// /v1/chat/completions decoded and checked into engine requests, and the response
// objects and stream chunks built from what the engine produced. Pure functions: no
// I/O, no engine; the fuzz target and the tests drive them directly.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "npurt/models/batch_engine.h"
#include "serve/chat_template.h"
#include "npurt/models/tokenizer.h"

namespace npurt::serve {

using Json = nlohmann::json;

// An OpenAI-style error: the HTTP status and the "error" object's fields.
struct ApiError {
  int status = 400;
  std::string message{};
  std::string param{};  // the request field at fault, or empty
  std::string type = "invalid_request_error";
};

// What a request asks for, checked.
struct CompletionRequest {
  bool chat = false;
  models::EngineRequest engine;  // prompt (encoded), max_tokens, sampling, stop strings
  int n = 1;                     // completions of the prompt (seeds seed, seed + 1, ...)
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

// How chat messages become prompt text: the model file's chat template, rendered with
// its bos and eos pieces; without one, Gemma's turn format (chat_prompt).
struct ChatFormat {
  std::shared_ptr<const ChatTemplate> chat_template;  // null: Gemma's turn format
  std::string bos_token, eos_token;
};

// What the server is: its model's name, how much a request may hold and its chat format.
struct ApiLimits {
  std::string model_id;
  uint32_t max_context = 0;
  int max_n = 8;
  ChatFormat chat{};
};

// Decodes and checks a body of /v1/chat/completions (`chat`) or /v1/completions. Every
// refusal names the field (`param`) and why.
std::variant<CompletionRequest, ApiError> parse_completion(std::string_view body, bool chat,
                                                           const models::Tokenizer& tokenizer,
                                                           const ApiLimits& limits);

// Gemma's turn format of chat messages ({"role", "content"}; system text goes before
// the first user turn), ending with the model's turn opened.
std::variant<std::string, ApiError> chat_prompt(const Json& messages);
// The prompt of chat messages (as the client wrote them, keys in their order) by a
// chat template, with add_generation_prompt set and the request's `tools` (an array,
// or null for none) passed on: a message must be an object with a string role; the
// template decides the rest and its refusals come back as 400s.
std::variant<std::string, ApiError> chat_prompt(const nlohmann::ordered_json& messages, const ChatFormat& format,
                                                const nlohmann::ordered_json& tools = nullptr);

// The "error" object of an ApiError.
Json error_json(const ApiError& e);
// "stop" (a stop token or string) or "length".
const char* finish_name(models::FinishReason r);

// One finished completion, as a choice of the response.
struct Choice {
  std::vector<int32_t> tokens;
  models::FinishReason reason = models::FinishReason::kLength;
  std::vector<models::TokenChoice> logprobs;  // when asked for
};

// The whole response of a request that did not stream.
Json completion_json(const CompletionRequest& r, const std::string& id, int64_t created, const std::string& model,
                     const std::vector<Choice>& choices, size_t prompt_tokens, const models::Tokenizer& tokenizer);
// A stream chunk: choice `index`'s text `text` (and, when it ended, its reason); a
// chat stream's first chunk of a choice carries the role.
Json chunk_json(const CompletionRequest& r, const std::string& id, int64_t created, const std::string& model,
                int index, const std::string& text, const models::FinishReason* reason, bool first);
// The usage object.
Json usage_json(size_t prompt_tokens, size_t completion_tokens);

// `j` as compact text; invalid UTF-8 (a token that is part of a character) replaced.
std::string dump(const Json& j);

}  // namespace npurt::serve
