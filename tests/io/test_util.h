// Helpers shared by the io tests: scratch folders and message checks.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <unistd.h>

#include "core/error.h"

namespace dsv4::test {

// A fresh, empty folder under the system temp dir, removed at scope exit.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            ("dsv4_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string str() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Runs f, expects dsv4::Error, and returns its message ("" if none was thrown).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected dsv4::Error";
  return "";
}

}  // namespace dsv4::test

#define EXPECT_ERROR_HAS(expr, ...)                                              \
  do {                                                                           \
    std::string msg_ = ::dsv4::test::error_of([&] { (void)(expr); });            \
    for (const char* part_ : {__VA_ARGS__})                                      \
      EXPECT_NE(msg_.find(part_), std::string::npos) << "'" << part_ << "' not in: " << msg_; \
  } while (0)
