// Tokenizer throughput: encodes a large mixed text (English-like prose, Chinese, code,
// numbers, whitespace) on one thread and prints MB/s.
//   tokenizer_bench [tokenizer.json] [megabytes] [repetitive|diverse]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "chat/tokenizer.h"

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : std::string(DSV4_SOURCE_DIR) + "/models/tiny/tokenizer.json";
  const double mb = argc > 2 ? std::atof(argv[2]) : 32.0;
  const auto tok = dsv4::Tokenizer::from_file(path);
  static const char* words[] = {"the", "model", "returns", "a", "token", "for", "each", "piece", "of", "text",
                                "and", "then", "merges", "pairs", "by", "rank", "quickly", "Hello", "world"};
  static const char* other[] = {"中文测试：今天天气很好，我们去公园散步吧。", "    return x * 2 + 1;\n",
                                "1234567890 3.14159 ", "\n\n", "日本語のテキスト。", " 😀 ", "<｜User｜>", "\t\t"};
  std::mt19937 rng(42);
  // "repetitive": a small word list (high word-cache hit rate); "diverse": Zipf-distributed
  // pseudo-words from 30k distinct ones, closer to real prose.
  const bool diverse = argc > 3 && std::string(argv[3]) == "diverse";
  std::vector<std::string> lexicon;
  static const char* syl_c[] = {"", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "st", "tr", "ch", "sh"};
  static const char* syl_v[] = {"a", "e", "i", "o", "u", "ai", "ea", "ou", "ie", "y"};
  for (int i = 0; i < 30000; ++i) {
    std::string w;
    for (int k = 1 + rng() % 4; k > 0; --k) w += std::string(syl_c[rng() % 20]) + syl_v[rng() % 10];
    lexicon.push_back(w);
  }
  std::vector<double> cum;
  double acc = 0;
  for (std::size_t i = 0; i < lexicon.size(); ++i) cum.push_back(acc += 1.0 / (i + 1));
  std::string text;
  const std::size_t target = static_cast<std::size_t>(mb * 1e6);
  while (text.size() < target) {
    if (rng() % 8 == 0) {
      text += other[rng() % 8];
    } else {
      if (diverse) {
        const double u = std::uniform_real_distribution<double>(0, acc)(rng);
        text += lexicon[std::lower_bound(cum.begin(), cum.end(), u) - cum.begin()];
      } else {
        text += words[rng() % 19];
      }
      text += (rng() % 12 == 0) ? ". " : " ";
    }
  }
  std::size_t n = 0;
  const auto t0 = std::chrono::steady_clock::now();
  // Encode in 64 KiB documents, as a server would see prompts.
  const std::size_t chunk = 64 * 1024;
  std::vector<dsv4::TokenId> ids;
  for (std::size_t off = 0; off < text.size(); off += chunk) {
    std::size_t end = std::min(text.size(), off + chunk);
    while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;  // whole chars
    ids.clear();
    tok.encode_append(std::string_view(text).substr(off, end - off), ids);
    n += ids.size();
    off = end - chunk;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("encode (%s text): %.1f MB in %.3f s = %.2f MB/s (%zu tokens, %.2f bytes/token, 1 thread)\n", diverse ? "diverse" : "repetitive", text.size() / 1e6, s,
              text.size() / 1e6 / s, n, double(text.size()) / n);
  std::size_t cut = std::min<std::size_t>(text.size(), 8 * 1000 * 1000);
  while (cut < text.size() && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) ++cut;
  const auto t1 = std::chrono::steady_clock::now();
  const auto all = tok.encode(std::string_view(text).substr(0, cut));
  const std::string back = tok.decode(all);
  const double s2 = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  const bool ok = back == text.substr(0, cut);
  std::printf("encode+decode %.1f MB in one call: %.3f s (round trip %s)\n", cut / 1e6, s2, ok ? "ok" : "MISMATCH");
  return ok ? 0 : 1;
}
