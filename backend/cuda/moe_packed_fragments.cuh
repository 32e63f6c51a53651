// What the expert kernels on the packed layout share (moe_mma_wide.cu, moe_wgmma_decode.cu,
// moe_wgmma_fp8_wide.cu): the thread's weight fragments of one 128-block in the tiled packed
// layout (pack_fp4_for_mma), read straight into registers, and the E8M0 group scales. Only .cu
// files include this.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/moe_mma_block.cuh"
#include "backend/cuda/moe_tiles.cuh"

namespace dsv4::cuda::detail {

// One 128-block of the thread's rows g / g + 8 for NM weights: 16 bytes of packed FP4 per row
// (word j = group j's values 8q .. 8q + 7) and the rows' E8M0 words (byte j = group j).
template <int NM>
struct WBlock {
  uint4 a[NM], b[NM];
  uint32_t ea[NM], eb[NM];
};

__device__ __forceinline__ uint32_t word_of(const uint4& v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }

// pa[m]: the thread's 16 bytes of block 0 of row g (packed_row_offset); row g + 8 is
// kPackedPlus8Rows further, block kb kb * kPackedBlockStride further.
template <int NM>
__device__ __forceinline__ void load_block(WBlock<NM>& o, const uint8_t* const (&pa)[NM], const uint8_t* const (&sa)[NM],
                                           int64_t sc, int64_t kb) {
#pragma unroll
  for (int m = 0; m < NM; ++m) {
    o.a[m] = __ldg(reinterpret_cast<const uint4*>(pa[m] + kb * kPackedBlockStride));
    o.b[m] = __ldg(reinterpret_cast<const uint4*>(pa[m] + kPackedPlus8Rows + kb * kPackedBlockStride));
    o.ea[m] = __ldg(reinterpret_cast<const uint32_t*>(sa[m] + kb * 4));
    o.eb[m] = __ldg(reinterpret_cast<const uint32_t*>(sa[m] + 8 * sc + kb * 4));
  }
}

// Group j's scale from an E8M0 word: the exponent-field move, or e8m0_dev where a byte of the
// thread's words is 0x00 / 0xFF (no warp-wide instruction depends on the choice here).
__device__ __forceinline__ float group_scale(uint32_t word, int j, bool special) {
  if (__builtin_expect(special, 0)) return e8m0_dev(static_cast<uint8_t>(word >> (8 * j)));
  return j == 0 ? e8m0_plain<0>(word) : j == 1 ? e8m0_plain<1>(word) : j == 2 ? e8m0_plain<2>(word) : e8m0_plain<3>(word);
}

}  // namespace dsv4::cuda::detail
