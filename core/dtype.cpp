#include "core/dtype.h"

#include <array>
#include <bit>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace dsv4 {

namespace {
struct NameEntry {
  DType t;
  std::string_view name;
  size_t size;
};
constexpr std::array<NameEntry, 12> kNames{{
    {DType::F64, "F64", 8},     {DType::F32, "F32", 4},         {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2},   {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E8M0, "F8_E8M0", 1},
    {DType::I64, "I64", 8},     {DType::I32, "I32", 4},         {DType::I16, "I16", 2},
    {DType::I8, "I8", 1},       {DType::U8, "U8", 1},           {DType::BOOL, "BOOL", 1},
}};

std::array<float, 256> make_e4m3_table() {
  std::array<float, 256> t{};
  for (int b = 0; b < 256; ++b) {
    int sign = b >> 7, exp = (b >> 3) & 0xF, man = b & 7;
    float v;
    if (exp == 0xF && man == 7) {
      v = std::numeric_limits<float>::quiet_NaN();
    } else if (exp == 0) {
      v = std::ldexp(static_cast<float>(man), -9);  // subnormal: man/8 * 2^-6
    } else {
      v = std::ldexp(1.0f + man / 8.0f, exp - 7);
    }
    t[b] = sign ? -v : v;
  }
  return t;
}
const std::array<float, 256> kE4M3 = make_e4m3_table();
constexpr std::array<float, 8> kE2M1{0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
}  // namespace

std::string_view dtype_name(DType t) {
  for (const auto& e : kNames)
    if (e.t == t) return e.name;
  return "?";
}

DType dtype_from_name(std::string_view name) {
  for (const auto& e : kNames)
    if (e.name == name) return e.t;
  fail("unsupported dtype '", name, "'");
}

size_t dtype_size(DType t) {
  for (const auto& e : kNames)
    if (e.t == t) return e.size;
  return 0;
}

float bf16_to_f32(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

uint16_t f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  uint32_t rounding = 0x7FFF + ((u >> 16) & 1);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

float round_to_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float e4m3_to_f32(uint8_t b) { return kE4M3[b]; }

uint8_t f32_to_e4m3(float f) {
  if (std::isnan(f)) return 0x7F;
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7E;
  // Search the 127 non-negative finite codes: nearest value, ties to even code (even mantissa).
  int lo = 0, hi = 0x7E;
  while (lo < hi) {  // first code with value >= a
    int mid = (lo + hi) / 2;
    if (kE4M3[mid] < a) lo = mid + 1; else hi = mid;
  }
  int c = lo;
  if (c > 0) {
    float up = kE4M3[c], down = kE4M3[c - 1];
    if (a - down < up - a || (a - down == up - a && ((c - 1) & 1) == 0)) c = c - 1;
  }
  return sign | static_cast<uint8_t>(c);
}

float e8m0_to_f32(uint8_t b) {
  if (b == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(b) - 127);
}

uint8_t f32_pow2_to_e8m0(float f) {
  int e;
  float m = std::frexp(f, &e);  // f = m * 2^e, m in [0.5, 1)
  DSV4_CHECK(f > 0 && m == 0.5f, "E8M0 scale must be a positive power of two, got ", f);
  int b = e - 1 + 127;
  DSV4_CHECK(b >= 0 && b < 255, "E8M0 scale out of range: ", f);
  return static_cast<uint8_t>(b);
}

float e2m1_to_f32(uint8_t nibble) {
  float v = kE2M1[nibble & 7];
  return (nibble & 8) ? -v : v;
}

uint8_t f32_to_e2m1(float f) {
  uint8_t sign = std::signbit(f) ? 8 : 0;
  float a = std::fabs(f);
  if (std::isnan(f)) return 0;
  if (a >= 6.0f) return sign | 7;
  int c = 0;
  while (c < 7 && kE2M1[c + 1] <= a) ++c;  // kE2M1[c] <= a < kE2M1[c+1]
  if (c < 7) {
    float down = kE2M1[c], up = kE2M1[c + 1];
    if (up - a < a - down || (up - a == a - down && ((c + 1) & 1) == 0)) c = c + 1;
  }
  return sign | static_cast<uint8_t>(c);
}

}  // namespace dsv4
