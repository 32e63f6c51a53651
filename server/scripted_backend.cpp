#include "server/scripted_backend.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "chat/json_dumps.h"
#include "core/error.h"

namespace dsv4 {

namespace {

struct ScriptSeq final : BackendSequence {
  std::vector<int32_t> tokens;
  int64_t pos() const override { return static_cast<int64_t>(tokens.size()); }
  size_t bytes() const override { return tokens.size() * sizeof(int32_t); }
};

struct ScriptSnap final : BackendSnapshot {
  std::vector<int32_t> tokens;
  int64_t pos() const override { return static_cast<int64_t>(tokens.size()); }
  size_t bytes() const override { return tokens.size() * sizeof(int32_t); }
};

}  // namespace

std::vector<ScriptEntry> load_script(const std::string& path, const Tokenizer& tok) {
  std::ifstream f(path);
  DSV4_CHECK(f, "--fake-output-file: cannot open ", path);
  std::stringstream ss;
  ss << f.rdbuf();
  ojson j;
  try {
    j = parse_json_ordered(ss.str());
  } catch (const Error& e) {
    fail("--fake-output-file ", path, ": ", e.what());
  }
  DSV4_CHECK(j.is_array(), "--fake-output-file ", path, ": expected an array of {\"when\", \"output\"}");
  std::vector<ScriptEntry> out;
  for (const auto& e : j) {
    DSV4_CHECK(e.is_object() && e.contains("when") && e["when"].is_string() && e.contains("output") &&
                   e["output"].is_string(),
               "--fake-output-file ", path, ": each entry needs string fields \"when\" and \"output\"");
    ScriptEntry s;
    s.when = e["when"].get<std::string>();
    for (TokenId id : tok.encode(e["output"].get<std::string>())) s.output.push_back(static_cast<int32_t>(id));
    out.push_back(std::move(s));
  }
  return out;
}

ScriptedBackend::ScriptedBackend(ModelConfig cfg, const Tokenizer& tok, std::vector<ScriptEntry> script)
    : cfg_(std::move(cfg)), tok_(&tok), script_(std::move(script)), eos_(static_cast<int32_t>(cfg_.eos_token_id)) {
  cfg_.vocab_size = std::max<int64_t>(cfg_.vocab_size, static_cast<int64_t>(tok.vocab_size()));
}

int32_t ScriptedBackend::next_token(const std::vector<int32_t>& tokens) const {
  // The longest k such that the sequence ends with the first k output tokens of the entry
  // its prompt (everything before those k) selects.
  const size_t len = tokens.size();
  size_t longest = 0;
  for (const auto& s : script_) longest = std::max(longest, s.output.size());
  for (size_t k = std::min(len, longest) + 1; k-- > 0;) {
    bool any = false;  // cheap filter before decoding the prompt
    for (const auto& s : script_)
      any = any || (k <= s.output.size() && std::equal(s.output.begin(), s.output.begin() + static_cast<long>(k),
                                                       tokens.end() - static_cast<long>(k)));
    if (!any) continue;
    std::vector<TokenId> prompt(tokens.begin(), tokens.end() - static_cast<long>(k));
    std::erase_if(prompt, [&](TokenId t) { return !tok_->is_valid_id(t); });
    const std::string text = tok_->decode(prompt);
    for (const auto& s : script_) {
      if (text.find(s.when) == std::string::npos) continue;
      // The first entry that matches this prompt decides; it must be the one being replayed.
      if (k <= s.output.size() &&
          std::equal(s.output.begin(), s.output.begin() + static_cast<long>(k), tokens.end() - static_cast<long>(k)))
        return k < s.output.size() ? s.output[k] : eos_;
      break;
    }
  }
  return eos_;
}

std::unique_ptr<BackendSequence> ScriptedBackend::new_sequence(int64_t) { return std::make_unique<ScriptSeq>(); }

std::vector<float> ScriptedBackend::forward(std::span<const BackendChunk> chunks) {
  const size_t V = static_cast<size_t>(cfg_.vocab_size);
  std::vector<float> out;
  for (const auto& c : chunks) {
    auto* s = dynamic_cast<ScriptSeq*>(c.seq);
    DSV4_CHECK(s, "ScriptedBackend: sequence of another backend");
    s->tokens.insert(s->tokens.end(), c.tokens.begin(), c.tokens.end());
    if (!c.want_logits) continue;
    // A one-hot-like row: any sampler setting picks the scripted token.
    const size_t at = out.size();
    out.resize(at + V, -30.0f);
    out[at + static_cast<size_t>(next_token(s->tokens))] = 30.0f;
  }
  return out;
}

std::unique_ptr<BackendSnapshot> ScriptedBackend::snapshot(const BackendSequence& seq) {
  auto* s = dynamic_cast<const ScriptSeq*>(&seq);
  DSV4_CHECK(s, "ScriptedBackend: sequence of another backend");
  auto snap = std::make_unique<ScriptSnap>();
  snap->tokens = s->tokens;
  return snap;
}

std::unique_ptr<BackendSequence> ScriptedBackend::restore(const BackendSnapshot& snap, int64_t) {
  auto* s = dynamic_cast<const ScriptSnap*>(&snap);
  DSV4_CHECK(s, "ScriptedBackend: snapshot of another backend");
  auto seq = std::make_unique<ScriptSeq>();
  seq->tokens = s->tokens;
  return seq;
}

}  // namespace dsv4
