// Exact scalar conversions of core/dtype.h against values written down from the format definitions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"

namespace dsv4 {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(E4M3, DecodesEveryCodeFromTheFormatDefinition) {
  for (int b = 0; b < 256; ++b) {
    int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    float got = e4m3_to_f32(static_cast<uint8_t>(b));
    if (e == 15 && m == 7) {
      EXPECT_TRUE(std::isnan(got)) << b;
      continue;
    }
    double mag = e == 0 ? m / 8.0 * std::pow(2.0, -6) : (1 + m / 8.0) * std::pow(2.0, e - 7);
    EXPECT_EQ(got, static_cast<float>(s ? -mag : mag)) << "code " << b;
    EXPECT_EQ(std::signbit(got), s == 1) << "code " << b;
  }
}

TEST(E4M3, AnchorValues) {
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_to_f32(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_f32(0xB8), -1.0f);
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xFE), -448.0f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xFF)));
  EXPECT_EQ(bits(e4m3_to_f32(0x80)), 0x80000000u);  // -0
}

TEST(E4M3, RoundTripsAllNonNanCodes) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7F) == 0x7F) continue;
    EXPECT_EQ(f32_to_e4m3(e4m3_to_f32(static_cast<uint8_t>(b))), b) << "code " << b;
  }
}

TEST(E4M3, RoundsToNearestWithTiesToEvenCode) {
  for (int c = 0; c < 0x7E; ++c) {
    float lo = e4m3_to_f32(static_cast<uint8_t>(c)), hi = e4m3_to_f32(static_cast<uint8_t>(c + 1));
    float mid = (lo + hi) / 2;  // exact in fp32
    int tie = (c % 2 == 0) ? c : c + 1;
    EXPECT_EQ(f32_to_e4m3(mid), tie) << "tie between codes " << c << " and " << c + 1;
    EXPECT_EQ(f32_to_e4m3(-mid), tie | 0x80);
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, hi)), c + 1);
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, lo)), c);
  }
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -10)), 0x00);  // half the smallest subnormal: tie to 0
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -12)), 0x00);
  EXPECT_EQ(f32_to_e4m3(std::ldexp(3.0f, -11)), 0x01);
}

TEST(E4M3, SaturatesAndKeepsNan) {
  EXPECT_EQ(f32_to_e4m3(1000.0f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(-1e30f), 0xFE);
  EXPECT_EQ(f32_to_e4m3(INFINITY), 0x7E);
  EXPECT_EQ(f32_to_e4m3(464.0f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(NAN) & 0x7F, 0x7F);
}

TEST(E8M0, DecodesPowersOfTwoAndNan) {
  for (int b = 0; b < 255; ++b) {
    float v = e8m0_to_f32(static_cast<uint8_t>(b));
    EXPECT_EQ(v, std::ldexp(1.0f, b - 127)) << b;
    EXPECT_EQ(f32_pow2_to_e8m0(v), b) << b;  // also 2^-127, an fp32 subnormal
  }
  EXPECT_TRUE(std::isnan(e8m0_to_f32(0xFF)));
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
}

TEST(E8M0, RejectsNonPowersOfTwo) {
  EXPECT_THROW(f32_pow2_to_e8m0(3.0f), Error);
  EXPECT_THROW(f32_pow2_to_e8m0(0.0f), Error);
  EXPECT_THROW(f32_pow2_to_e8m0(-2.0f), Error);
  EXPECT_THROW(f32_pow2_to_e8m0(std::ldexp(1.0f, 128 - 1) * 2), Error);  // inf
}

TEST(E2M1, DecodesAll16Codes) {
  const float lut[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) {
    float v = e2m1_to_f32(static_cast<uint8_t>(c));
    EXPECT_EQ(std::fabs(v), lut[c & 7]) << c;
    EXPECT_EQ(std::signbit(v), (c & 8) != 0) << c;
    EXPECT_EQ(f32_to_e2m1(v), c) << c;  // round trip, -0 included
  }
}

TEST(E2M1, RoundsToNearestEvenAndSaturates) {
  struct Case { float in; int code; };
  const Case cases[] = {
      {0.25f, 0},  {0.26f, 1}, {0.75f, 2}, {1.25f, 2}, {1.75f, 4}, {2.5f, 4},  {3.5f, 6},
      {5.0f, 6},   {5.1f, 7},  {7.0f, 7},  {100.f, 7}, {-0.75f, 10}, {-5.0f, 14}, {0.1f, 0},
  };
  for (const auto& t : cases) EXPECT_EQ(f32_to_e2m1(t.in), t.code) << t.in;
}

TEST(E2M1, PackedNibbleOrder) {
  const uint8_t packed[2] = {0x72, 0x9F};  // elements: 1.0, 6.0, -6.0, -0.5
  EXPECT_EQ(e2m1_packed_get(packed, 0), 1.0f);
  EXPECT_EQ(e2m1_packed_get(packed, 1), 6.0f);
  EXPECT_EQ(e2m1_packed_get(packed, 2), -6.0f);
  EXPECT_EQ(e2m1_packed_get(packed, 3), -0.5f);
}

TEST(BF16, RoundsToNearestEven) {
  const float ulp = std::ldexp(1.0f, -7);  // bf16 spacing at 1.0
  EXPECT_EQ(round_to_bf16(1.0f + ulp / 2), 1.0f);                          // tie, even stays
  EXPECT_EQ(round_to_bf16(1.0f + 3 * ulp / 2), 1.0f + 2 * ulp);            // tie, odd rounds up
  EXPECT_EQ(round_to_bf16(1.0f + ulp / 2 + std::ldexp(1.0f, -20)), 1.0f + ulp);
  EXPECT_EQ(round_to_bf16(-(1.0f + 3 * ulp / 2)), -(1.0f + 2 * ulp));
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_TRUE(std::isnan(round_to_bf16(NAN)));
  EXPECT_TRUE(std::isinf(round_to_bf16(INFINITY)));
  EXPECT_TRUE(std::isinf(round_to_bf16(3.4028235e38f)));  // max fp32 rounds past max bf16
}

TEST(BF16, RoundTripsAllNonNanCodes) {
  for (uint32_t b = 0; b < 65536; ++b) {
    float f = bf16_to_f32(static_cast<uint16_t>(b));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
      continue;
    }
    EXPECT_EQ(f32_to_bf16(f), b);
  }
}

TEST(DType, NamesAndSizes) {
  EXPECT_EQ(dtype_from_name("F8_E4M3"), DType::F8_E4M3);
  EXPECT_EQ(dtype_name(DType::F8_E8M0), "F8_E8M0");
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
  try {
    dtype_from_name("F4");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("F4"), std::string::npos);
  }
}

}  // namespace
}  // namespace dsv4
