// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (serving.md §1).
// encode() behaves like HF `Tokenizer.encode(text, add_special_tokens=False)`: added tokens
// are matched first (leftmost-longest, non-normalized ones on the raw text, then normalized
// ones on the gaps), the gaps are pre-tokenized and each piece is BPE-merged by rank. No
// BOS/EOS is ever added (the chat encoder writes BOS itself; post_processor is ignored).
// Input that is not valid UTF-8 is first repaired to U+FFFD per maximal ill-formed subpart
// (what Python's decode(errors="replace") hands HF). Thread-safe after construction.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "chat/pretokenizer.h"

namespace dsv4 {

using TokenId = uint32_t;

struct AddedToken {
  TokenId id = 0;
  std::string content;
  bool special = false;
  bool normalized = false;
};

class Tokenizer {
 public:
  static Tokenizer from_file(const std::string& path);
  static Tokenizer from_json_string(std::string_view json);

  std::vector<TokenId> encode(std::string_view text) const;
  void encode_append(std::string_view text, std::vector<TokenId>& out) const;

  // HF decode: token bytes concatenated, then lossy UTF-8. Unknown ids are an error.
  std::string decode(std::span<const TokenId> ids, bool skip_special_tokens = false) const;
  // Raw bytes one token contributes to the decoded text (possibly a partial UTF-8 sequence).
  std::string_view token_bytes(TokenId id) const;
  bool is_special(TokenId id) const { return id < special_.size() && special_[id]; }
  bool is_valid_id(TokenId id) const { return id < has_id_.size() && has_id_[id]; }

  // Id of a vocabulary or added token, by its tokenizer.json spelling.
  std::optional<TokenId> token_to_id(std::string_view token) const;
  // One past the largest id.
  std::size_t vocab_size() const { return has_id_.size(); }
  const std::vector<AddedToken>& added_tokens() const { return added_; }
  const Pretokenizer& pretokenizer() const { return pre_; }

  // BPE of one pre-tokenized piece of raw bytes (exposed for tests and benchmarks).
  void bpe_piece(std::string_view piece, std::vector<TokenId>& out) const;

 private:
  struct Trie {
    struct Node {
      std::vector<std::pair<unsigned char, int32_t>> next;
      int32_t token = -1;  // id of the token ending here
    };
    std::vector<Node> nodes{1};
    bool first[256] = {};
    void insert(std::string_view s, TokenId id);
    // Length of the longest token starting at s[0] (0 if none) and its id.
    std::size_t longest(std::string_view s, TokenId* id) const;
    bool empty() const { return nodes.size() == 1; }
  };
  struct MergeTable {  // open addressing: (left id, right id) -> (rank, merged id)
    std::vector<uint64_t> keys;
    std::vector<uint64_t> vals;
    uint64_t mask = 0;
    void build(std::size_t n);
    void insert(TokenId a, TokenId b, uint32_t rank, TokenId merged);
    bool find(TokenId a, TokenId b, uint32_t* rank, TokenId* merged) const;
  };

  Tokenizer() = default;
  void load(const std::string& json_text);
  void split_added(std::string_view text, const Trie& trie, std::vector<std::pair<std::string_view, int64_t>>& out) const;
  void encode_plain(std::string_view text, std::vector<TokenId>& out) const;
  void bpe_large(std::string_view piece, std::vector<TokenId>& out) const;

  Pretokenizer pre_;
  Trie trie_raw_, trie_norm_;
  MergeTable merges_;
  TokenId byte_id_[256] = {};
  bool ignore_merges_ = false;
  std::unordered_map<std::string, TokenId> whole_;  // byte string -> id, only for ignore_merges
  std::unordered_map<std::string, TokenId> token_id_;
  std::string bytes_;                 // all token byte strings back to back
  std::vector<uint32_t> bytes_off_;   // id -> [off[id], off[id+1])
  std::vector<bool> has_id_, special_;
  std::vector<AddedToken> added_;
  uint64_t instance_id_ = 0;  // keys the per-thread piece cache
};

// GPT-2 byte<->unicode map used by byte-level BPE vocabularies.
char32_t byte_to_unicode(unsigned char b);
int unicode_to_byte(char32_t cp);  // -1 if cp is not one of the 256 mapped characters

}  // namespace dsv4
