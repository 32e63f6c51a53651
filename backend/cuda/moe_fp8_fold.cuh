// The FP8 prefill expert kernels' weight conversion (moe_wgmma_fp8_wide.cu: in the consumer's
// registers; moe_wgmma_fp8_ws.cu: by producer warps into shared memory): e2m1 weights become e4m3
// bytes with their E8M0 group scale folded in. In one row's 128-block, group j (32 values) is
// written as e2m1 · 2^(k_j - 6) with k_j = e_j - base, base = the row's largest exponent - 12, so
// k_j <= 12 keeps every value finite, and k_j >= 1 (exponents at most 11 apart, the common case)
// keeps it exact, by a byte lookup (prmt) per 4 values from tables of two integer multiply-adds.
// Rows whose exponents spread wider take rounded tables: the smaller groups' values round to e4m3
// (subnormals from 2^-9 of the largest group's scale), below the FP8 activation rounding. Both
// kernels build the same bytes, so their products and sums are the same bits. Also the
// promotion and the epilogues they share. Only .cu files include this.
#pragma once
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/moe_packed_fragments.cuh"
#include "backend/cuda/moe_tiles.cuh"

namespace dsv4::cuda::detail {

// A row's exponent base over all of K: base = its largest E8M0 exponent - 12, so that every
// group's k = e - base <= 12; k >= 1 (exact tables) for groups within 11 of the largest. The
// row's scale 2^(base - 127) is applied once, in the epilogue (NaN for a 0xFF byte).
struct RowBase {
  uint32_t clo, chi, kmin4;  // table constants; the smallest byte with exact tables (base + 1) x 4
  int base;
  float scale;
};

__device__ __forceinline__ RowBase row_base_of(uint32_t m) {
  const uint32_t hi = max(max(m & 0xFFu, (m >> 8) & 0xFFu), max((m >> 16) & 0xFFu, m >> 24));
  const int base = static_cast<int>(hi) - 12;
  RowBase rb;
  rb.clo = 0x0C080000u - static_cast<uint32_t>(base) * 0x08080800u;
  rb.chi = 0x1C181410u - static_cast<uint32_t>(base) * 0x08080808u;
  rb.kmin4 = static_cast<uint32_t>(max(base + 1, 0)) * 0x01010101u;
  rb.base = base;
  rb.scale = hi == 0xFFu ? __int_as_float(0x7FC00000) : base >= 1 ? __int_as_float(base << 23) : ldexpf(1.f, base - 127);
  return rb;
}

// The base of a row (e: its E8M0 bytes, sc of them) from the four lanes of its quad (lane % 4
// splits the words; every lane of the warp calls it).
__device__ __forceinline__ RowBase row_base_quad(const uint8_t* e, int64_t sc) {
  uint32_t m = 0;
  for (int64_t i = threadIdx.x & 3; i < sc / 4; i += 4) m = __vmaxu4(m, __ldg(reinterpret_cast<const uint32_t*>(e) + i));
  m = __vmaxu4(m, __shfl_xor_sync(0xFFFFFFFFu, m, 1));
  m = __vmaxu4(m, __shfl_xor_sync(0xFFFFFFFFu, m, 2));
  return row_base_of(m);
}

// The same from one thread alone: 16-byte loads where the row allows (all issued before the
// first maximum: one round trip at V4-Flash's 64 / 128 bytes a row).
__device__ __forceinline__ RowBase row_base_thread(const uint8_t* e, int64_t sc) {
  uint32_t m = 0;
  if (sc % 16 == 0 && (reinterpret_cast<uintptr_t>(e) & 15) == 0) {
    const uint4* v = reinterpret_cast<const uint4*>(e);
#pragma unroll 8
    for (int64_t i = 0; i < sc / 16; ++i) {
      const uint4 w = __ldg(v + i);
      m = __vmaxu4(__vmaxu4(m, __vmaxu4(w.x, w.y)), __vmaxu4(w.z, w.w));
    }
  } else {
    for (int64_t i = 0; i < sc / 4; ++i) m = __vmaxu4(m, __ldg(reinterpret_cast<const uint32_t*>(e) + i));
  }
  return row_base_of(m);
}

// Byte permute with PTX prmt's default mode (selector nibble bit 3 clear: plain byte select).
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// Eight e2m1 (element 2i in the low nibble of byte i) -> e4m3 bytes through a group's tables
// (bytes for magnitudes 0-3 / 4-7), in e2m1x8_e4m3's order (even = elements 0, 2, 4, 6; odd = 1,
// 3, 5, 7): the word's nibbles (sign bits cleared) are prmt selectors as stored, so elements 0-3
// and 4-7 are looked up in two prmts, split into even / odd in two more, and the signs moved onto
// bit 7. Exact tables for k in [1, 12]: e2m1 code c (e1 e0 m) -> (c << 2) + 8k for c >= 2 (the
// exponent field + k), 8k for 0.5, 0 for 0.
__device__ __forceinline__ void e2m1x8_e4m3_folded(uint32_t w, uint32_t lo, uint32_t hi, uint32_t& even,
                                                   uint32_t& odd) {
  const uint32_t m = w & 0x77777777u;
  const uint32_t v03 = prmt(lo, hi, m), v47 = prmt(lo, hi, m >> 16);
  even = prmt(v03, v47, 0x6420u) | ((w << 4) & 0x80808080u);
  odd = prmt(v03, v47, 0x7531u) | (w & 0x80808080u);
}

// The exact tables of a group with E8M0 byte b (b >= the row's kmin).
__device__ __forceinline__ void exact_tables(const RowBase& rb, uint32_t b, uint32_t& lo, uint32_t& hi) {
  lo = rb.clo + b * 0x08080800u;
  hi = rb.chi + b * 0x08080808u;
}

// The rounded tables of a group k = byte - base exponents above the row's base: every magnitude
// rounded to nearest e4m3 (the same bytes as the exact tables where those apply; smaller values
// become subnormals or 0).
__device__ __forceinline__ void rounded_tables(int k, uint32_t& lo, uint32_t& hi) {
  const float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  uint32_t t[2] = {0u, 0u};
  for (int c = 1; c < 8; ++c)
    t[c >> 2] |= static_cast<uint32_t>(__nv_cvt_float_to_fp8(ldexpf(mag[c], k - 6), __NV_SATFINITE, __NV_E4M3))
                 << (8 * (c & 3));
  lo = t[0];
  hi = t[1];
}

// True where a group byte of the word e lies below the row's exact range (kmin: 12 or more
// exponents under its largest) or the row holds 0xFF: those blocks take rounded tables.
__device__ __forceinline__ bool needs_rounding(const RowBase& rb, uint32_t e) { return __vsubus4(rb.kmin4, e) != 0u; }

// acc += c · the column's activation scale (accumulator i: column 8 (i / 4) + 2q + i % 2).
template <int N>
__device__ __forceinline__ void promote(const float (&c)[N / 2], const float* xs, float (&acc)[N / 2]) {
  const int q = threadIdx.x & 3;
#pragma unroll
  for (int u = 0; u < N / 8; ++u) {
    const float2 v = *reinterpret_cast<const float2*>(&xs[8 * u + 2 * q]);
    acc[4 * u + 0] = fmaf(c[4 * u + 0], v.x, acc[4 * u + 0]);
    acc[4 * u + 1] = fmaf(c[4 * u + 1], v.y, acc[4 * u + 1]);
    acc[4 * u + 2] = fmaf(c[4 * u + 2], v.x, acc[4 * u + 2]);
    acc[4 * u + 3] = fmaf(c[4 * u + 3], v.y, acc[4 * u + 3]);
  }
}

// The epilogue's [rows][pitch] floats: a warpgroup's accumulators (its thread wt = index in the
// warpgroup, its 64 rows from row0) times 2^6 and their row's scale (rs: rows g, g + 8).
template <int N>
__device__ __forceinline__ void stash_rows(const float (&acc)[N / 2], float rs0, float rs1, int row0, int wt, float* ex,
                                           int pitch) {
  const int q = wt & 3, row = row0 + 16 * (wt >> 5) + ((wt & 31) >> 2);
  const float s0 = rs0 * kE2m1E4m3Unscale, s1 = rs1 * kE2m1E4m3Unscale;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) ex[(row + (i & 2) * 4) * pitch + 8 * (i >> 2) + 2 * q + (i & 1)] = acc[i] * (i & 2 ? s1 : s0);
}

// A CTA's two 64-row weight slices (packed pieces, E8M0 rows, scale bytes per row) and its first
// output row r0: gate/up W1 and W3 at h rows r0 = 64 blockIdx.x; down W2 rows r0 = 128 blockIdx.x
// .. r0 + 127 as two slices.
struct CtaSlices {
  const uint8_t *wp[2], *ep[2];
  int64_t sc, r0;
};
__device__ __forceinline__ CtaSlices cta_slices(const DevWeight& w0, const DevWeight& w1, int64_t r0, int64_t r1) {
  const int64_t rb = w0.in / 2;
  CtaSlices c;
  c.sc = w0.scale_cols;
  c.r0 = r0;
  c.wp[0] = w0.data + packed_row_offset(r0, rb);
  c.wp[1] = w1.data + packed_row_offset(r1, rb);
  c.ep[0] = w0.scale + r0 * c.sc;
  c.ep[1] = w1.scale + r1 * c.sc;
  return c;
}
__device__ __forceinline__ CtaSlices gateup_slices(const DevWeight* tab, int expert) {
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * 64;
  return cta_slices(tab[3 * expert], tab[3 * expert + 2], r0, r0);  // W1, W3
}
__device__ __forceinline__ CtaSlices down_slices(const DevWeight* tab, int expert) {
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * 128;
  return cta_slices(tab[3 * expert + 1], tab[3 * expert + 1], r0, r0 + 64);
}

// The CTA's tile (blockIdx.y; false past the last one: the grid is sized for the most tiles) and
// the activation row of its column c (gate/up: the token of slot start + c; down: the slot).
template <class Args>
__device__ __forceinline__ bool cta_tile(const Args& a, MoeTile& t) {
  if (static_cast<int>(blockIdx.y) >= *a.n_tiles) return false;
  t = a.tiles[blockIdx.y];
  return true;
}
__device__ __forceinline__ int32_t act_row(const Fp8GateUpArgs& a, const MoeTile& t, int c) {
  return a.slot_pair[t.start + c] / a.K;
}
__device__ __forceinline__ int32_t act_row(const Fp8DownArgs&, const MoeTile& t, int c) { return t.start + c; }

// The epilogues, from the [row][pitch] sums of a tile, by threads tid < n of the CTA: gate/up's h
// rows r0 .. r0 + 63 of each token (SwiGLU of the W1 sums, rows 0-63, and the W3 sums, rows
// 64-127: 64 consecutive floats per token), down's y rows r0 .. r0 + 127 (128 consecutive bf16
// per token).
__device__ __forceinline__ void store_h(const float* ex, int pitch, const MoeTile& t, int64_t r0, int64_t I,
                                        float limit, float* H, int tid, int n) {
  const int row = tid & 63;
  for (int col = tid >> 6; col < t.count; col += n / 64)
    H[static_cast<int64_t>(t.start + col) * I + r0 + row] =
        swiglu_clamped(ex[row * pitch + col], ex[(64 + row) * pitch + col], limit);
}
__device__ __forceinline__ void store_y(const float* ex, int pitch, const MoeTile& t, const int32_t* slot_pair,
                                        int64_t r0, int64_t d, __nv_bfloat16* Y, int tid, int n) {
  const int row = tid & 127;
  for (int col = tid >> 7; col < t.count; col += n / 128)
    Y[static_cast<int64_t>(slot_pair[t.start + col]) * d + r0 + row] = __float2bfloat16_rn(ex[row * pitch + col]);
}

}  // namespace dsv4::cuda::detail
