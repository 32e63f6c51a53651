// Shared bits of the libFuzzer targets (also built into a plain smoke driver for ctest).
#pragma once
#include <cstdio>
#include <cstdlib>
#include <string>

#define FUZZ_ASSERT(cond)                                                      \
  do {                                                                         \
    if (!(cond)) {                                                             \
      std::fprintf(stderr, "fuzz property failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                            \
    }                                                                          \
  } while (0)

inline std::string fuzz_source_dir() {
  const char* v = std::getenv("DSV4_SOURCE_DIR");
  return v && *v ? v : DSV4_SOURCE_DIR;
}
