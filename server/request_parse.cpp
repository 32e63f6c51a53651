#include "server/request_parse.h"

#include <algorithm>

#include "core/error.h"
#include "server/api_error.h"
#include "server/request_fields.h"

namespace dsv4 {

namespace {

void check_model(const Fields& f, const ApiConfig& cfg) {
  const auto model = f.string("model");
  if (!model) bad_request("'model' is required", "model");
  if (*model != cfg.served_model_name)
    throw ApiError(404, "The model `" + *model + "` does not exist (this server serves `" + cfg.served_model_name + "`)",
                   "model", "model_not_found");
}

// Fields both endpoints share: sampling, stop conditions, n / stream.
void parse_common(const Fields& f, const Tokenizer& tok, GenerationPlan& p) {
  SamplingParams& s = p.sampling;
  if (auto v = f.number("temperature", 0, 2)) s.temperature = static_cast<float>(*v);
  if (auto v = f.number("top_p", 0, 1)) {
    if (*v <= 0) bad_request("'top_p' must be in (0, 1], got 0", "top_p");
    s.top_p = static_cast<float>(*v);
  }
  if (auto v = f.integer("top_k", -1, 1 << 30)) s.top_k = *v;
  if (auto v = f.number("min_p", 0, 1)) s.min_p = static_cast<float>(*v);
  if (auto v = f.number("presence_penalty", -2, 2)) s.presence_penalty = static_cast<float>(*v);
  if (auto v = f.number("frequency_penalty", -2, 2)) s.frequency_penalty = static_cast<float>(*v);
  if (auto v = f.number("repetition_penalty", 0, 1e6)) {
    if (*v <= 0) bad_request("'repetition_penalty' must be > 0", "repetition_penalty");
    s.repetition_penalty = static_cast<float>(*v);
  }
  if (auto v = f.integer("seed", INT64_MIN, INT64_MAX)) s.seed = static_cast<uint64_t>(*v);
  if (const ojson* lb = f.get("logit_bias")) {
    if (!lb->is_object()) bad_request("'logit_bias' must be an object of token id → bias", "logit_bias");
    for (auto it = lb->begin(); it != lb->end(); ++it) {
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(it.key(), &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != it.key().size() || id < 0 || !tok.is_valid_id(static_cast<TokenId>(id)))
        bad_request("'logit_bias': '" + it.key() + "' is not a valid token id", "logit_bias");
      if (!it.value().is_number() || it.value().get<double>() < -100 || it.value().get<double>() > 100)
        bad_request("'logit_bias': biases must be numbers in [-100, 100]", "logit_bias");
      s.logit_bias.emplace_back(static_cast<int32_t>(id), it.value().get<float>());
    }
  }
  if (auto n = f.integer("n", 1, 128); n && *n != 1) bad_request("n > 1 is not supported (one choice per request)", "n");
  if (auto b = f.integer("best_of", 1, 128); b && *b != 1) bad_request("best_of > 1 is not supported", "best_of");

  StopConditions& st = p.stop;
  if (const ojson* stop = f.get("stop")) {
    if (stop->is_string()) {
      st.stop_strings.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->size() > 16) bad_request("'stop' takes at most 16 strings", "stop");
      for (const auto& s1 : *stop) st.stop_strings.push_back(read_string(s1, "stop"));
    } else {
      bad_request("'stop' must be a string or an array of strings", "stop");
    }
    for (const auto& s1 : st.stop_strings)
      if (s1.empty()) bad_request("'stop' strings must not be empty", "stop");
  }
  if (const ojson* ids = f.get("stop_token_ids")) {
    if (!ids->is_array()) bad_request("'stop_token_ids' must be an array of token ids", "stop_token_ids");
    for (const auto& v : *ids) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || !tok.is_valid_id(static_cast<TokenId>(v.get<int64_t>())))
        bad_request("'stop_token_ids' must hold valid token ids", "stop_token_ids");
      st.stop_token_ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
  }
  if (auto v = f.boolean("ignore_eos")) st.ignore_eos = *v;
  if (auto v = f.boolean("include_stop_str_in_output")) st.include_stop_str_in_output = *v;

  p.stream = f.boolean("stream").value_or(false);
  if (const ojson* so = f.get("stream_options")) {
    if (!so->is_object()) bad_request("'stream_options' must be an object", "stream_options");
    if (!p.stream) bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options");
    if (so->contains("include_usage") && !(*so)["include_usage"].is_null())
      p.include_usage = read_bool((*so)["include_usage"], "stream_options.include_usage");
  }
}

// max_tokens against the context: the vLLM rule and message.
void check_length(const GenerationPlan& p, const ApiConfig& cfg, const char* what) {
  const int64_t P = static_cast<int64_t>(p.prompt.size());
  if (P == 0) bad_request("the prompt is empty", what);
  if (P >= cfg.max_model_len)
    bad_request("This model's maximum context length is " + std::to_string(cfg.max_model_len) +
                    " tokens. However, your request has " + std::to_string(P) +
                    " prompt tokens, which leaves no room for the completion.",
                what, "context_length_exceeded");
  if (p.stop.max_tokens > 0 && P + p.stop.max_tokens > cfg.max_model_len)
    bad_request("This model's maximum context length is " + std::to_string(cfg.max_model_len) +
                    " tokens. However, you requested " + std::to_string(P + p.stop.max_tokens) + " tokens (" +
                    std::to_string(P) + " in the prompt, " + std::to_string(p.stop.max_tokens) +
                    " in the completion). Please reduce the prompt or max_tokens.",
                "max_tokens", "context_length_exceeded");
}

// Chat (OpenAI): logprobs is a bool, top_logprobs 0..20 alternatives and needs logprobs.
void parse_chat_logprobs(const Fields& f, GenerationPlan& p) {
  p.sampling.logprobs = f.boolean("logprobs").value_or(false);
  const auto top = f.integer("top_logprobs", 0, 20);
  if (top && *top > 0 && !p.sampling.logprobs)
    bad_request("top_logprobs needs \"logprobs\": true", "top_logprobs");
  p.sampling.top_logprobs = static_cast<int32_t>(top.value_or(0));
}

// Completions (legacy): logprobs is the number of alternatives, 0..20 (vLLM's max_logprobs).
void parse_completion_logprobs(const Fields& f, GenerationPlan& p) {
  if (f.get("top_logprobs")) bad_request("top_logprobs is a chat parameter; use logprobs: N", "top_logprobs");
  const auto n = f.integer("logprobs", 0, 20);
  if (!n) return;
  p.sampling.logprobs = true;
  p.sampling.top_logprobs = static_cast<int32_t>(*n);
}

struct ThinkingChoice {
  ThinkingMode mode;
  std::string effort;  // normalized: "", "low", "high", "max"
};

// §4.1 switches in their order, then §4.2 effort normalization.
ThinkingChoice thinking_choice(const Fields& f, const ApiConfig& cfg) {
  std::optional<bool> on;
  if (const ojson* t = f.get("thinking")) {
    if (!t->is_object() || !t->contains("type") || !(*t)["type"].is_string())
      bad_request("'thinking' must be {\"type\": \"enabled\" | \"disabled\"}", "thinking");
    const std::string type = (*t)["type"].get<std::string>();
    if (type != "enabled" && type != "disabled")
      bad_request("'thinking.type' must be \"enabled\" or \"disabled\", got \"" + type + "\"", "thinking");
    on = type == "enabled";
  }
  std::string effort;
  if (const ojson* k = f.get("chat_template_kwargs")) {
    if (!k->is_object()) bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    for (const char* key : {"thinking", "enable_thinking"}) {
      if (!on && k->contains(key) && !(*k)[key].is_null()) {
        on = read_bool((*k)[key], std::string("chat_template_kwargs.") + key);
      }
    }
    if (k->contains("reasoning_effort") && !(*k)["reasoning_effort"].is_null())
      effort = read_string((*k)["reasoning_effort"], "chat_template_kwargs.reasoning_effort");
  }
  if (auto e = f.string("reasoning_effort")) effort = *e;
  if (!effort.empty()) effort = normalize_reasoning_effort(effort);
  if (effort == "none") {
    if (!on) on = false;
    effort.clear();
  }
  const bool thinking = on.value_or(cfg.default_thinking);
  if (!thinking) return {ThinkingMode::kChat, ""};
  if (effort.empty()) effort = "high";  // hosted default when thinking
  // Encoder profile mapping: the preview encoder only knows "max" (others add nothing).
  if (cfg.effort_profile == EffortProfile::kPreview) effort = effort == "max" ? "max" : "";
  return {ThinkingMode::kThinking, effort};
}

// Tools + tool_choice (§4.4). Returns the forced DSML prefix ("" unless required/named).
std::string parse_tools(const Fields& f, ojson& messages, ThinkingMode mode, GenerationPlan& p) {
  const ojson* tools = f.get("tools");
  std::vector<std::string> names;
  if (tools) {
    if (!tools->is_array()) bad_request("'tools' must be an array", "tools");
    for (const auto& t : *tools) {
      if (!t.is_object() || (t.contains("type") && t["type"] != "function"))
        bad_request("only tools of type \"function\" are supported", "tools");
      if (!t.contains("function") || !t["function"].is_object() || !t["function"].contains("name") ||
          !t["function"]["name"].is_string() || t["function"]["name"].get<std::string>().empty())
        bad_request("each tool needs a \"function\" object with a non-empty \"name\"", "tools");
      names.push_back(t["function"]["name"].get<std::string>());
    }
    if (!tools->empty()) {
      try {
        attach_tools(messages, *tools);
      } catch (const Error& e) {
        bad_request(e.what(), "tools");
      }
    }
  }
  const bool have_tools = !names.empty();
  std::string choice = have_tools ? "auto" : "none", named;
  if (const ojson* tc = f.get("tool_choice")) {
    if (tc->is_string()) {
      choice = tc->get<std::string>();
      if (choice != "auto" && choice != "none" && choice != "required")
        bad_request("'tool_choice' must be \"none\", \"auto\", \"required\" or a named function", "tool_choice");
    } else if (tc->is_object() && tc->contains("type") && (*tc)["type"] == "function" && tc->contains("function") &&
               (*tc)["function"].is_object() && (*tc)["function"].contains("name") &&
               (*tc)["function"]["name"].is_string()) {
      choice = "named";
      named = (*tc)["function"]["name"].get<std::string>();
      if (std::find(names.begin(), names.end(), named) == names.end())
        bad_request("tool_choice names function \"" + named + "\", which is not in 'tools'", "tool_choice");
    } else {
      bad_request("'tool_choice' must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                  "tool_choice");
    }
  }
  if ((choice == "required" || choice == "auto") && !have_tools && f.get("tool_choice"))
    bad_request("tool_choice \"" + choice + "\" needs 'tools'", "tool_choice");
  p.parse_tools = have_tools && choice != "none";
  if (auto v = f.boolean("parallel_tool_calls")) p.parallel_tool_calls = *v;
  if (choice != "required" && choice != "named") return "";
  // Forced calls by prefilling the DSML opening (§4.4 b); there is no constrained decoding,
  // and in thinking mode the block could only be injected after </think> (two-phase).
  if (mode == ThinkingMode::kThinking)
    bad_request("tool_choice \"" + choice +
                    "\" is not supported in thinking mode; disable thinking (\"thinking\": {\"type\": \"disabled\"})",
                "tool_choice");
  std::string prefix = std::string("\n\n<") + dsml::kDsml + "tool_calls>\n";
  if (choice == "named") prefix += std::string("<") + dsml::kDsml + "invoke name=\"" + named + "\">\n";
  return prefix;
}

// §4.6.6: the last message decides whether there is a generation prompt.
void check_last_message(ojson& messages, const Fields& f) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const ojson& m = messages[i];
    if (!m.is_object()) bad_request("messages[" + std::to_string(i) + "] must be an object", "messages");
    if (!m.contains("role") || !m["role"].is_string())
      bad_request("messages[" + std::to_string(i) + "].role must be a string", "messages");
    const std::string role = m["role"].get<std::string>();
    static const char* known[] = {"system", "developer", "user", "assistant", "tool"};
    if (std::none_of(std::begin(known), std::end(known), [&](const char* k) { return role == k; }))
      bad_request("messages[" + std::to_string(i) + "].role '" + role + "' is not supported", "messages");
  }
  ojson& last = messages.back();
  const std::string role = last["role"].get<std::string>();
  if (role == "user" || role == "tool" || role == "developer") return;
  const bool prefix = last.contains("prefix") && last["prefix"].is_boolean() && last["prefix"].get<bool>();
  const bool cont = f.boolean("continue_final_message").value_or(false);
  if (role == "assistant" && (prefix || cont)) {
    last["wo_eos"] = true;  // the model continues this text
    return;
  }
  bad_request("the last message must be from the user or a tool (or an assistant message with \"prefix\": true)",
              "messages");
}

}  // namespace

std::string normalize_reasoning_effort(const std::string& e) {
  if (e == "none") return "none";
  if (e == "minimal" || e == "low") return "low";
  if (e == "medium" || e == "high" || e == "xhigh") return "high";
  if (e == "max" || e == "ultra") return "max";
  bad_request("'reasoning_effort' must be one of none, minimal, low, medium, high, xhigh, max, got \"" + e + "\"",
              "reasoning_effort");
}

GenerationPlan parse_chat_request(const ojson& body, const ApiConfig& cfg, const Tokenizer& tok) {
  Fields f(body);
  check_model(f, cfg);
  GenerationPlan p;
  p.chat = true;
  const ojson* msgs = f.get("messages");
  if (!msgs || !msgs->is_array() || msgs->empty()) bad_request("'messages' must be a non-empty array", "messages");
  ojson messages = *msgs;
  check_last_message(messages, f);
  parse_common(f, tok, p);
  parse_chat_logprobs(f, p);
  auto mt = f.integer("max_completion_tokens", 1, INT64_MAX);
  if (!mt) mt = f.integer("max_tokens", 1, INT64_MAX);
  if (mt) p.stop.max_tokens = *mt;

  const ThinkingChoice tc = thinking_choice(f, cfg);
  p.mode = tc.mode;
  p.include_reasoning = f.boolean("include_reasoning").value_or(true);
  if (p.mode == ThinkingMode::kThinking && cfg.thinking_sampling_override &&
      f.boolean("deepseek_v4_sampling_override").value_or(true)) {
    const auto seed = p.sampling.seed;
    const auto bias = p.sampling.logit_bias;
    p.sampling = SamplingParams{};  // temperature 1, top_p 1, no top_k, no penalties
    p.sampling.seed = seed;
    p.sampling.logit_bias = bias;
    parse_chat_logprobs(f, p);  // what is reported, not how tokens are drawn: kept
  }
  p.forced_prefix = parse_tools(f, messages, p.mode, p);

  if (const ojson* rf = f.get("response_format")) {
    ojson schema;
    try {
      schema = response_format_schema(*rf);
    } catch (const Error& e) {
      bad_request(e.what(), "response_format");
    }
    if (!schema.is_null()) {  // rendered on the first system message (§2.12)
      if (messages[0].value("role", "") != "system") messages.insert(messages.begin(), ojson{{"role", "system"}});
      messages[0]["response_format"] = schema;
    }
  }

  EncodeOptions eo;
  eo.thinking_mode = p.mode;
  eo.reasoning_effort = tc.effort;
  eo.profile = cfg.effort_profile;
  if (const ojson* k = f.get("chat_template_kwargs"); k && k->contains("drop_thinking") && !(*k)["drop_thinking"].is_null())
    eo.drop_thinking = read_bool((*k)["drop_thinking"], "chat_template_kwargs.drop_thinking");
  std::string text;
  try {
    text = encode_messages(messages, eo);
  } catch (const Error& e) {
    bad_request(std::string("messages: ") + e.what(), "messages");
  } catch (const nlohmann::json::exception& e) {
    bad_request(std::string("messages: ") + e.what(), "messages");
  }
  text += p.forced_prefix;
  for (TokenId id : tok.encode(text)) p.prompt.push_back(static_cast<int32_t>(id));
  check_length(p, cfg, "messages");
  return p;
}

GenerationPlan parse_completion_request(const ojson& body, const ApiConfig& cfg, const Tokenizer& tok) {
  Fields f(body);
  check_model(f, cfg);
  GenerationPlan p;
  p.chat = false;
  const ojson* pr = f.get("prompt");
  if (!pr) bad_request("'prompt' is required", "prompt");
  ojson prompt = *pr;
  if (prompt.is_array() && prompt.size() == 1 && (prompt[0].is_string() || prompt[0].is_array())) prompt = prompt[0];
  if (prompt.is_string()) {
    for (TokenId id : tok.encode(prompt.get<std::string>())) p.prompt.push_back(static_cast<int32_t>(id));
    const int32_t bos = static_cast<int32_t>(tok.token_to_id(dsml::kBos).value_or(0));
    if (cfg.completions_add_bos && (p.prompt.empty() || p.prompt[0] != bos)) p.prompt.insert(p.prompt.begin(), bos);
  } else if (prompt.is_array() && !prompt.empty() && std::all_of(prompt.begin(), prompt.end(), [](const ojson& v) {
               return v.is_number_integer();
             })) {
    for (const auto& v : prompt) {
      const int64_t id = v.get<int64_t>();
      if (id < 0 || !tok.is_valid_id(static_cast<TokenId>(id)))
        bad_request("'prompt': token id " + std::to_string(id) + " is not in the vocabulary", "prompt");
      p.prompt.push_back(static_cast<int32_t>(id));
    }
  } else if (prompt.is_array() && prompt.size() > 1) {
    bad_request("batched prompts are not supported: send one prompt per request", "prompt");
  } else {
    bad_request("'prompt' must be a string or an array of token ids", "prompt");
  }
  parse_common(f, tok, p);
  parse_completion_logprobs(f, p);
  if (f.boolean("echo").value_or(false)) bad_request("echo is not supported", "echo");
  if (auto s = f.string("suffix"); s && !s->empty())
    bad_request("suffix (fill-in-the-middle) is not supported for DeepSeek-V4", "suffix");
  p.stop.max_tokens = f.integer("max_tokens", 1, INT64_MAX).value_or(16);  // OpenAI's default
  check_length(p, cfg, "prompt");
  return p;
}

}  // namespace dsv4
