#include "chat/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <fstream>
#include <queue>
#include <sstream>

#include <nlohmann/json.hpp>

#include "chat/utf8.h"
#include "core/error.h"

namespace dsv4 {

// ---- GPT-2 byte-level alphabet ------------------------------------------------------------

namespace {
struct ByteMap {
  char32_t to_cp[256];
  int16_t from_cp[512];  // every mapped code point is < 512
  ByteMap() {
    std::fill(std::begin(from_cp), std::end(from_cp), -1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      to_cp[b] = printable ? char32_t(b) : char32_t(256 + extra++);
      from_cp[to_cp[b]] = int16_t(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// Decodes one well-formed UTF-8 character at s[i]; advances i.
char32_t next_cp(std::string_view s, std::size_t& i) {
  const auto b = static_cast<unsigned char>(s[i]);
  int len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
  char32_t cp = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += len;
  return cp;
}

// The bytes HF's ByteLevel decoder produces for one token string: every char mapped back
// to its byte if all chars are in the alphabet, otherwise the token's own UTF-8.
std::string bytelevel_bytes(std::string_view tok, bool* all_mapped) {
  std::string out;
  std::size_t i = 0;
  while (i < tok.size()) {
    const int b = unicode_to_byte(next_cp(tok, i));
    if (b < 0) {
      *all_mapped = false;
      return std::string(tok);
    }
    out.push_back(static_cast<char>(b));
  }
  *all_mapped = true;
  return out;
}
}  // namespace

char32_t byte_to_unicode(unsigned char b) { return byte_map().to_cp[b]; }
int unicode_to_byte(char32_t cp) { return cp < 512 ? byte_map().from_cp[cp] : -1; }

// ---- added-token trie ---------------------------------------------------------------------

void Tokenizer::Trie::insert(std::string_view s, TokenId id) {
  DSV4_CHECK(!s.empty(), "added token with empty content");
  int32_t n = 0;
  first[static_cast<unsigned char>(s[0])] = true;
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    int32_t child = -1;
    for (auto& [k, v] : nodes[n].next)
      if (k == c) child = v;
    if (child < 0) {
      child = static_cast<int32_t>(nodes.size());
      nodes[n].next.emplace_back(c, child);
      nodes.emplace_back();
    }
    n = child;
  }
  nodes[n].token = static_cast<int32_t>(id);
}

std::size_t Tokenizer::Trie::longest(std::string_view s, TokenId* id) const {
  std::size_t best = 0;
  int32_t n = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    int32_t child = -1;
    for (const auto& [k, v] : nodes[n].next)
      if (k == c) {
        child = v;
        break;
      }
    if (child < 0) break;
    n = child;
    if (nodes[n].token >= 0) {
      best = i + 1;
      *id = static_cast<TokenId>(nodes[n].token);
    }
  }
  return best;
}

// ---- merge table --------------------------------------------------------------------------

namespace {
inline uint64_t pair_key(TokenId a, TokenId b) { return (uint64_t(a) << 32) | b; }
inline uint64_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  return k;
}
constexpr uint64_t kEmpty = ~0ull;
}  // namespace

void Tokenizer::MergeTable::build(std::size_t n) {
  std::size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  keys.assign(cap, kEmpty);
  vals.assign(cap, 0);
  mask = cap - 1;
}

void Tokenizer::MergeTable::insert(TokenId a, TokenId b, uint32_t rank, TokenId merged) {
  const uint64_t k = pair_key(a, b);
  for (uint64_t h = mix(k) & mask;; h = (h + 1) & mask) {
    if (keys[h] == k) return;  // duplicate merge line: HF keeps the first (lowest) rank
    if (keys[h] == kEmpty) {
      keys[h] = k;
      vals[h] = (uint64_t(rank) << 32) | merged;
      return;
    }
  }
}

bool Tokenizer::MergeTable::find(TokenId a, TokenId b, uint32_t* rank, TokenId* merged) const {
  const uint64_t k = pair_key(a, b);
  for (uint64_t h = mix(k) & mask;; h = (h + 1) & mask) {
    if (keys[h] == k) {
      *rank = static_cast<uint32_t>(vals[h] >> 32);
      *merged = static_cast<TokenId>(vals[h]);
      return true;
    }
    if (keys[h] == kEmpty) return false;
  }
}

// ---- loading ------------------------------------------------------------------------------

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  DSV4_CHECK(f, "cannot open tokenizer file ", path);
  std::stringstream ss;
  ss << f.rdbuf();
  Tokenizer t;
  try {
    t.load(ss.str());
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": malformed tokenizer.json: ", e.what());
  } catch (const Error& e) {
    fail(path, ": ", e.what());
  }
  return t;
}

Tokenizer Tokenizer::from_json_string(std::string_view json) {
  Tokenizer t;
  try {
    t.load(std::string(json));
  } catch (const nlohmann::json::exception& e) {
    fail("malformed tokenizer.json: ", e.what());
  }
  return t;
}

void Tokenizer::load(const std::string& text) {
  static std::atomic<uint64_t> next_instance{1};
  instance_id_ = next_instance++;
  const nlohmann::json j = nlohmann::json::parse(text);
  const auto& model = j.at("model");
  DSV4_CHECK(model.value("type", "BPE") == "BPE", "tokenizer model type '", model.value("type", ""),
             "' is not supported (only BPE)");
  auto null_or = [&](const char* key) { return !model.contains(key) || model[key].is_null(); };
  DSV4_CHECK(null_or("dropout"), "BPE dropout is not supported");
  DSV4_CHECK(null_or("continuing_subword_prefix") || model["continuing_subword_prefix"] == "",
             "BPE continuing_subword_prefix is not supported");
  DSV4_CHECK(null_or("end_of_word_suffix") || model["end_of_word_suffix"] == "", "BPE end_of_word_suffix is not supported");
  DSV4_CHECK(!model.value("byte_fallback", false), "BPE byte_fallback=true is not supported");
  ignore_merges_ = model.value("ignore_merges", false);

  const auto& norm = j.value("normalizer", nlohmann::json());
  DSV4_CHECK(norm.is_null() || (norm.value("type", "") == "Sequence" && norm.at("normalizers").empty()),
             "tokenizer normalizer is not supported (only none / empty Sequence)");
  const auto& dec = j.value("decoder", nlohmann::json());
  DSV4_CHECK(!dec.is_null() && dec.value("type", "") == "ByteLevel", "tokenizer decoder must be ByteLevel");
  pre_ = Pretokenizer::from_json(j.value("pre_tokenizer", nlohmann::json()));

  // Vocabulary.
  std::vector<std::pair<TokenId, std::string>> toks;  // id -> decoded bytes
  std::vector<std::pair<TokenId, bool>> mapped;       // id -> is a pure byte-level token
  TokenId max_id = 0;
  for (const auto& [tok, idv] : model.at("vocab").items()) {
    const TokenId id = idv.get<TokenId>();
    bool all = false;
    std::string b = bytelevel_bytes(tok, &all);
    DSV4_CHECK(token_id_.emplace(tok, id).second, "duplicate vocab token ", tok);
    if (all && b.size() == 1) byte_id_[static_cast<unsigned char>(b[0])] = id + 1;  // +1: 0 = absent
    if (ignore_merges_ && all) whole_.emplace(b, id);
    toks.emplace_back(id, std::move(b));
    max_id = std::max(max_id, id);
  }
  for (int b = 0; b < 256; ++b) {
    DSV4_CHECK(byte_id_[b] != 0, "byte-level vocabulary lacks the token for byte ", b);
    byte_id_[b] -= 1;
  }

  // Merges (either "a b" strings or ["a", "b"] pairs), rank = line number.
  const auto& ml = model.at("merges");
  merges_.build(ml.size());
  uint32_t rank = 0;
  for (const auto& m : ml) {
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const auto sp = s.find(' ');
      DSV4_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos, "bad merge line '", s, "'");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      DSV4_CHECK(m.is_array() && m.size() == 2, "bad merge entry ", m.dump());
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    }
    const auto ia = token_id_.find(a), ib = token_id_.find(b), im = token_id_.find(a + b);
    DSV4_CHECK(ia != token_id_.end() && ib != token_id_.end(), "merge '", a, " ", b, "' uses an unknown token");
    DSV4_CHECK(im != token_id_.end(), "merge '", a, " ", b, "' produces a token missing from the vocab");
    merges_.insert(ia->second, ib->second, rank++, im->second);
  }

  // Added tokens.
  for (const auto& at : j.value("added_tokens", nlohmann::json::array())) {
    AddedToken t;
    t.id = at.at("id").get<TokenId>();
    t.content = at.at("content").get<std::string>();
    t.special = at.value("special", false);
    t.normalized = at.value("normalized", !t.special);
    DSV4_CHECK(!at.value("lstrip", false) && !at.value("rstrip", false) && !at.value("single_word", false),
               "added token '", t.content, "': lstrip/rstrip/single_word are not supported");
    DSV4_CHECK(utf8_valid(t.content), "added token content is not valid UTF-8");
    const auto it = token_id_.find(t.content);
    DSV4_CHECK(it == token_id_.end() || it->second == t.id, "added token '", t.content, "' has id ", t.id,
               " but the vocab says ", it->second);
    if (it == token_id_.end()) {
      token_id_.emplace(t.content, t.id);
      bool all = false;
      toks.emplace_back(t.id, bytelevel_bytes(t.content, &all));
    }
    (t.normalized ? trie_norm_ : trie_raw_).insert(t.content, t.id);
    max_id = std::max(max_id, t.id);
    added_.push_back(std::move(t));
  }

  // id -> bytes table.
  has_id_.assign(max_id + 1, false);
  special_.assign(max_id + 1, false);
  std::vector<const std::string*> by_id(max_id + 1, nullptr);
  for (const auto& [id, b] : toks) {
    DSV4_CHECK(!has_id_[id] || *by_id[id] == b, "two different tokens share id ", id);
    has_id_[id] = true;
    by_id[id] = &b;
  }
  for (const auto& t : added_) special_[t.id] = t.special;
  bytes_off_.assign(max_id + 2, 0);
  for (TokenId id = 0; id <= max_id; ++id) {
    bytes_off_[id] = static_cast<uint32_t>(bytes_.size());
    if (by_id[id]) bytes_ += *by_id[id];
  }
  bytes_off_[max_id + 1] = static_cast<uint32_t>(bytes_.size());
}

// ---- encoding -----------------------------------------------------------------------------

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token) const {
  const auto it = token_id_.find(std::string(token));
  if (it == token_id_.end()) return std::nullopt;
  return it->second;
}

std::string_view Tokenizer::token_bytes(TokenId id) const {
  DSV4_CHECK(is_valid_id(id), "token id ", id, " is not in the vocabulary (size ", vocab_size(), ")");
  return std::string_view(bytes_).substr(bytes_off_[id], bytes_off_[id + 1] - bytes_off_[id]);
}

std::vector<TokenId> Tokenizer::encode(std::string_view text) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 8);
  encode_append(text, out);
  return out;
}

void Tokenizer::split_added(std::string_view text, const Trie& trie,
                            std::vector<std::pair<std::string_view, int64_t>>& out) const {
  if (trie.empty()) {
    out.emplace_back(text, -1);
    return;
  }
  std::size_t prev = 0;
  for (std::size_t i = 0; i < text.size();) {
    if (!trie.first[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    TokenId id = 0;
    const std::size_t len = trie.longest(text.substr(i), &id);
    if (!len) {
      ++i;
      continue;
    }
    if (i > prev) out.emplace_back(text.substr(prev, i - prev), -1);
    out.emplace_back(text.substr(i, len), id);
    i += len;
    prev = i;
  }
  if (prev < text.size()) out.emplace_back(text.substr(prev), -1);
}

void Tokenizer::encode_append(std::string_view text, std::vector<TokenId>& out) const {
  std::string repaired;
  if (!utf8_valid(text)) {
    repaired = utf8_lossy(text);
    text = repaired;
  }
  std::vector<std::pair<std::string_view, int64_t>> raw, norm;
  split_added(text, trie_raw_, raw);
  for (const auto& [seg, id] : raw) {
    if (id >= 0) {
      out.push_back(static_cast<TokenId>(id));
      continue;
    }
    norm.clear();
    split_added(seg, trie_norm_, norm);
    for (const auto& [seg2, id2] : norm) {
      if (id2 >= 0)
        out.push_back(static_cast<TokenId>(id2));
      else
        encode_plain(seg2, out);
    }
  }
}

namespace {
// Per-thread memo of BPE results for short pieces (words repeat a lot), like HF's word cache.
// Keyed by tokenizer instance so several tokenizers in one process never mix entries.
struct PieceCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<TokenId>> map;
};
constexpr std::size_t kCacheMaxPiece = 24, kCacheMaxEntries = 1 << 16;
}  // namespace

void Tokenizer::encode_plain(std::string_view text, std::vector<TokenId>& out) const {
  thread_local std::vector<std::string_view> pieces;
  thread_local PieceCache cache;
  if (cache.owner != instance_id_) {
    cache.map.clear();
    cache.owner = instance_id_;
  }
  pieces.clear();
  pre_.split(text, pieces);
  thread_local std::string key;
  for (const auto p : pieces) {
    if (p.size() < 2 || p.size() > kCacheMaxPiece) {
      bpe_piece(p, out);
      continue;
    }
    key.assign(p);
    const auto it = cache.map.find(key);
    if (it != cache.map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      continue;
    }
    const std::size_t before = out.size();
    bpe_piece(p, out);
    if (cache.map.size() >= kCacheMaxEntries) cache.map.clear();
    cache.map.emplace(key, std::vector<TokenId>(out.begin() + before, out.end()));
  }
}

// Lowest rank first, leftmost on ties: the order HF's BinaryHeap of merges pops.
void Tokenizer::bpe_piece(std::string_view piece, std::vector<TokenId>& out) const {
  const std::size_t n = piece.size();
  if (n == 0) return;
  if (n == 1) {
    out.push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (ignore_merges_) {
    const auto it = whole_.find(std::string(piece));
    if (it != whole_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (n > 128) {
    bpe_large(piece, out);
    return;
  }
  // Small pieces: arrays of symbols and of the (rank, merged id) of each adjacent pair.
  TokenId ids[128];
  uint32_t rank[128];
  TokenId nid[128];
  for (std::size_t i = 0; i < n; ++i) ids[i] = byte_id_[static_cast<unsigned char>(piece[i])];
  std::size_t m = n;
  auto look = [&](std::size_t i) {
    if (!merges_.find(ids[i], ids[i + 1], &rank[i], &nid[i])) rank[i] = UINT32_MAX;
  };
  for (std::size_t i = 0; i + 1 < m; ++i) look(i);
  while (m > 1) {
    std::size_t best = 0;
    uint32_t br = rank[0];
    for (std::size_t i = 1; i + 1 < m; ++i)
      if (rank[i] < br) {
        br = rank[i];
        best = i;
      }
    if (br == UINT32_MAX) break;
    ids[best] = nid[best];
    for (std::size_t i = best + 1; i + 1 < m; ++i) {
      ids[i] = ids[i + 1];
      rank[i] = rank[i + 1];
      nid[i] = nid[i + 1];
    }
    --m;
    if (best > 0) look(best - 1);
    if (best + 1 < m) look(best);
  }
  out.insert(out.end(), ids, ids + m);
}

// Long pieces (e.g. whitespace runs): HF's linked list + priority queue, O(n log n).
void Tokenizer::bpe_large(std::string_view piece, std::vector<TokenId>& out) const {
  struct Sym {
    TokenId c;
    int64_t prev, next;
    bool alive;
  };
  struct Merge {
    uint32_t rank;
    std::size_t pos;
    TokenId nid;
    bool operator>(const Merge& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const std::size_t n = piece.size();
  std::vector<Sym> s(n);
  for (std::size_t i = 0; i < n; ++i)
    s[i] = {byte_id_[static_cast<unsigned char>(piece[i])], int64_t(i) - 1, i + 1 < n ? int64_t(i + 1) : -1, true};
  std::priority_queue<Merge, std::vector<Merge>, std::greater<Merge>> q;
  for (std::size_t i = 0; i + 1 < n; ++i) {
    uint32_t r;
    TokenId id;
    if (merges_.find(s[i].c, s[i + 1].c, &r, &id)) q.push({r, i, id});
  }
  while (!q.empty()) {
    const Merge top = q.top();
    q.pop();
    Sym& cur = s[top.pos];
    if (!cur.alive || cur.next < 0) continue;
    const std::size_t nx = static_cast<std::size_t>(cur.next);
    uint32_t r;
    TokenId id;
    if (!merges_.find(cur.c, s[nx].c, &r, &id) || id != top.nid) continue;  // stale entry
    cur.c = top.nid;
    s[nx].alive = false;
    cur.next = s[nx].next;
    if (cur.next >= 0) s[cur.next].prev = int64_t(top.pos);
    if (cur.prev >= 0 && merges_.find(s[cur.prev].c, cur.c, &r, &id)) q.push({r, std::size_t(cur.prev), id});
    if (cur.next >= 0 && merges_.find(cur.c, s[cur.next].c, &r, &id)) q.push({r, top.pos, id});
  }
  for (int64_t i = 0; i >= 0; i = s[i].next) out.push_back(s[i].c);
}

// ---- decoding -----------------------------------------------------------------------------

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (const TokenId id : ids) {
    if (skip_special_tokens && is_special(id)) continue;
    bytes += token_bytes(id);
  }
  return utf8_lossy(bytes);
}

}  // namespace dsv4
