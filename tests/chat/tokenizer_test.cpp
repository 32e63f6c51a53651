// Tokenizer parity with HF `tokenizers` (goldens from scripts/make_tokenizer_golden.py):
// exact ids, pre-tokenizer pieces, decode, per-token decode, streaming detokenizer.
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "chat/detokenizer.h"
#include "chat/tokenizer.h"
#include "chat/utf8.h"
#include "core/error.h"

namespace dsv4 {
namespace {

std::string env_or(const char* name, const std::string& dflt) {
  const char* v = std::getenv(name);
  return v && *v ? v : dflt;
}
std::string tokenizer_path() { return env_or("DSV4_TOKENIZER_JSON", std::string(DSV4_SOURCE_DIR) + "/models/tiny/tokenizer.json"); }
std::string golden_path() {
  return env_or("DSV4_TOKENIZER_GOLDEN", std::string(DSV4_SOURCE_DIR) + "/tests/chat/data/tokenizer_golden.json");
}

std::string from_hex(const std::string& h) {
  std::string out;
  for (std::size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

// Byte-level spelling of raw bytes, as HF's pre_tokenize_str shows pieces.
std::string bytelevel(std::string_view b) {
  std::string out;
  for (unsigned char c : b) utf8_append(out, byte_to_unicode(c));
  return out;
}

struct chat_tokenizer : ::testing::Test {
  static const Tokenizer& tok() {
    static const Tokenizer t = Tokenizer::from_file(tokenizer_path());
    return t;
  }
  static const nlohmann::json& golden() {
    static const nlohmann::json g = [] {
      std::ifstream f(golden_path());
      EXPECT_TRUE(f) << golden_path();
      return nlohmann::json::parse(f);
    }();
    return g;
  }
};

TEST_F(chat_tokenizer, VocabSizeMatches) { EXPECT_EQ(tok().vocab_size(), golden().at("vocab_size").get<std::size_t>()); }

TEST_F(chat_tokenizer, CorpusIsNonTrivial) {
  const auto& cases = golden().at("cases");
  ASSERT_GE(cases.size(), 200u);
  std::size_t ids = 0, added = 0;
  for (const auto& c : cases) {
    ids += c.at("ids").size();
    for (auto id : c.at("ids")) added += tok().is_special(id.get<TokenId>());
  }
  EXPECT_GT(ids, 5000u);
  EXPECT_GT(added, 50u);
}

TEST_F(chat_tokenizer, EncodeMatchesHF) {
  int bad = 0;
  for (const auto& c : golden().at("cases")) {
    const std::string raw = from_hex(c.at("bytes_hex"));
    const auto want = c.at("ids").get<std::vector<TokenId>>();
    const auto got = tok().encode(raw);
    EXPECT_EQ(got, want) << c.at("name");
    bad += got != want;
  }
  EXPECT_EQ(bad, 0);
}

TEST_F(chat_tokenizer, PretokenizerMatchesHF) {
  for (const auto& c : golden().at("cases")) {
    const std::string text = utf8_lossy(from_hex(c.at("bytes_hex")));
    std::vector<std::string_view> pieces;
    tok().pretokenizer().split(text, pieces);
    std::vector<std::string> got;
    for (auto p : pieces) got.push_back(bytelevel(p));
    EXPECT_EQ(got, c.at("pieces").get<std::vector<std::string>>()) << c.at("name");
  }
}

TEST_F(chat_tokenizer, DecodeMatchesHF) {
  for (const auto& c : golden().at("cases")) {
    const auto ids = c.at("ids").get<std::vector<TokenId>>();
    EXPECT_EQ(tok().decode(ids), c.at("decoded").get<std::string>()) << c.at("name");
    EXPECT_EQ(tok().decode(ids, true), c.at("decoded_skip_special").get<std::string>()) << c.at("name");
    const auto per = c.at("per_id_decoded").get<std::vector<std::string>>();
    for (std::size_t i = 0; i < per.size(); ++i)
      EXPECT_EQ(tok().decode(std::span(&ids[i], 1)), per[i]) << c.at("name") << " token " << i;
  }
  for (const auto& c : golden().at("decode_cases")) {
    const auto ids = c.at("ids").get<std::vector<TokenId>>();
    EXPECT_EQ(tok().decode(ids), c.at("decoded").get<std::string>());
    EXPECT_EQ(tok().decode(ids, true), c.at("decoded_skip_special").get<std::string>());
  }
}

TEST_F(chat_tokenizer, RoundTripDecode) {
  for (const auto& c : golden().at("cases")) {
    const std::string text = utf8_lossy(from_hex(c.at("bytes_hex")));
    EXPECT_EQ(tok().decode(tok().encode(text)), text) << c.at("name");
  }
}

TEST_F(chat_tokenizer, StreamingDetokenizerEqualsDecodeAndIsValidUtf8) {
  std::mt19937 rng(1);
  std::vector<std::vector<TokenId>> seqs;
  for (const auto& c : golden().at("cases")) seqs.push_back(c.at("ids").get<std::vector<TokenId>>());
  for (const auto& c : golden().at("decode_cases")) seqs.push_back(c.at("ids").get<std::vector<TokenId>>());
  for (int i = 0; i < 200; ++i) {  // random byte-token soup: maximal stress for split characters
    std::vector<TokenId> s;
    for (int k = 0; k < 30; ++k) s.push_back(tok().encode(std::string(1, char(rng() & 0xFF)) + "")[0]);
    seqs.push_back(s);
  }
  for (const auto& ids : seqs) {
    for (bool skip : {false, true}) {
      StreamDetokenizer d(tok(), skip);
      std::string all;
      for (auto id : ids) {
        const std::string piece = d.push(id);
        EXPECT_TRUE(utf8_valid(piece));
        all += piece;
      }
      all += d.finish();
      EXPECT_EQ(all, tok().decode(ids, skip));
    }
  }
}

TEST_F(chat_tokenizer, UnknownIdIsAnError) {
  const std::vector<TokenId> ids{static_cast<TokenId>(tok().vocab_size())};
  EXPECT_THROW(tok().decode(ids), Error);
}

TEST(chat_tokenizer_load, RejectsUnsupportedFeatures) {
  EXPECT_THROW(Tokenizer::from_json_string("{}"), Error);
  EXPECT_THROW(Tokenizer::from_json_string("not json"), Error);
  const std::string base =
      R"({"model":{"type":"WordPiece","vocab":{}},"decoder":{"type":"ByteLevel"},"pre_tokenizer":null,"normalizer":null})";
  EXPECT_THROW(Tokenizer::from_json_string(base), Error);
  EXPECT_THROW(Tokenizer::from_file("/nonexistent/tokenizer.json"), Error);
}

TEST(chat_utf8, LossyMatchesMaximalSubpartRule) {
  // Expected values are what Python's bytes.decode("utf-8", "replace") returns.
  EXPECT_EQ(utf8_lossy("\xed\xa0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8_lossy("\xe4\xb8"), "\xEF\xBF\xBD");
  EXPECT_EQ(utf8_lossy("\xe4\xb8" "a"), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(utf8_lossy("\xc0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8_lossy("\xf0\x9f\x98\x80"), "\xf0\x9f\x98\x80");
  EXPECT_EQ(utf8_lossy("\xf4\x90\x80\x80"), std::string(4 * 3, 0).replace(0, 12, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"));
  std::string out;
  EXPECT_EQ(utf8_lossy_append("ab\xf0\x9f\x98", false, out), 2u);
  EXPECT_EQ(out, "ab");
}

}  // namespace
}  // namespace dsv4
