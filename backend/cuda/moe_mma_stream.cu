// Routed experts at decode sizes on persistent CTAs that stream their weights through a ring of
// shared-memory stages (packed FP4 only). The per-tile kernels of moe_mma.cu load a 128-block of
// weights into registers, wait for it, multiply, and only then ask for the next one: each warp
// has one block of loads in flight, and a wave of CTAs loads, then computes, leaving DRAM idle in
// between (1.1-1.8 TB/s). Here each thread copies its own fragments of the next S - 1 blocks
// with cp.async while it multiplies the current one, and a CTA walks work items (expert tile x
// 16·kRB output rows) with stride gridDim.x, so its copies run ahead across item boundaries and
// no CTA pays a launch ramp per item.
// Same warp / K-slice / row-block mapping and the same block product (moe_mma_block.cuh) as the
// per-tile kernels, partials reduced in warp order: the same bits.
// Measured (bench/NOTES.md step 8): no faster than the per-tile kernels, so it is opt-in
// (set_moe_stream_stages, DSV4_MOE_STREAM): the weight loads were not what bounds these kernels.
#include <algorithm>
#include <cstdlib>

#include "backend/cuda/check.h"
#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/moe.h"
#include "backend/cuda/moe_mma_block.cuh"
#include "backend/cuda/moe_tiles.cuh"
#include "backend/cuda/ops_common.cuh"
#include "backend/cuda/pdl.cuh"

namespace dsv4::cuda::detail {
namespace {

constexpr int kWarps = kMmaKSlices;  // one K slice per warp, as the per-tile kernels

// Per warp and stage: each lane's 16 bytes of rows g and g+8 of every weight, and their E8M0
// words; the partials of the last two items (double-buffered: one barrier per item).
template <int NM, int RB, int S>
struct StreamSmem {
  uint4 w[S][kWarps][NM][2][32];
  uint32_t e[S][kWarps][NM][2][32];
  float red[2][kWarps][RB][NM][4][32];
};

// The token rows a thread's operand reads: column g's (-1: no token there) and those whose
// scales columns 2q / 2q+1 take; loaded one item ahead, turned into pointers when used.
struct TokenRows {
  int g, c0, c1;
};

// Gate / up: W1 and W3 of the tile's expert times the tokens' codes; SwiGLU into H.
struct GateUpOp {
  static constexpr int NM = 2;
  const DevWeight* tab;
  const MoeTile* tiles;
  const int32_t* n_tiles;
  const int32_t* slot_pair;
  int K;
  const uint8_t* xq;
  const float* xs;
  int64_t ldxs, d, I;
  float limit;
  float* H;

  __device__ int64_t in() const { return d; }
  __device__ const DevWeight* weight(int expert, int m) const { return tab + 3 * expert + (m == 0 ? 0 : 2); }
  __device__ TokenRows rows(const MoeTile& t, int g, int q) const {
    auto row_of = [&](int col) { return slot_pair[t.start + (col < t.count ? col : 0)] / K; };
    return {g < t.count ? row_of(g) : -1, row_of(2 * q), row_of(2 * q + 1)};
  }
  __device__ TokenOperand operand(const TokenRows& r, int q) const {
    return {r.g >= 0 ? xq + r.g * d + 32 * q : nullptr, xs + r.c0, xs + r.c1, ldxs};
  }
  __device__ void store(const MoeTile& t, int64_t row, int q, const float (&acc)[NM][4]) const {
    store_swiglu(H, I, t.start, t.count, row, q, acc, limit);
  }
};

// Down: W2 of the tile's expert times the slots' h codes; rows of Y by (row, k) pair.
struct DownOp {
  static constexpr int NM = 1;
  const DevWeight* tab;
  const MoeTile* tiles;
  const int32_t* n_tiles;
  const int32_t* slot_pair;
  const uint8_t* hq;
  const float* hs;
  int64_t ldhs, d, I;
  float* Y;

  __device__ int64_t in() const { return I; }
  __device__ const DevWeight* weight(int expert, int) const { return tab + 3 * expert + 1; }
  __device__ TokenRows rows(const MoeTile& t, int g, int q) const {
    auto slot_of = [&](int col) { return t.start + (col < t.count ? col : 0); };
    return {g < t.count ? slot_of(g) : -1, slot_of(2 * q), slot_of(2 * q + 1)};
  }
  __device__ TokenOperand operand(const TokenRows& r, int q) const {
    return {r.g >= 0 ? hq + static_cast<int64_t>(r.g) * I + 32 * q : nullptr, hs + r.c0, hs + r.c1, ldhs};
  }
  __device__ void store(const MoeTile& t, int64_t row, int q, const float (&acc)[NM][4]) const {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int col = 2 * q + (i & 1);
      if (col < t.count)
        Y[static_cast<int64_t>(slot_pair[t.start + col]) * d + row + (i >= 2 ? 8 : 0)] = acc[0][i] * kE2m1E4m3Unscale;
    }
  }
};

// The copy side of a warp: which (item, row block, 128-block) its next stage holds, and the
// thread's row-g pointers into the item's weights and scales.
template <class Op, int RB>
struct Producer {
  static constexpr int NM = Op::NM;
  int item, kb, rb;  // 32-bit: fewer registers (items < 65536 tiles x 512 row groups)
  const uint8_t* w[NM];
  const uint8_t* e[NM];

  __device__ void point_at(const Op& op, int n_rg, int rbytes, int sc, int g, int q) {
    const int expert = op.tiles[item / n_rg].expert;
    const int64_t r0 = static_cast<int64_t>(item % n_rg) * 16 * RB + g;
#pragma unroll
    for (int m = 0; m < NM; ++m) {
      const DevWeight* dw = op.weight(expert, m);
      w[m] = dw->data + r0 * rbytes + 16 * q;
      e[m] = dw->scale + r0 * sc;
    }
  }
};

template <class Op, int RB, int S, int MINB>
__global__ void __launch_bounds__(kWarps * 32, MINB) stream_kernel(const Op op, int n_rg) {
  constexpr int NM = Op::NM;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  StreamSmem<NM, RB, S>& sm = *reinterpret_cast<StreamSmem<NM, RB, S>*>(smem_raw);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
  const int n_items = *op.n_tiles * n_rg;  // group_kernel finished before the kernel this one follows
  const int in = static_cast<int>(op.in()), rbytes = in / 2, sc = in / 32, nkb = in / 128;
  const int kb0 = warp * nkb / kWarps, kb1 = (warp + 1) * nkb / kWarps;
  const int step = gridDim.x;

  Producer<Op, RB> p{static_cast<int>(blockIdx.x), kb0, 0, {}, {}};
  if (p.item < n_items) p.point_at(op, n_rg, rbytes, sc, g, q);
  // One commit group per consumed block, in consumption order (an empty group past the end), so
  // that wait<S - 1> before block s means block s has landed.
  auto produce = [&](int slot) {
    if (kb1 > kb0 && p.item < n_items) {
#pragma unroll
      for (int m = 0; m < NM; ++m) {
        const uint8_t* wa = p.w[m] + p.rb * 16 * rbytes + p.kb * 64;
        const uint8_t* ea = p.e[m] + p.rb * 16 * sc + p.kb * 4;
        cp_async16(&sm.w[slot][warp][m][0][lane], wa);
        cp_async16(&sm.w[slot][warp][m][1][lane], wa + 8 * rbytes);
        cp_async4(&sm.e[slot][warp][m][0][lane], ea);
        cp_async4(&sm.e[slot][warp][m][1][lane], ea + 8 * sc);
      }
      if (++p.kb == kb1) {
        p.kb = kb0;
        if (++p.rb == RB) {
          p.rb = 0;
          p.item += step;
          if (p.item < n_items) p.point_at(op, n_rg, rbytes, sc, g, q);
        }
      }
    }
    cp_async_commit();
  };
  // Weights do not depend on the kernel before this one: the first stages are copied before the wait.
#pragma unroll
  for (int s = 0; s < S - 1; ++s) produce(s);

  // The tile of the next item and the token rows of the one after are loaded an item ahead, so
  // that an item starts without waiting on that chain (tile -> slot list -> rows).
  const MoeTile none{0, 0, 0, 0};
  const int first = blockIdx.x;
  MoeTile t_next = first < n_items ? op.tiles[first / n_rg] : none;
  pdl_wait();  // the activations are being quantised by the kernel before this one (pdl.cuh)
  TokenRows r_next = op.rows(t_next, g, q);
  if (first + step < n_items) t_next = op.tiles[(first + step) / n_rg];

  int cslot = 0, pslot = S - 1, buf = 0;
  for (int item = first; item < n_items; item += step, buf ^= 1) {
    const MoeTile t = op.tiles[item / n_rg];  // (t_next of the last item: an L1 hit)
    const TokenOperand x = op.operand(r_next, q);
    r_next = op.rows(t_next, g, q);  // for item + step (a harmless read of tile 0's slots past the end)
    if (item + 2 * step < n_items) t_next = op.tiles[(item + 2 * step) / n_rg];
    for (int rb = 0; rb < RB; ++rb) {
      float part[NM][4] = {};
      for (int kb = kb0; kb < kb1; ++kb) {
        produce(pslot);
        pslot = pslot + 1 == S ? 0 : pslot + 1;
        BlockOperands<NM> o;
        load_packed_tokens<NM>(x, kb, o);  // small and L2-resident: asked for before the wait
        cp_async_wait<S - 1>();
#pragma unroll
        for (int m = 0; m < NM; ++m) {
          const uint4 a = sm.w[cslot][warp][m][0][lane], b = sm.w[cslot][warp][m][1][lane];
          o.wa[m][0] = a.x, o.wa[m][1] = a.y, o.wa[m][2] = a.z, o.wa[m][3] = a.w;
          o.wb[m][0] = b.x, o.wb[m][1] = b.y, o.wb[m][2] = b.z, o.wb[m][3] = b.w;
          o.ea[m] = sm.e[cslot][warp][m][0][lane];
          o.eb[m] = sm.e[cslot][warp][m][1][lane];
        }
        cslot = cslot + 1 == S ? 0 : cslot + 1;
        block_product<NM>(o, part);
      }
#pragma unroll
      for (int m = 0; m < NM; ++m)
#pragma unroll
        for (int i = 0; i < 4; ++i) sm.red[buf][warp][rb][m][i][lane] = part[m][i];
    }
    __syncthreads();
    if (warp < RB) {  // row block `warp`: the warps' partials in warp order (the per-tile kernels' sum)
      float acc[NM][4];
#pragma unroll
      for (int m = 0; m < NM; ++m)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float v = sm.red[buf][0][warp][m][i][lane];
          for (int w = 1; w < kWarps; ++w) v += sm.red[buf][w][warp][m][i][lane];
          acc[m][i] = v;
        }
      op.store(t, static_cast<int64_t>(item % n_rg) * 16 * RB + 16 * warp + g, q, acc);
    }
  }
}

int g_stages = -2;  // set_moe_stream_stages; -2: not read from DSV4_MOE_STREAM yet
int g_row_blocks = 0;  // set_moe_stream_row_blocks; 0: by size

// CTAs per SM each instantiation reaches (its shared memory set up once).
template <class Op, int RB, int S, int MINB>
int resident_ctas() {
  static const int n = [] {
    const auto k = stream_kernel<Op, RB, S, MINB>;
    const int bytes = static_cast<int>(sizeof(StreamSmem<Op::NM, RB, S>));
    DSV4_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    int per_sm = 0;
    DSV4_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, kWarps * 32, bytes));
    DSV4_CHECK(per_sm > 0, "moe stream kernel: no CTA fits on a multiprocessor");
    return per_sm;
  }();
  return n;
}

// Items of RB 16-row blocks; grid = the resident CTAs, or fewer when the items are fewer.
template <class Op, int RB, int S, int MINB>
void launch_stream(const Op& op, int64_t rows, unsigned max_tiles, cudaStream_t s) {
  const int n_rg = static_cast<int>(rows / (16 * RB));
  const int64_t grid =
      std::min<int64_t>(int64_t{max_tiles} * n_rg, int64_t{resident_ctas<Op, RB, S, MINB>()} * sm_count());
  if (grid <= 0) return;
  launch_dependent(stream_kernel<Op, RB, S, MINB>, dim3(static_cast<unsigned>(grid)), dim3(kWarps * 32),
                   sizeof(StreamSmem<Op::NM, RB, S>), s, op, n_rg);
}

// Gate/up (NM 2): 2 stages fit 3 CTAs per SM (72 KB each at RB 2), 3 or 4 stages 2. Down (NM 1): 3.
// RB 1 (items of 16 rows) by default: at batch 1 the 2-per-SM grids share 768 gate/up blocks
// evenly (2.9 per CTA) where 32-row items leave a third of the CTAs a second item.
template <class Op, int RB>
void launch_stages(int stages, const Op& op, int64_t rows, unsigned max_tiles, cudaStream_t s) {
  constexpr int minb_deep = Op::NM == 2 ? 2 : 3;
  switch (stages) {
    case 2: launch_stream<Op, RB, 2, 3>(op, rows, max_tiles, s); break;
    case 3: launch_stream<Op, RB, 3, minb_deep>(op, rows, max_tiles, s); break;
    default: launch_stream<Op, RB, 4, minb_deep>(op, rows, max_tiles, s); break;
  }
}

template <class Op>
void launch(const Op& op, int64_t rows, unsigned max_tiles, cudaStream_t s) {
  if (g_row_blocks == 2 && (rows / 16) % 2 == 0)
    launch_stages<Op, 2>(moe_stream_stages(), op, rows, max_tiles, s);
  else
    launch_stages<Op, 1>(moe_stream_stages(), op, rows, max_tiles, s);
}

}  // namespace

int moe_stream_stages() {
  if (g_stages == -2) {
    const char* env = std::getenv("DSV4_MOE_STREAM");  // for A/B runs of whole models: 0 = per-tile kernels
    g_stages = env && *env ? std::atoi(env) : 0;
    DSV4_CHECK(g_stages == 0 || (g_stages >= 2 && g_stages <= 4) || g_stages == -1,
               "DSV4_MOE_STREAM: -1 or 0 (default), 2, 3 or 4 stages");
    if (env && *env && g_stages == 0) g_stages = -1;
  }
  return g_stages == 0 ? (kMoeStreamDefaultStages > 0 ? kMoeStreamDefaultStages : -1) : g_stages;
}

bool moe_stream_ok(int64_t d, int64_t I) { return moe_stream_stages() > 0 && d % 128 == 0 && I % 128 == 0; }

void mma_gateup_stream(const DevWeight* tab, const MoeTile* tiles, const int32_t* n_tiles, unsigned max_tiles,
                       const int32_t* slot_pair, int K, const uint8_t* xq, const float* xs, int64_t ldxs, int64_t d,
                       int64_t I, float limit, float* H, cudaStream_t s) {
  launch(GateUpOp{tab, tiles, n_tiles, slot_pair, K, xq, xs, ldxs, d, I, limit, H}, I, max_tiles, s);
}

void mma_down_stream(const DevWeight* tab, const MoeTile* tiles, const int32_t* n_tiles, unsigned max_tiles,
                     const int32_t* slot_pair, const uint8_t* hq, const float* hs, int64_t ldhs, int64_t d, int64_t I,
                     float* Y, cudaStream_t s) {
  launch(DownOp{tab, tiles, n_tiles, slot_pair, hq, hs, ldhs, d, I, Y}, d, max_tiles, s);
}

}  // namespace dsv4::cuda::detail

namespace dsv4::cuda {

void set_moe_stream_row_blocks(int row_blocks) {
  DSV4_CHECK(row_blocks >= 0 && row_blocks <= 2, "set_moe_stream_row_blocks: 0 (default), 1 or 2");
  detail::g_row_blocks = row_blocks;
}

void set_moe_stream_stages(int stages) {
  DSV4_CHECK(stages == -1 || stages == 0 || (stages >= 2 && stages <= 4),
             "set_moe_stream_stages: -1 (per-tile kernels), 0 (default), 2, 3 or 4 stages");
  detail::moe_stream_stages();  // read the environment first so that this call wins
  detail::g_stages = stages;
}

}  // namespace dsv4::cuda
