#include "server/request_fields.h"

#include <cmath>
#include <sstream>

#include "server/api_error.h"

namespace dsv4 {

namespace {

std::string fmt(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

}  // namespace

Fields::Fields(const ojson& body) : body_(&body) {
  if (!body.is_object()) bad_request("the request body must be a JSON object");
}

const ojson* Fields::get(const char* key) const {
  auto it = body_->find(key);
  if (it == body_->end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<bool> Fields::boolean(const char* key) const {
  const ojson* v = get(key);
  if (!v) return std::nullopt;
  return read_bool(*v, key);
}

std::optional<std::string> Fields::string(const char* key) const {
  const ojson* v = get(key);
  if (!v) return std::nullopt;
  return read_string(*v, key);
}

std::optional<double> Fields::number(const char* key, double lo, double hi) const {
  const ojson* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad_request(std::string("'") + key + "' must be a number", key);
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    bad_request(std::string("'") + key + "' must be in [" + fmt(lo) + ", " + fmt(hi) + "], got " + v->dump(), key);
  return d;
}

std::optional<int64_t> Fields::integer(const char* key, int64_t lo, int64_t hi) const {
  const ojson* v = get(key);
  if (!v) return std::nullopt;
  // 2.0 is accepted as 2 (Python clients); 2.5 is not.
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (!std::isfinite(d) || std::floor(d) != d) bad_request(std::string("'") + key + "' must be an integer", key);
  } else if (!v->is_number_integer()) {
    bad_request(std::string("'") + key + "' must be an integer", key);
  }
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    bad_request(std::string("'") + key + "' is out of range", key);
  const double d = v->get<double>();
  if (d < static_cast<double>(lo) || d > static_cast<double>(hi))
    bad_request(std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                    "], got " + v->dump(),
                key);
  return v->is_number_float() ? static_cast<int64_t>(d) : v->get<int64_t>();
}

bool read_bool(const ojson& v, const std::string& param) {
  if (!v.is_boolean()) bad_request("'" + param + "' must be a boolean", param);
  return v.get<bool>();
}

std::string read_string(const ojson& v, const std::string& param) {
  if (!v.is_string()) bad_request("'" + param + "' must be a string", param);
  return v.get<std::string>();
}

}  // namespace dsv4
