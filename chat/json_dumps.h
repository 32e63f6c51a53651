// Python-compatible JSON text (serving.md §2.11): what `json.dumps(v, ensure_ascii=False)`
// prints, byte for byte — ", " and ": " separators, insertion-ordered keys, raw UTF-8,
// lowercase \u00XX for other C0 controls, floats as Python repr (1.0, 1e-05, 1e+16).
// The prompt encoder and the output parser both depend on this matching Python exactly.
#pragma once
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace dsv4 {

using ojson = nlohmann::ordered_json;

std::string json_dumps(const ojson& v);
void json_dumps_append(const ojson& v, std::string& out);
// A JSON string literal (with quotes) for `s`, which must be valid UTF-8.
std::string json_quote(std::string_view s);
void json_quote_append(std::string_view s, std::string& out);
// The body of a JSON string literal (no quotes, no UTF-8 validation): for streaming
// fragments of model output, which must never make the parser throw.
void json_escape_append(std::string_view s, std::string& out);
// Python repr() of a float.
std::string python_float_repr(double d);
// Order-preserving parse; malformed text throws dsv4::Error.
ojson parse_json_ordered(std::string_view text);

}  // namespace dsv4
