#include "server/api_error.h"

namespace dsv4 {

std::string ApiError::default_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 413: return "invalid_request_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

void bad_request(const std::string& message, const std::string& param, const std::string& code) {
  throw ApiError(400, message, param, code);
}

ojson error_body(int status, const std::string& message, const std::string& param, const std::string& code,
                 const std::string& type) {
  ojson e;
  e["message"] = message;
  e["type"] = type.empty() ? ApiError::default_type(status) : type;
  e["param"] = param.empty() ? ojson(nullptr) : ojson(param);
  e["code"] = code.empty() ? ojson(nullptr) : ojson(code);
  return ojson{{"error", e}};
}

}  // namespace dsv4
