// Element types of the official checkpoints and exact scalar conversions.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dsv4 {

// Names follow safetensors' dtype strings.
enum class DType : uint8_t { F64, F32, F16, BF16, F8_E4M3, F8_E8M0, I64, I32, I16, I8, U8, BOOL };

std::string_view dtype_name(DType t);
// Throws Error naming the string when the dtype is not one dsv4 reads.
DType dtype_from_name(std::string_view name);
size_t dtype_size(DType t);

// bf16: upper 16 bits of an fp32; fp32 -> bf16 rounds to nearest even (NaN stays NaN).
float bf16_to_f32(uint16_t b);
uint16_t f32_to_bf16(float f);
float round_to_bf16(float f);

// FP8 e4m3fn: bias 7, no infinities, S.1111.111 is NaN, max 448, subnormals 2^-9 steps.
float e4m3_to_f32(uint8_t b);
// Round to nearest even; values beyond 448 saturate to ±448 (callers clamp first anyway); NaN -> NaN.
uint8_t f32_to_e4m3(float f);

// E8M0: value 2^(b-127); 0xFF is NaN.
float e8m0_to_f32(uint8_t b);
// Exponent byte of an exact power of two (throws if f is not a positive power of two in range).
uint8_t f32_pow2_to_e8m0(float f);

// FP4 e2m1: bit 3 sign, bits 0-2 index {0, .5, 1, 1.5, 2, 3, 4, 6}.
float e2m1_to_f32(uint8_t nibble);
// Round to nearest even onto the e2m1 grid, saturating at ±6.
uint8_t f32_to_e2m1(float f);
// Packed pairs: element 2k in the low nibble, 2k+1 in the high nibble.
inline float e2m1_packed_get(const uint8_t* packed, size_t k) {
  uint8_t b = packed[k >> 1];
  return e2m1_to_f32((k & 1) ? (b >> 4) : (b & 0xF));
}

}  // namespace dsv4
