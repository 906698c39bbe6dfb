#include "serve/openai_api.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace npurt::serve {
namespace {

ApiError bad(std::string param, std::string message) {
  return {.status = 400, .message = std::move(message), .param = std::move(param)};
}

// Reads optional field `name` of `body` into `out` when present: a number within
// [lo, hi] (integers when `integer`). Empty when fine.
std::optional<ApiError> number(const Json& body, const char* name, double lo, double hi, bool integer, double& out) {
  const auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number() || (integer && !it->is_number_integer())) {
    return bad(name, std::string("'") + name + "' must be " + (integer ? "an integer" : "a number"));
  }
  const double v = it->get<double>();
  if (!(v >= lo && v <= hi)) {
    return bad(name, std::string("'") + name + "' is " + it->dump() + "; it must be within [" + Json(lo).dump() +
                         ", " + Json(hi).dump() + "]");
  }
  out = v;
  return std::nullopt;
}

std::optional<ApiError> boolean(const Json& body, const char* name, bool& out) {
  const auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return bad(name, std::string("'") + name + "' must be true or false");
  out = it->get<bool>();
  return std::nullopt;
}

// The prompt of a completion: a string, an array of token ids, or an array of one string.
std::variant<std::vector<int32_t>, ApiError> completion_prompt(const Json& body, const models::Tokenizer& tok) {
  const auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) return bad("prompt", "'prompt' is required");
  const Json* p = &*it;
  if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) p = &(*p)[0];
  if (p->is_string()) {
    StatusOr<std::vector<int32_t>> ids = tok.encode(p->get<std::string>());
    if (!ids.ok()) return bad("prompt", ids.status().message());
    return std::move(ids).value();
  }
  if (p->is_array() && !p->empty()) {
    std::vector<int32_t> ids;
    for (const Json& t : *p) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok.size()) {
        return bad("prompt", "'prompt' token " + t.dump() + " is not a token id of the model (0 .. " +
                                 std::to_string(tok.size() - 1) + ")");
      }
      ids.push_back(t.get<int32_t>());
    }
    return ids;
  }
  return bad("prompt", "'prompt' must be a string, an array of one string or a non-empty array of token ids");
}

std::optional<ApiError> stop_strings(const Json& body, std::vector<std::string>& out) {
  const auto it = body.find("stop");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) {
    out = {it->get<std::string>()};
  } else if (it->is_array() && it->size() <= 4) {
    for (const Json& s : *it) {
      if (!s.is_string()) return bad("stop", "'stop' must be a string or an array of up to 4 strings");
      out.push_back(s.get<std::string>());
    }
  } else {
    return bad("stop", "'stop' must be a string or an array of up to 4 strings");
  }
  for (const std::string& s : out) {
    if (s.empty()) return bad("stop", "'stop' holds an empty string");
  }
  return std::nullopt;
}

}  // namespace

std::variant<std::string, ApiError> chat_prompt(const Json& messages) {
  if (!messages.is_array() || messages.empty()) return bad("messages", "'messages' must be a non-empty array");
  std::string system, text;
  bool open_user = false;
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return bad(where + ".role", "'" + where + "' must be an object with a string 'role'");
    }
    if (!m.contains("content") || !m["content"].is_string()) {
      return bad(where + ".content", "'" + where + ".content' must be a string");
    }
    const std::string role = m["role"], content = m["content"];
    if (role == "system" || role == "developer") {
      system += (system.empty() ? "" : "\n\n") + content;
    } else if (role == "user") {
      text += "<start_of_turn>user\n";
      if (!system.empty()) text += system + "\n\n";
      system.clear();
      text += content + "<end_of_turn>\n";
      open_user = true;
    } else if (role == "assistant") {
      text += "<start_of_turn>model\n" + content + "<end_of_turn>\n";
    } else {
      return bad(where + ".role", "'" + where + ".role' is '" + role + "'; expected system, user or assistant");
    }
  }
  if (!open_user) return bad("messages", "'messages' holds no user message");
  return text + "<start_of_turn>model\n";
}

std::variant<std::string, ApiError> chat_prompt(const nlohmann::ordered_json& messages, const ChatFormat& format,
                                                const nlohmann::ordered_json& tools) {
  if (!tools.is_null() && (!tools.is_array() || !std::all_of(tools.begin(), tools.end(), [](const auto& t) { return t.is_object(); }))) {
    return bad("tools", "'tools' must be an array of objects");
  }
  if (!messages.is_array() || messages.empty()) return bad("messages", "'messages' must be a non-empty array");
  for (size_t i = 0; i < messages.size(); ++i) {
    const nlohmann::ordered_json& m = messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return bad(where + ".role", "'" + where + "' must be an object with a string 'role'");
    }
  }
  nlohmann::ordered_json variables = {{"messages", messages},
                                      {"bos_token", format.bos_token},
                                      {"eos_token", format.eos_token},
                                      {"add_generation_prompt", true}};
  if (!tools.is_null()) variables["tools"] = tools;
  StatusOr<std::string> text = format.chat_template->render(variables);
  if (!text.ok()) return bad("messages", "the model's chat template refused the messages: " + text.status().message());
  return std::move(text).value();
}

std::variant<CompletionRequest, ApiError> parse_completion(std::string_view body_text, bool chat,
                                                           const models::Tokenizer& tok, const ApiLimits& limits) {
  const Json body = Json::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return bad("", "the body is not valid JSON (or not UTF-8)");
  if (!body.is_object()) return bad("", "the body must be a JSON object");
  CompletionRequest r;
  r.chat = chat;
  if (const auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return bad("model", "'model' must be a string");
    if (it->get<std::string>() != limits.model_id) {
      return ApiError{.status = 404, .message = "the model '" + it->get<std::string>() + "' does not exist; this server has '" +
                                                    limits.model_id + "'",
                      .param = "model", .type = "invalid_request_error"};
    }
  }
  if (chat) {
    const auto it = body.find("messages");
    if (it == body.end()) return bad("messages", "'messages' is required");
    std::variant<std::string, ApiError> text;
    if (limits.chat.chat_template) {
      // Read again keeping the client's key order, which a template may print.
      const auto ordered = nlohmann::ordered_json::parse(body_text, nullptr, /*allow_exceptions=*/false);
      text = chat_prompt(ordered["messages"], limits.chat, ordered.value("tools", nlohmann::ordered_json()));
    } else {
      text = chat_prompt(*it);
    }
    if (auto* e = std::get_if<ApiError>(&text)) return *e;
    StatusOr<std::vector<int32_t>> ids = tok.encode(std::get<std::string>(text));
    if (!ids.ok()) return bad("messages", ids.status().message());
    r.engine.prompt = std::move(ids).value();
  } else {
    std::variant<std::vector<int32_t>, ApiError> ids = completion_prompt(body, tok);
    if (auto* e = std::get_if<ApiError>(&ids)) return *e;
    r.engine.prompt = std::move(std::get<std::vector<int32_t>>(ids));
  }
  const double ctx = limits.max_context;
  const double room = ctx - static_cast<double>(r.engine.prompt.size()) + 1;
  if (room < 1) {
    return bad(chat ? "messages" : "prompt", "the prompt is " + std::to_string(r.engine.prompt.size()) +
                                                 " tokens; the context holds " + std::to_string(limits.max_context));
  }
  double max_tokens = chat ? room : 16;
  const char* max_name = chat && body.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (auto e = number(body, max_name, 1, std::numeric_limits<int32_t>::max(), true, max_tokens)) return *e;
  if (max_tokens > room) {
    return bad(max_name, "the prompt's " + std::to_string(r.engine.prompt.size()) + " tokens and " + max_name + " " +
                             std::to_string(static_cast<int64_t>(max_tokens)) + " need more than the " +
                             std::to_string(limits.max_context) + " positions of the context");
  }
  r.engine.max_tokens = static_cast<int>(max_tokens);
  models::SamplingParams& s = r.engine.sampling;
  double v = 1.0;
  if (auto e = number(body, "temperature", 0, 2, false, v = 1.0)) return *e;
  s.temperature = static_cast<float>(v);
  if (auto e = number(body, "top_p", 0, 1, false, v = 1.0)) return *e;
  if (v <= 0) return bad("top_p", "'top_p' must be within (0, 1]");
  s.top_p = static_cast<float>(v);
  if (auto e = number(body, "top_k", 0, 1 << 20, true, v = 0)) return *e;
  s.top_k = static_cast<int>(v);
  if (auto e = number(body, "min_p", 0, 1, false, v = 0)) return *e;
  s.min_p = static_cast<float>(v);
  if (auto e = number(body, "presence_penalty", -2, 2, false, v = 0)) return *e;
  s.presence_penalty = static_cast<float>(v);
  if (auto e = number(body, "frequency_penalty", -2, 2, false, v = 0)) return *e;
  s.frequency_penalty = static_cast<float>(v);
  if (auto e = number(body, "repetition_penalty", 0.01, 100, false, v = 1)) return *e;
  s.repetition_penalty = static_cast<float>(v);
  if (auto e = number(body, "seed", 0, 9007199254740991.0, true, v = 0)) return *e;
  s.seed = static_cast<uint64_t>(v);
  if (chat) {
    bool want = false;
    if (auto e = boolean(body, "logprobs", want)) return *e;
    if (auto e = number(body, "top_logprobs", 0, models::SamplingParams::kMaxTopLogprobs, true, v = 0)) return *e;
    s.logprobs = want;
    s.top_logprobs = want ? static_cast<int>(v) : 0;
  } else {
    if (auto e = number(body, "logprobs", 0, models::SamplingParams::kMaxTopLogprobs, true, v = 0)) return *e;
    s.logprobs = body.contains("logprobs") && !body["logprobs"].is_null();
    s.top_logprobs = static_cast<int>(v);
  }
  if (auto e = stop_strings(body, r.engine.stop_strings)) return *e;
  if (auto e = number(body, "n", 1, limits.max_n, true, v = 1)) return *e;
  r.n = static_cast<int>(v);
  if (auto e = boolean(body, "stream", r.stream)) return *e;
  if (const auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) return bad("stream_options", "'stream_options' must be an object");
    if (auto e = boolean(*it, "include_usage", r.include_usage)) {
      e->param = "stream_options.include_usage";
      return *e;
    }
  }
  if (r.stream && s.wants_logprobs()) return bad("logprobs", "'logprobs' are returned only without 'stream'");
  if (Status st = models::check_sampling(s); !st.ok()) return bad("", st.message());
  return r;
}

Json error_json(const ApiError& e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", e.param.empty() ? Json(nullptr) : Json(e.param)},
            {"code", nullptr}}}};
}

const char* finish_name(models::FinishReason r) { return r == models::FinishReason::kLength ? "length" : "stop"; }

Json usage_json(size_t prompt_tokens, size_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

namespace {

Json logprobs_json(bool chat, const std::vector<models::TokenChoice>& choices, const models::Tokenizer& tok) {
  if (chat) {
    Json content = Json::array();
    for (const models::TokenChoice& c : choices) {
      Json top = Json::array();
      for (const models::TokenLogprob& t : c.top) top.push_back({{"token", tok.token_text(t.token)}, {"logprob", t.logprob}});
      content.push_back({{"token", tok.token_text(c.token)}, {"logprob", c.logprob}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  Json tokens = Json::array(), lps = Json::array(), tops = Json::array(), offsets = Json::array();
  size_t offset = 0;
  for (const models::TokenChoice& c : choices) {
    const std::string text = tok.token_text(c.token);
    tokens.push_back(text);
    lps.push_back(c.logprob);
    Json top = Json::object();
    for (const models::TokenLogprob& t : c.top) top[tok.token_text(t.token)] = t.logprob;
    tops.push_back(top);
    offsets.push_back(offset);
    offset += text.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

}  // namespace

Json completion_json(const CompletionRequest& r, const std::string& id, int64_t created, const std::string& model,
                     const std::vector<Choice>& choices, size_t prompt_tokens, const models::Tokenizer& tok) {
  Json out = Json::array();
  size_t generated = 0;
  for (size_t i = 0; i < choices.size(); ++i) {
    const Choice& c = choices[i];
    generated += c.tokens.size();
    const std::string text = tok.decode(c.tokens);
    Json choice{{"index", i}, {"finish_reason", finish_name(c.reason)}};
    choice["logprobs"] = r.engine.sampling.wants_logprobs() ? logprobs_json(r.chat, c.logprobs, tok) : Json(nullptr);
    if (r.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", text}};
    } else {
      choice["text"] = text;
    }
    out.push_back(choice);
  }
  return {{"id", id},
          {"object", r.chat ? "chat.completion" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", out},
          {"usage", usage_json(prompt_tokens * choices.size(), generated)}};
}

Json chunk_json(const CompletionRequest& r, const std::string& id, int64_t created, const std::string& model,
                int index, const std::string& text, const models::FinishReason* reason, bool first) {
  Json choice{{"index", index}, {"finish_reason", reason ? Json(finish_name(*reason)) : Json(nullptr)}};
  if (r.chat) {
    Json delta = Json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || !reason) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  return {{"id", id},
          {"object", r.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", Json::array({choice})}};
}

std::string dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

}  // namespace npurt::serve
