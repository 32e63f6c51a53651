// TEST ONLY (dsv4 serve --fake-output-file): a ModelBackend that replays scripted model
// output instead of running a model, so reasoning and DSML tool-call parsing can be tested
// end to end through the real engine, tokenizer, detokenizer and parser. Off by default.
//
// Script file: [{"when": "text in the prompt", "output": "what the model writes"}, ...].
// A sequence replays the first entry whose `when` occurs in its decoded prompt ("" matches
// any), one token per step, then EOS; no match → EOS at once (an empty completion). The
// position in the script is found from the sequence's own tokens, so batching, preemption
// (recompute) and prefix-cache restores replay exactly like a real deterministic model.
#pragma once
#include <string>
#include <vector>

#include "chat/tokenizer.h"
#include "runtime/backend.h"

namespace dsv4 {

struct ScriptEntry {
  std::string when;
  std::vector<int32_t> output;  // tokenized output
};

std::vector<ScriptEntry> load_script(const std::string& path, const Tokenizer& tok);

class ScriptedBackend final : public ModelBackend {
 public:
  // cfg: the checkpoint's config (state sizes for the KV budget); its vocab is widened to the
  // tokenizer's so every scripted id can be sampled.
  ScriptedBackend(ModelConfig cfg, const Tokenizer& tok, std::vector<ScriptEntry> script);
  const ModelConfig& config() const override { return cfg_; }
  bool fixed_capacity() const override { return false; }
  std::unique_ptr<BackendSequence> new_sequence(int64_t capacity) override;
  std::vector<float> forward(std::span<const BackendChunk> chunks) override;
  std::unique_ptr<BackendSnapshot> snapshot(const BackendSequence& seq) override;
  std::unique_ptr<BackendSequence> restore(const BackendSnapshot& snap, int64_t capacity) override;

  // Next token for a sequence that has consumed `tokens` (exposed for tests).
  int32_t next_token(const std::vector<int32_t>& tokens) const;

 private:
  ModelConfig cfg_;
  const Tokenizer* tok_;
  std::vector<ScriptEntry> script_;
  int32_t eos_;
};

}  // namespace dsv4
