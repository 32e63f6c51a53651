// What the routed-expert kernels share: the tile list built on the device (tokens grouped by
// expert) and the tensor-core path's entry points (moe_mma.cu). Only .cu files include this.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/linear_kernels.cuh"

namespace dsv4::cuda::detail {

// Slots [start, start + count) of one expert (slot s holds pair slot_pair[s] = row * K + k).
struct MoeTile {
  int32_t expert, start, count, pad;
};

// Tensor-core decode path for FP4 experts on FP8 activations (Fast precision): tiles of at most
// kMmaTileTokens tokens, mma.sync m16n8k32 on e4m3 operands (the e2m1 weights converted exactly,
// the activation codes as stored), fp32 accumulation per 32-group, then × E8M0 group scale and the
// activation's 128-block scale (the numbers the SIMT Fast path defines). Needs d, I multiples of
// 128, 16-byte aligned weights and 4-byte aligned E8M0 scales (mma_experts_ok).
constexpr int kMmaTileTokens = 8;
// K slices of the 8-token kernels (one per warp, summed from zero, added in order); the wide
// kernels walk the same slices so that both give the same bits.
constexpr int kMmaKSlices = 8;
// Tiles of the wide (prefill) kernels, moe_mma_wide.cu: up to 8 column groups of 8 tokens.
constexpr int kMmaWideTokens = 64;
bool mma_experts_ok(const DevWeight* host_tab, int n, int64_t d, int64_t I);
// The packed FP4 layout of the tensor-core path: in every 64-byte block (128 values of a row) the
// 4-byte slice q of group j moves to word j of 16-byte slot q, so that the mma thread that owns
// slice q of all four groups loads them with one 16-byte load (4 loads of 4 bytes otherwise,
// which kept the L1 pipeline, not DRAM, busy: ~1.3 TB/s). The rows are also tiled: in a tile of
// kPackTileRows rows, block kb of all its rows is one contiguous 4 KB piece (row r at 64 r), so
// that a warp's loads of 8 rows are 512 contiguous bytes and a tile's blocks stream in order
// (64-byte pieces 2 KB apart held DRAM at ~60% of its bandwidth, H100 ncu). rows % 64 == 0;
// scratch: rows * row_bytes bytes. Its inverse is not needed (packed experts are only read by
// these kernels).
constexpr int kPackTileRows = 64;
constexpr int64_t kPackedBlockStride = kPackTileRows * 64;  // block kb to kb + 1 of a row
constexpr int64_t kPackedPlus8Rows = 8 * 64;                // row r to row r + 8 (same tile)
__host__ __device__ __forceinline__ int64_t packed_row_offset(int64_t row, int64_t row_bytes) {
  return row / kPackTileRows * kPackTileRows * row_bytes + row % kPackTileRows * 64;
}
void pack_fp4_for_mma(uint8_t* data, int64_t rows, int64_t row_bytes, uint8_t* scratch, cudaStream_t s);
// H[slot, i] = swiglu(W1 x, W3 x) for slots of every tile; xq [rows, d] e4m3 codes, xs [d/128][ldxs];
// packed: the weights are in pack_fp4_for_mma's layout.
void mma_gateup(const DevWeight* tab, bool packed, const MoeTile* tiles, const int32_t* n_tiles, unsigned max_tiles,
                const int32_t* slot_pair, int K, const uint8_t* xq, const float* xs, int64_t ldxs, int64_t d,
                int64_t I, float limit, float* H, cudaStream_t s);
// Y[pair, :] = W2 h[slot] for slots of every tile; hq [slots, I] codes, hs [I/128][ldhs].
void mma_down(const DevWeight* tab, bool packed, const MoeTile* tiles, const int32_t* n_tiles, unsigned max_tiles,
              const int32_t* slot_pair, const uint8_t* hq, const float* hs, int64_t ldhs, int64_t d, int64_t I,
              float* Y, cudaStream_t s);

// The wide kernels (same contracts; tiles of <= kMmaWideTokens tokens; packed weights only).
void mma_gateup_wide(const DevWeight* tab, const MoeTile* tiles, const int32_t* n_tiles, unsigned max_tiles,
                     const int32_t* slot_pair, int K, const uint8_t* xq, const float* xs, int64_t ldxs, int64_t d,
                     int64_t I, float limit, float* H, cudaStream_t s);
void mma_down_wide(const DevWeight* tab, const MoeTile* tiles, const int32_t* n_tiles, unsigned max_tiles,
                   const int32_t* slot_pair, const uint8_t* hq, const float* hs, int64_t ldhs, int64_t d, int64_t I,
                   float* Y, cudaStream_t s);

// The wgmma kernels (moe_wgmma.cu; tiles of tile_tokens = 64 or 128 tokens, packed weights, bf16
// activations from act_quant_bf16_wgmma: xb [rows, d], hb [slots, I]). Available on an sm_90
// device in a build for arch 90a; they sum in another order than the kernels above (not the same
// bits).
void wgmma_gateup(int tile_tokens, const DevWeight* tab, const MoeTile* tiles, const int32_t* n_tiles,
                  unsigned max_tiles, const int32_t* slot_pair, int K, const __nv_bfloat16* xb, int64_t x_rows, int64_t d,
                  int64_t I, float limit, float* H, cudaStream_t s);
void wgmma_down(int tile_tokens, const DevWeight* tab, const MoeTile* tiles, const int32_t* n_tiles,
                unsigned max_tiles, const int32_t* slot_pair, const __nv_bfloat16* hb, int64_t h_rows, int64_t d,
                int64_t I, float* Y, cudaStream_t s);

// The FP8 wgmma decode kernels (moe_wgmma_decode.cu): mma_gateup / mma_down's contracts on packed
// weights (tiles of <= tile_tokens = 8 or 16 tokens, the mma-packed codes of act_quant_fp8), each
// 32-group's products summed by the FP8 tensor core (not the mma.sync kernels' bits). Need
// fp8_decode_ok: an sm_90 device, an arch-90a build, d and I multiples of 128.
bool fp8_decode_ok(int64_t d, int64_t I, int tile_tokens = 8);
void fp8_decode_gateup(int tile_tokens, const DevWeight* tab, const MoeTile* tiles, const int32_t* n_tiles,
                       unsigned max_tiles, const int32_t* slot_pair, int K, const uint8_t* xq, const float* xs,
                       int64_t ldxs, int64_t d, int64_t I, float limit, float* H, cudaStream_t s);
void fp8_decode_down(int tile_tokens, const DevWeight* tab, const MoeTile* tiles, const int32_t* n_tiles,
                     unsigned max_tiles, const int32_t* slot_pair, const uint8_t* hq, const float* hs, int64_t ldhs,
                     int64_t d, int64_t I, float* Y, cudaStream_t s);

// The FP8 wgmma prefill kernels: tiles of <= kMoeFp8WideTokens tokens on packed weights, the
// codes of act_quant_fp8_wgmma_b (gate/up: xq [x_rows, d], xs [d/128][ldxs]; down: hq [h_rows, I],
// hs [I/128][ldhs]); the E8M0 group scales folded into the e4m3 weights, each 128-block's products
// summed by the FP8 tensor core. Two kernel sets compute the same bits: moe_wgmma_fp8_wide.cu
// (each warpgroup converts its own weights) and moe_wgmma_fp8_ws.cu (warp-specialised: a
// producer warpgroup copies and converts, two consumers run the wgmmas). Gate/up: one CTA per 64
// rows of h and tile (H[slot, i] = swiglu(W1 x, W3 x)); down: one per 128 rows of y and tile
// (Y[pair, :] = W2 h[slot], stored as bf16); both launched as programmatic dependents (moe.cu). Need
// wgmma_available(), d and I multiples of 128.
constexpr int kMoeFp8WideTokens = 128;
struct Fp8GateUpArgs {
  const DevWeight* tab;
  const MoeTile* tiles;
  const int32_t *n_tiles, *slot_pair;
  int K;
  const uint8_t* xq;
  const float* xs;
  int64_t ldxs, d, I;
  float limit;
  float* H;
};
struct Fp8DownArgs {
  const DevWeight* tab;
  const MoeTile* tiles;
  const int32_t *n_tiles, *slot_pair;
  const uint8_t* hq;
  const float* hs;
  int64_t ldhs, d, I;
  __nv_bfloat16* Y;  // [pairs, d] in bf16: the routed sum (hc_post or combine) widens them
};
struct Fp8TileKernels {
  void (*gateup)(Fp8GateUpArgs);
  void (*down)(Fp8DownArgs);
  int threads;
  size_t smem;
  bool persistent = false;        // a CTA an SM walking (tile, slice) items, not a CTA an item
  int max_tokens = kMoeFp8WideTokens;  // tile tokens the kernels take (group_pairs' merge width)
};
Fp8TileKernels fp8_wide_kernels();
// producer_groups: 1 or 2 producer warpgroups (384 / 512 threads); consumer_fence: the consumers
// make the stage's generic-proxy writes (the codes' cp.async, the folded weights' stores) visible
// to their wgmmas after their wait, instead of the producers before their arrival (whose fence may
// also wait on their copies still in flight; bench/NOTES.md step 23).
Fp8TileKernels fp8_ws_kernels(int producer_groups, bool consumer_fence);
// One producer warpgroup, fence in the consumers, persistent: a CTA an SM walks the (tile, row
// slice) items on one ring, the producers running into the next item while the consumers store
// the last one's outputs through its last stage (moe_wgmma_fp8_persistent.cu). Same bits. wide:
// tiles of up to kMoeFp8MergeTokens (an expert's last two 128-token tiles merged where they hold
// at most that many: its weights folded once for them), 4 stages and a second codes ring.
constexpr int kMoeFp8MergeTokens = 192;
Fp8TileKernels fp8_ws_persistent_kernels(bool wide = false);
// h = silu(min(g, L)) * clamp(v, ±L) (limit <= 0: plain SwiGLU), every expert kernel's epilogue.
__device__ __forceinline__ float swiglu_clamped(float g, float v, float limit) {
  if (limit > 0.f) {
    g = fminf(g, limit);
    v = fminf(fmaxf(v, -limit), limit);
  }
  return g / (1.f + expf(-g)) * v;
}

}  // namespace dsv4::cuda::detail
