// HTTP-level errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.
// Request parsing throws ApiError; the HTTP layer turns it into the status and body.
#pragma once
#include <stdexcept>
#include <string>

#include "chat/json_dumps.h"

namespace dsv4 {

struct ApiError : std::runtime_error {
  int status;
  std::string type, param, code;  // empty param/code are sent as null
  ApiError(int status_, std::string message, std::string param_ = "", std::string code_ = "",
           std::string type_ = "")
      : std::runtime_error(std::move(message)),
        status(status_),
        type(type_.empty() ? default_type(status_) : std::move(type_)),
        param(std::move(param_)),
        code(std::move(code_)) {}
  static std::string default_type(int status);
};

// 400 naming the offending field.
[[noreturn]] void bad_request(const std::string& message, const std::string& param = "",
                              const std::string& code = "");

ojson error_body(int status, const std::string& message, const std::string& param = "",
                 const std::string& code = "", const std::string& type = "");
inline ojson error_body(const ApiError& e) { return error_body(e.status, e.what(), e.param, e.code, e.type); }

}  // namespace dsv4
