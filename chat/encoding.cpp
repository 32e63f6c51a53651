#include "chat/encoding.h"

#include <algorithm>
#include <map>

#include "core/error.h"

namespace dsv4 {

namespace {

using namespace dsml;

const char* const kEffortMax =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve the root "
    "cause, rigorously stress-testing your logic against all potential paths, edge cases, and adversarial "
    "scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, considered "
    "alternative, and rejected hypothesis to ensure absolutely no assumption is left unchecked.\n\n";

const char* const kEffort0731Max =
    "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n"
    "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively decompose "
    "the problem into its most fundamental components, trace every causal chain to its root, and resolve the "
    "underlying cause rather than any surface symptom.\n"
    "Do not stop reasoning until you have independently verified the solution from multiple angles and are certain "
    "that no assumption remains unchecked and no error remains undiscovered.\n\n";

const char* const kToolsHead =
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "
    "\"<｜DSML｜tool_calls>\" block like the following:\n\n"
    "<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
    "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n";
const char* const kToolsTail = "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";
const char* const kResponseFormatHead =
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n";

const std::map<std::string, std::string>& task_tokens() {
  static const std::map<std::string, std::string> m = {
      {"action", "<｜action｜>"},       {"query", "<｜query｜>"}, {"authority", "<｜authority｜>"},
      {"domain", "<｜domain｜>"},       {"title", "<｜title｜>"}, {"read_url", "<｜read_url｜>"}};
  return m;
}

std::string role_of(const ojson& m) {
  DSV4_CHECK(m.is_object(), "each message must be a JSON object");
  const auto it = m.find("role");
  DSV4_CHECK(it != m.end() && it->is_string(), "message without a string 'role'");
  return it->get<std::string>();
}

// Python truthiness of an optional field (missing/null/""/[]/{}/false are all falsy).
bool truthy(const ojson& m, const char* key) {
  const auto it = m.find(key);
  if (it == m.end() || it->is_null()) return false;
  if (it->is_string() || it->is_array() || it->is_object()) return !it->empty();
  if (it->is_boolean()) return it->get<bool>();
  return true;
}

bool has_task(const ojson& m) {
  const auto it = m.find("task");
  return it != m.end() && !it->is_null();
}

// OpenAI content: string, null, or an array of parts (text parts joined; others rejected).
std::string content_text(const ojson& c, const std::string& sep, const char* what) {
  if (c.is_null()) return "";
  if (c.is_string()) return c.get<std::string>();
  DSV4_CHECK(c.is_array(), what, " content must be a string, null or an array of parts");
  std::string out;
  bool first = true;
  for (const auto& p : c) {
    DSV4_CHECK(p.is_object() && p.value("type", "") == "text" && p.contains("text") && p["text"].is_string(),
               what, " content part of type '", p.is_object() ? p.value("type", "?") : "?",
               "' is not supported by this text-only model");
    if (!first) out += sep;
    first = false;
    out += p["text"].get<std::string>();
  }
  return out;
}

// §4.6 normalization: produce messages the reference algorithm accepts.
ojson normalize(const ojson& in, const EncodeOptions& opt) {
  DSV4_CHECK(in.is_array(), "messages must be a JSON array");
  ojson out = ojson::array();
  for (const auto& m0 : in) {
    ojson m = m0;
    std::string role = role_of(m);
    if (role == "developer" && opt.developer_as_system) m["role"] = role = "system";
    if (role != "tool" && m.contains("content")) {
      m["content"] = content_text(m["content"], opt.content_part_separator, role.c_str());
    }
    if (role == "tool" && m.contains("content") && !m["content"].is_null()) {
      DSV4_CHECK(m["content"].is_string() || m["content"].is_array(), "tool content must be a string or an array");
    }
    if (role == "assistant" && !m.contains("reasoning_content") && m.contains("reasoning")) {
      m["reasoning_content"] = m["reasoning"];
    }
    if (m.contains("reasoning_content") && !m["reasoning_content"].is_null()) {
      DSV4_CHECK(m["reasoning_content"].is_string(), "reasoning_content must be a string");
    }
    out.push_back(std::move(m));
  }
  return out;
}

std::string str_or_empty(const ojson& m, const char* key) {
  const auto it = m.find(key);
  if (it == m.end() || it->is_null()) return "";
  DSV4_CHECK(it->is_string(), "field '", key, "' must be a string");
  return it->get<std::string>();
}

// Step 1 (§2.3): fold tool messages into user turns.
ojson merge_tool_messages(const ojson& msgs) {
  ojson merged = ojson::array();
  for (const auto& msg : msgs) {
    const std::string role = role_of(msg);
    auto last_user_blocks = [&]() -> bool {
      return !merged.empty() && role_of(merged.back()) == "user" && merged.back().contains("content_blocks");
    };
    if (role == "tool") {
      ojson block = {{"type", "tool_result"},
                     {"tool_use_id", str_or_empty(msg, "tool_call_id")},
                     {"content", msg.contains("content") && !msg["content"].is_null() ? msg["content"] : ojson("")}};
      if (last_user_blocks()) {
        merged.back()["content_blocks"].push_back(std::move(block));
      } else {
        merged.push_back({{"role", "user"}, {"content_blocks", ojson::array({std::move(block)})}});
      }
    } else if (role == "user") {
      const std::string text = str_or_empty(msg, "content");
      ojson block = {{"type", "text"}, {"text", text}};
      if (last_user_blocks() && !has_task(merged.back())) {
        merged.back()["content_blocks"].push_back(std::move(block));
      } else {
        ojson nm = {{"role", "user"}, {"content", text}, {"content_blocks", ojson::array({std::move(block)})}};
        for (const char* k : {"task", "wo_eos", "mask"})
          if (msg.contains(k)) nm[k] = msg[k];
        merged.push_back(std::move(nm));
      }
    } else {
      merged.push_back(msg);
    }
  }
  return merged;
}

// Step 2 (§2.4): order tool results by the call order of the preceding assistant turn.
void sort_tool_results_by_call_order(ojson& msgs) {
  std::map<std::string, int> order;
  for (auto& msg : msgs) {
    const std::string role = role_of(msg);
    if (role == "assistant" && truthy(msg, "tool_calls")) {
      order.clear();
      int idx = 0;
      for (const auto& tc : msg["tool_calls"]) {
        std::string id;
        if (tc.is_object() && tc.contains("id") && tc["id"].is_string()) id = tc["id"].get<std::string>();
        if (id.empty() && tc.is_object() && tc.contains("function") && tc["function"].is_object() &&
            tc["function"].contains("id") && tc["function"]["id"].is_string())
          id = tc["function"]["id"].get<std::string>();
        if (!id.empty()) order[id] = idx;
        ++idx;
      }
    } else if (role == "user" && truthy(msg, "content_blocks")) {
      auto& blocks = msg["content_blocks"];
      std::vector<ojson> tools;
      for (const auto& b : blocks)
        if (b.value("type", "") == "tool_result") tools.push_back(b);
      if (tools.size() > 1 && !order.empty()) {
        auto pos = [&](const ojson& b) {
          const auto it = order.find(b.value("tool_use_id", ""));
          return it == order.end() ? 0 : it->second;
        };
        std::stable_sort(tools.begin(), tools.end(), [&](const ojson& a, const ojson& b) { return pos(a) < pos(b); });
        std::size_t k = 0;
        for (auto& b : blocks)
          if (b.value("type", "") == "tool_result") b = tools[k++];
      }
    }
  }
}

int find_last_user_index(const ojson& msgs) {
  for (int i = static_cast<int>(msgs.size()) - 1; i >= 0; --i) {
    const std::string r = role_of(msgs[i]);
    if (r == "user" || r == "developer") return i;
  }
  return -1;
}

// Step 3 (§2.5).
ojson drop_thinking_messages(const ojson& msgs) {
  const int last = find_last_user_index(msgs);
  ojson out = ojson::array();
  for (int i = 0; i < static_cast<int>(msgs.size()); ++i) {
    const std::string r = role_of(msgs[i]);
    if (r == "user" || r == "system" || r == "tool" || r == "latest_reminder" || r == "direct_search_results" ||
        i >= last) {
      out.push_back(msgs[i]);
    } else if (r == "assistant") {
      ojson m = msgs[i];
      m.erase("reasoning_content");
      out.push_back(std::move(m));
    }  // anything else before the last user turn (notably developer) is dropped
  }
  return out;
}

std::string render_tools(const ojson& tools) {
  std::string s = kToolsHead;
  bool first = true;
  for (const auto& t : tools) {
    DSV4_CHECK(t.is_object() && t.contains("function"), "each tool must be {\"type\":\"function\",\"function\":{...}}");
    if (!first) s += "\n";
    first = false;
    json_dumps_append(t["function"], s);
  }
  return s + kToolsTail;
}

// §2.8: OpenAI arguments -> DSML parameter lines.
std::string encode_arguments_to_dsml(const ojson& arguments) {
  ojson args;
  if (arguments.is_null()) {
    args = ojson::object();
  } else if (arguments.is_object()) {
    args = arguments;  // already parsed (vLLM tolerance)
  } else if (arguments.is_string()) {
    const std::string& raw = arguments.get_ref<const std::string&>();
    if (raw.empty()) {
      args = ojson::object();  // vLLM: "" means no parameters
    } else {
      try {
        args = ojson::parse(raw);
      } catch (const nlohmann::json::exception&) {
        args = ojson{{"arguments", raw}};  // reference fallback for unparsable text
      }
    }
  } else {
    fail("tool call arguments must be a JSON string or object");
  }
  DSV4_CHECK(args.is_object(), "tool call arguments must encode a JSON object, got: ", json_dumps(args));
  std::string out;
  bool first = true;
  for (const auto& [k, v] : args.items()) {
    if (!first) out += "\n";
    first = false;
    const bool is_str = v.is_string();
    out += "<｜DSML｜parameter name=\"" + k + "\" string=\"" + (is_str ? "true" : "false") + "\">";
    out += is_str ? v.get<std::string>() : json_dumps(v);
    out += "</｜DSML｜parameter>";
  }
  return out;
}

std::string render_tool_calls(const ojson& tool_calls) {
  std::string s = "\n\n<｜DSML｜tool_calls>\n";
  bool first = true;
  for (const auto& tc : tool_calls) {
    DSV4_CHECK(tc.is_object() && tc.contains("function") && tc["function"].is_object(),
               "tool_calls entries must have a 'function' object");
    const auto& f = tc["function"];
    DSV4_CHECK(f.contains("name") && f["name"].is_string(), "tool call without a function name");
    if (!first) s += "\n";
    first = false;
    s += "<｜DSML｜invoke name=\"" + f["name"].get<std::string>() + "\">\n";
    s += encode_arguments_to_dsml(f.contains("arguments") ? f["arguments"] : ojson());
    s += "\n</｜DSML｜invoke>";
  }
  return s + "\n</｜DSML｜tool_calls>";
}

std::string render_block_content(const ojson& c) {
  if (c.is_null()) return "";
  if (c.is_string()) return c.get<std::string>();
  DSV4_CHECK(c.is_array(), "tool result content must be a string or an array");
  std::string out;
  bool first = true;
  for (const auto& b : c) {
    if (!first) out += "\n\n";
    first = false;
    const std::string type = b.is_object() ? b.value("type", "") : "";
    if (type == "text") {
      out += b.contains("text") && b["text"].is_string() ? b["text"].get<std::string>() : "";
    } else {
      out += "[Unsupported " + (type.empty() ? std::string("None") : type) + "]";
    }
  }
  return out;
}

std::string render_message(int index, const ojson& msgs, const EncodeOptions& opt, bool drop_thinking) {
  const bool thinking = opt.thinking_mode == ThinkingMode::kThinking;
  const ojson& msg = msgs[index];
  const int last_user = find_last_user_index(msgs);
  const std::string role = role_of(msg);
  std::string p;

  if (index == 0 && thinking) p += reasoning_effort_prefix(opt.profile, opt.reasoning_effort);

  auto tools_and_format = [&](std::string& s) {
    if (truthy(msg, "tools")) {
      DSV4_CHECK(msg["tools"].is_array(), "'tools' must be an array");
      s += "\n\n" + render_tools(msg["tools"]);
    }
    if (truthy(msg, "response_format")) s += "\n\n" + std::string(kResponseFormatHead) + json_dumps(msg["response_format"]);
  };

  if (role == "system") {
    p += str_or_empty(msg, "content");
    tools_and_format(p);
  } else if (role == "developer") {
    const std::string c = str_or_empty(msg, "content");
    DSV4_CHECK(!c.empty(), "a developer message must have non-empty content");
    p += kUser + c;
    tools_and_format(p);
  } else if (role == "user") {
    p += kUser;
    if (truthy(msg, "content_blocks")) {
      bool first = true;
      for (const auto& b : msg["content_blocks"]) {
        if (!first) p += "\n\n";
        first = false;
        const std::string type = b.value("type", "");
        if (type == "text") {
          p += b.contains("text") && b["text"].is_string() ? b["text"].get<std::string>() : "";
        } else if (type == "tool_result") {
          p += "<tool_result>" + render_block_content(b.contains("content") ? b["content"] : ojson("")) + "</tool_result>";
        } else {
          p += "[Unsupported " + type + "]";
        }
      }
    } else {
      p += str_or_empty(msg, "content");
    }
  } else if (role == "latest_reminder") {
    p += std::string(kLatestReminder) + str_or_empty(msg, "content");
  } else if (role == "tool") {
    fail("internal: tool messages must have been merged into user turns");
  } else if (role == "assistant") {
    std::string thinking_part;
    const bool prev_task = index >= 1 && has_task(msgs[index - 1]);
    if (thinking && !prev_task && (!drop_thinking || index > last_user))
      thinking_part = str_or_empty(msg, "reasoning_content") + kThinkClose;
    p += thinking_part + str_or_empty(msg, "content");
    if (truthy(msg, "tool_calls")) {
      DSV4_CHECK(msg["tool_calls"].is_array(), "'tool_calls' must be an array");
      p += render_tool_calls(msg["tool_calls"]);
    }
    const bool wo_eos = msg.contains("wo_eos") && msg["wo_eos"].is_boolean() && msg["wo_eos"].get<bool>();
    if (!wo_eos) p += kEos;
  } else {
    fail("unknown message role '", role, "'");
  }

  // Transition suffix (the generation prompt when this is the last message).
  if (index + 1 < static_cast<int>(msgs.size())) {
    const std::string next = role_of(msgs[index + 1]);
    if (next != "assistant" && next != "latest_reminder") return p;
  }
  if (has_task(msg)) {
    DSV4_CHECK(msg["task"].is_string() && task_tokens().count(msg["task"].get<std::string>()),
               "invalid task '", msg["task"].dump(), "' (valid: action, query, authority, domain, title, read_url)");
    const std::string task = msg["task"].get<std::string>();
    if (task != "action") {
      p += task_tokens().at(task);
    } else {
      p += std::string(kAssistant) + (thinking ? kThinkOpen : kThinkClose) + task_tokens().at(task);
    }
  } else if (role == "user" || role == "developer") {
    p += kAssistant;
    if (thinking && (!drop_thinking || index >= last_user))
      p += kThinkOpen;
    else
      p += kThinkClose;
  }
  return p;
}

}  // namespace

std::string reasoning_effort_prefix(EffortProfile profile, const std::string& effort) {
  if (profile == EffortProfile::kPreview) {
    if (effort.empty() || effort == "high") return "";
    if (effort == "max") return kEffortMax;
    fail("reasoning effort '", effort, "' is not valid for the preview encoder (use high or max)");
  }
  if (effort.empty() || effort == "low") return "";
  if (effort == "high") return kEffortMax;
  if (effort == "max") return kEffort0731Max;
  fail("reasoning effort '", effort, "' is not valid for the 0731 encoder (use low, high or max)");
}

std::string encode_messages(const ojson& messages_in, const EncodeOptions& opt, const ojson& context_in) {
  // Validate the effort up front so chat mode rejects bad values too.
  (void)reasoning_effort_prefix(opt.profile, opt.reasoning_effort);
  const ojson raw_msgs = normalize(messages_in, opt);
  const ojson raw_ctx = context_in.is_null() ? ojson::array() : normalize(context_in, opt);
  const std::size_t nctx_raw = raw_ctx.size();

  // Tool-result order is decided over context + messages (calls may sit in the context).
  ojson msgs = merge_tool_messages(raw_msgs);
  {
    ojson all = raw_ctx;
    for (auto& m : msgs) all.push_back(m);
    sort_tool_results_by_call_order(all);
    msgs = ojson::array();
    for (std::size_t i = nctx_raw; i < all.size(); ++i) msgs.push_back(all[i]);
  }
  ojson ctx = merge_tool_messages(raw_ctx);
  sort_tool_results_by_call_order(ctx);

  ojson full = ctx;
  for (const auto& m : msgs) full.push_back(m);

  std::string prompt = (opt.add_bos && ctx.empty()) ? kBos : "";
  bool drop = opt.drop_thinking;
  for (const auto& m : full)
    if (truthy(m, "tools")) drop = false;

  std::size_t num_render = msgs.size(), ctx_len = ctx.size();
  if (opt.thinking_mode == ThinkingMode::kThinking && drop) {
    full = drop_thinking_messages(full);
    num_render = full.size() - drop_thinking_messages(ctx).size();
    ctx_len = full.size() - num_render;
  }
  for (std::size_t i = 0; i < num_render; ++i) prompt += render_message(static_cast<int>(i + ctx_len), full, opt, drop);
  return prompt;
}

void attach_tools(ojson& messages, const ojson& tools) {
  DSV4_CHECK(messages.is_array(), "messages must be a JSON array");
  DSV4_CHECK(tools.is_array(), "tools must be a JSON array");
  for (const auto& t : tools) {
    DSV4_CHECK(t.is_object() && t.value("type", "function") == "function" && t.contains("function") &&
                   t["function"].is_object(),
               "only tools of type \"function\" with a \"function\" object are supported");
  }
  if (tools.empty()) return;
  if (!messages.empty()) {
    const std::string r = messages[0].value("role", "");
    if (r == "system" || r == "developer") {
      messages[0]["tools"] = tools;
      return;
    }
  }
  messages.insert(messages.begin(), ojson{{"role", "system"}, {"tools", tools}});
}

ojson response_format_schema(const ojson& rf) {
  if (rf.is_null()) return nullptr;
  DSV4_CHECK(rf.is_object(), "response_format must be an object");
  const std::string type = rf.value("type", "");
  if (type == "text") return nullptr;
  if (type == "json_object") return ojson{{"type", "object"}};
  if (type == "json_schema") {
    DSV4_CHECK(rf.contains("json_schema") && rf["json_schema"].is_object() && rf["json_schema"].contains("schema"),
               "response_format json_schema needs json_schema.schema");
    return rf["json_schema"]["schema"];
  }
  fail("response_format type '", type, "' is not supported");
}

}  // namespace dsv4
