#include "chat/utf8.h"

#include <cstdint>
#include <cstring>

namespace dsv4 {

std::size_t utf8_seq_len(std::string_view s, std::size_t* subpart, bool* truncated) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const std::size_t n = s.size();
  const unsigned char b0 = p[0];
  *truncated = false;
  if (b0 < 0x80) return 1;
  // Unicode Table 3-7: allowed range of the second byte depends on the lead byte.
  std::size_t len;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    *subpart = 1;
    return 0;
  }
  for (std::size_t i = 1; i < len; ++i) {
    if (i >= n) {
      *subpart = i;
      *truncated = true;
      return 0;
    }
    const unsigned char b = p[i];
    const unsigned char l = (i == 1) ? lo : 0x80, h = (i == 1) ? hi : 0xBF;
    if (b < l || b > h) {
      *subpart = i;
      return 0;
    }
  }
  return len;
}

bool utf8_valid(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= s.size()) break;
    std::size_t sub;
    bool trunc;
    const std::size_t len = utf8_seq_len(s.substr(i), &sub, &trunc);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

std::size_t utf8_lossy_append(std::string_view s, bool final, std::string& out) {
  std::size_t i = 0, run = 0;  // [run, i) is a pending stretch of valid bytes
  while (i < s.size()) {
    std::size_t sub;
    bool trunc;
    const std::size_t len = utf8_seq_len(s.substr(i), &sub, &trunc);
    if (len) {
      i += len;
      continue;
    }
    out.append(s.data() + run, i - run);
    if (trunc && !final) return i;  // keep the unfinished tail for later
    out.append("\xEF\xBF\xBD");
    i += sub;
    run = i;
  }
  out.append(s.data() + run, i - run);
  return i;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  utf8_lossy_append(s, true, out);
  return out;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace dsv4
