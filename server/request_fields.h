// Typed access to the fields of a JSON request body. Every getter throws a 400 ApiError
// naming the field when it has the wrong type or is out of range; absent and null fields
// read as std::nullopt (OpenAI clients send null for "not set").
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "chat/json_dumps.h"

namespace dsv4 {

class Fields {
 public:
  explicit Fields(const ojson& body);  // body must be a JSON object

  const ojson* get(const char* key) const;  // nullptr when absent or null
  std::optional<bool> boolean(const char* key) const;
  std::optional<std::string> string(const char* key) const;
  // Closed range [lo, hi].
  std::optional<double> number(const char* key, double lo, double hi) const;
  std::optional<int64_t> integer(const char* key, int64_t lo, int64_t hi) const;

  const ojson& body() const { return *body_; }

 private:
  const ojson* body_;
};

// The same checks for a value inside a nested object (`param` names it in errors).
bool read_bool(const ojson& v, const std::string& param);
std::string read_string(const ojson& v, const std::string& param);

}  // namespace dsv4
