#include "chat/json_dumps.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "chat/utf8.h"
#include "core/error.h"

namespace dsv4 {

void json_quote_append(std::string_view s, std::string& out) {
  DSV4_CHECK(utf8_valid(s), "JSON string is not valid UTF-8");
  out.push_back('"');
  json_escape_append(s, out);
  out.push_back('"');
}

void json_escape_append(std::string_view s, std::string& out) {
  static const char* hex = "0123456789abcdef";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out.push_back(hex[c >> 4]);
          out.push_back(hex[c & 15]);
        } else {
          out.push_back(ch);
        }
    }
  }
}

std::string json_quote(std::string_view s) {
  std::string out;
  json_quote_append(s, out);
  return out;
}

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout rule: exponent form when the decimal
  // point position is < -3 or > 16 (repr(1e16) == '1e+16', repr(0.0001) == '0.0001').
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const auto epos = sci.find('e');
  std::string digits = sci.substr(0, epos);
  const int exp10 = std::stoi(sci.substr(epos + 1));
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int decpt = exp10 + 1;  // value = 0.DIGITS * 10^decpt
  const int nd = static_cast<int>(digits.size());
  std::string out = sign;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(-decpt, '0') + digits;
    } else if (decpt >= nd) {
      out += digits + std::string(decpt - nd, '0') + ".0";
    } else {
      out += digits.substr(0, decpt) + "." + digits.substr(decpt);
    }
  } else {
    out += digits.substr(0, 1);
    if (nd > 1) out += "." + digits.substr(1);
    const int e = decpt - 1;
    out += e < 0 ? "e-" : "e+";
    const int ae = e < 0 ? -e : e;
    if (ae < 10) out += "0";
    out += std::to_string(ae);
  }
  return out;
}

void json_dumps_append(const ojson& v, std::string& out) {
  switch (v.type()) {
    case ojson::value_t::null: out += "null"; break;
    case ojson::value_t::boolean: out += v.get<bool>() ? "true" : "false"; break;
    case ojson::value_t::number_integer: out += std::to_string(v.get<int64_t>()); break;
    case ojson::value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); break;
    case ojson::value_t::number_float: out += python_float_repr(v.get<double>()); break;
    case ojson::value_t::string: json_quote_append(v.get_ref<const std::string&>(), out); break;
    case ojson::value_t::array: {
      out.push_back('[');
      bool first = true;
      for (const auto& e : v) {
        if (!first) out += ", ";
        first = false;
        json_dumps_append(e, out);
      }
      out.push_back(']');
      break;
    }
    case ojson::value_t::object: {
      out.push_back('{');
      bool first = true;
      for (const auto& [k, e] : v.items()) {
        if (!first) out += ", ";
        first = false;
        json_quote_append(k, out);
        out += ": ";
        json_dumps_append(e, out);
      }
      out.push_back('}');
      break;
    }
    default: fail("cannot serialize this JSON value (binary/discarded)");
  }
}

std::string json_dumps(const ojson& v) {
  std::string out;
  json_dumps_append(v, out);
  return out;
}

ojson parse_json_ordered(std::string_view text) {
  try {
    return ojson::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("invalid JSON: ", e.what());
  }
}

}  // namespace dsv4
