// Parity of cuda::sparse_attention with the CPU attention. The CPU's per-row loop is embedded in
// attention_forward, so the reference here rebuilds its key list (window from chunk / ring,
// then HCA entries or CSA selections) and applies attend()'s formula: softmax with a sink logit
// in the denominator, scale 1/sqrt(D), K = V.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/linear.h"
#include "backend/cuda/act_quant.h"
#include "backend/cuda/device.h"
#include "backend/cuda/ops.h"
#include "core/error.h"
#include "model/attention.h"
#include "tests/cuda/ops_test_util.h"

namespace dsv4 {
namespace {

using cuda::DeviceBuffer;
using cuda::to_device;
using cuda::to_host;
using test::bf16_bits;
using test::poisoned;
using test::randn;
using test::rel_error;

enum class Kind { SWA, HCA, CSA };

// How a case is checked: the fp32 kernel against the CPU formula, or the Fast (bf16 tensor-core)
// path, whose error must show bf16 rounding (so it really ran) and stay within bf16 accuracy.
// FastBf16: the Fast path on keys stored as bf16 (a Fast model's cache): the warpgroup-MMA kernel
// where the device and build have it.
enum class Path { Exact, FastMma, FastFallback, FastBf16 };

// R rows of one chunk starting at p0 (rows at positions p0 + r), a ring holding the W positions
// before p0, and n_entries compressed entries; CSA rows select n_sel entries with some -1 slots.
void run_case(Kind kind, int64_t R, int64_t p0, int64_t H, int64_t D, int64_t W, int64_t n_entries, int64_t n_sel,
              Path path = Path::Exact) {
  const std::vector<float> q = randn(R * H * D), chunk = randn(R * D), ring = randn(W * D),
                           entries = randn(std::max<int64_t>(n_entries, 1) * D), sink = randn(H);
  std::vector<int32_t> sel(R * n_sel);
  for (int64_t i = 0; i < R * n_sel; ++i)
    sel[i] = (i % 5 == 3) ? -1 : static_cast<int32_t>(test::rng()() % n_entries);
  // The device keys: bf16 bits for FastBf16 (the CPU reference reads the same values as fp32).
  auto keys_of = [&](const std::vector<float>& v) {
    return path == Path::FastBf16 ? to_device(bf16_bits(v)) : to_device(v);
  };
  const std::vector<float> chunk_ref = path == Path::FastBf16 ? test::bf16_round(chunk) : chunk,
                           ring_ref = path == Path::FastBf16 ? test::bf16_round(ring) : ring,
                           entries_ref = path == Path::FastBf16 ? test::bf16_round(entries) : entries;
  // FastBf16 passes q as bf16 too (the model's form; the kernels round fp32 q to the same values).
  DeviceBuffer dq = path == Path::FastBf16 ? to_device(bf16_bits(q)) : to_device(q), dchunk = keys_of(chunk),
               dring = keys_of(ring), dent = keys_of(entries),
               dsink = to_device(sink), dsel = to_device(sel), dout = poisoned<float>(R * H * D);
  std::vector<cuda::AttnRow> rows;
  std::vector<float> ref(R * H * D);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (int64_t r = 0; r < R; ++r) {
    const int64_t p = p0 + r;
    cuda::AttnRow a{p, dchunk.as<float>(), p0, dring.as<float>(), dent.as<float>(), 0, nullptr, 0};
    std::vector<const float*> keys;
    for (int64_t t = std::max<int64_t>(0, p - W + 1); t <= p; ++t)
      keys.push_back(t >= p0 ? chunk_ref.data() + (t - p0) * D : ring_ref.data() + (t % W) * D);
    if (kind == Kind::HCA) {
      a.n_entries = std::min<int64_t>(n_entries, 1 + r % n_entries + n_entries / 2);  // varies per row
      for (int64_t w = 0; w < a.n_entries; ++w) keys.push_back(entries_ref.data() + w * D);
    } else if (kind == Kind::CSA) {
      a.sel = dsel.as<int32_t>() + r * n_sel;
      a.n_sel = n_sel;
      for (int64_t i = 0; i < n_sel; ++i)
        if (sel[r * n_sel + i] >= 0) keys.push_back(entries_ref.data() + int64_t(sel[r * n_sel + i]) * D);
    }
    rows.push_back(a);
    std::vector<float> scratch;
    for (int64_t h = 0; h < H; ++h)
      attend(q.data() + (r * H + h) * D, keys, D, scale, sink[h], ref.data() + (r * H + h) * D, scratch);
  }
  DeviceBuffer drows = to_device(rows);
  cuda::sparse_attention(dq.as<float>(), drows.as<cuda::AttnRow>(), R, H, D, W, dsink.as<float>(), dout.as<float>(),
                         nullptr, path != Path::Exact, path == Path::FastBf16 ? cuda::KeyFormat::BF16 : cuda::KeyFormat::F32,
                         path == Path::FastBf16 ? cuda::KeyFormat::BF16 : cuda::KeyFormat::F32);
  const double err = rel_error(to_host<float>(dout, ref.size()), ref);
  if (path == Path::FastMma || path == Path::FastBf16) {
    std::printf("  fast attention%s R=%lld H=%lld: rel error %.2e\n", path == Path::FastBf16 ? " (bf16 keys)" : "",
                (long long)R, (long long)H, err);
    EXPECT_GT(err, 1e-6);  // bf16 operands: the tensor-core kernel ran
    EXPECT_LE(err, 1e-2);
  } else {
    EXPECT_LE(err, 1e-5);
  }
}

// V4-Flash shapes: H 64, D 512, window 128, top-512 (CSA) / long HCA lists.
// expand_row_plans: each job's rows are its first row with pos + i, HCA n_entries (pos + 1) /
// ratio, CSA sel + i stride and the indexer rows {keys, (pos + 1) / ratio}; nothing past n.
TEST(CudaOpsAttention, RowPlansExpandFromSegments) {
  DSV4_REQUIRE_GPU();
  const int64_t n0 = 300, n1 = 7, topk = 16;
  DeviceBuffer attn = poisoned<cuda::AttnRow>(n0 + n1 + 1), index = poisoned<cuda::IndexerRow>(n0 + 1);
  auto* A = attn.as<cuda::AttnRow>();
  auto* X = index.as<cuda::IndexerRow>();
  const auto fake = [](uintptr_t v) { return reinterpret_cast<const float*>(v); };
  const int32_t* sel0 = reinterpret_cast<const int32_t*>(uintptr_t{0x10000});
  std::vector<cuda::RowPlanJob> jobs = {
      {{1000, fake(0x100), 1000, fake(0x200), fake(0x300), 0, sel0, topk}, A, X, fake(0x400), n0, 4, topk, 0},
      {{5, fake(0x500), 5, fake(0x600), fake(0x700), 0, nullptr, 0}, A + n0, nullptr, nullptr, n1, 128, 0, 1}};
  DeviceBuffer dj = to_device(jobs);
  cuda::expand_row_plans(dj.as<cuda::RowPlanJob>(), 2, n0, nullptr);
  const std::vector<cuda::AttnRow> a = to_host<cuda::AttnRow>(attn, n0 + n1 + 1);
  const std::vector<cuda::IndexerRow> x = to_host<cuda::IndexerRow>(index, n0 + 1);
  for (int64_t i = 0; i < n0; ++i) {
    const int64_t p = 1000 + i;
    ASSERT_EQ(a[i].pos, p);
    EXPECT_EQ(a[i].chunk_kv, fake(0x100));
    EXPECT_EQ(a[i].chunk_p0, 1000);
    EXPECT_EQ(a[i].ring, fake(0x200));
    EXPECT_EQ(a[i].entries, fake(0x300));
    EXPECT_EQ(a[i].n_entries, 0);
    EXPECT_EQ(a[i].sel, sel0 + i * topk);
    EXPECT_EQ(a[i].n_sel, topk);
    EXPECT_EQ(x[i].keys, static_cast<const void*>(fake(0x400)));
    EXPECT_EQ(x[i].n_visible, (p + 1) / 4);
  }
  for (int64_t i = 0; i < n1; ++i) {
    const cuda::AttnRow& r = a[n0 + i];
    EXPECT_EQ(r.pos, 5 + i);
    EXPECT_EQ(r.n_entries, (5 + i + 1) / 128);
    EXPECT_EQ(r.sel, nullptr);
    EXPECT_EQ(r.chunk_kv, fake(0x500));
  }
  // Past each job: untouched (the poison).
  EXPECT_EQ(std::memcmp(&a[n0 + n1], to_host<cuda::AttnRow>(poisoned<cuda::AttnRow>(1), 1).data(),
                        sizeof(cuda::AttnRow)),
            0);
  EXPECT_EQ(std::memcmp(&x[n0], to_host<cuda::IndexerRow>(poisoned<cuda::IndexerRow>(1), 1).data(),
                        sizeof(cuda::IndexerRow)),
            0);
}

TEST(CudaOpsAttention, CsaDecodeSplitKeys) {
  DSV4_REQUIRE_GPU();
  run_case(Kind::CSA, 1, 5000, 64, 512, 128, 3000, 512);  // one row: keys split across blocks
}
TEST(CudaOpsAttention, CsaBatch) {
  DSV4_REQUIRE_GPU();
  run_case(Kind::CSA, 40, 200, 64, 512, 128, 800, 512);  // window partly in the ring
}
TEST(CudaOpsAttention, HcaSmallBatch) {
  DSV4_REQUIRE_GPU();
  run_case(Kind::HCA, 3, 70, 64, 512, 128, 300, 0);  // window starts at 0 for early rows
}
TEST(CudaOpsAttention, SwaPrefixFromZero) {
  DSV4_REQUIRE_GPU();
  run_case(Kind::SWA, 37, 0, 64, 512, 128, 0, 0);
}
// The Fast tensor-core kernel (H % 64 == 0, D 512): split keys at decode sizes (up to 32 splits:
// some hold fewer than a 32-key tile, some none), one CTA per row at prefill sizes, two head
// groups; a single row with the window alone (most splits empty) and with a long HCA list.
void run_tensor_core_shapes(Path path) {
  run_case(Kind::CSA, 1, 5000, 64, 512, 128, 3000, 512, path);
  run_case(Kind::SWA, 1, 5000, 64, 512, 128, 0, 0, path);
  run_case(Kind::HCA, 1, 5000, 64, 512, 128, 3000, 0, path);
  run_case(Kind::CSA, 2, 5000, 64, 512, 128, 3000, 512, path);
  run_case(Kind::CSA, 40, 200, 64, 512, 128, 800, 512, path);
  run_case(Kind::HCA, 3, 70, 64, 512, 128, 300, 0, path);
  run_case(Kind::SWA, 37, 0, 64, 512, 128, 0, 0, path);
  run_case(Kind::CSA, 300, 1000, 64, 512, 128, 900, 512, path);
  run_case(Kind::CSA, 2, 600, 128, 512, 128, 700, 512, path);
  run_case(Kind::CSA, 24, 900, 64, 512, 128, 1000, 512, path);  // split rows merged four columns per thread
}
TEST(CudaOpsAttention, FastTensorCoreDecodeAndPrefill) {
  DSV4_REQUIRE_GPU();
  run_tensor_core_shapes(Path::FastMma);
}
// Shapes the tensor-core kernel does not take run the fp32 kernel in Fast precision too.
TEST(CudaOpsAttention, FastFallsBackToFp32ForOtherShapes) {
  DSV4_REQUIRE_GPU();
  run_case(Kind::CSA, 1, 5000, 32, 512, 128, 3000, 512, Path::FastFallback);
  run_case(Kind::CSA, 6, 9, 4, 128, 8, 5, 4, Path::FastFallback);
  run_case(Kind::HCA, 5, 300, 64, 256, 128, 40, 0, Path::FastFallback);
}
// Batches of >= 16 rows merge their splits four columns per thread (ops_attention.cu): split
// fp32 calls at 20 / 16 rows (D 512, and D 256 where a block's columns pass the row end) and a
// split tensor-core call at 24 rows.
TEST(CudaOpsAttention, WideMergeAtBatchSizes) {
  DSV4_REQUIRE_GPU();
  run_case(Kind::CSA, 20, 900, 64, 512, 128, 1000, 512);
  run_case(Kind::HCA, 16, 300, 64, 256, 128, 40, 0);
  run_case(Kind::CSA, 24, 900, 64, 512, 128, 1000, 512, Path::FastMma);
}
// More rows than one grid dimension holds (65535): the kernels run over row ranges (a 65536-token
// prefill, or the context fill of 256 sequences of 512 tokens, is one call). Small heads keep the
// CPU reference cheap; fp32 kernel, and Fast on the same shape (its fp32 fallback).
TEST(CudaOpsAttention, RowsBeyondOneGridDimension) {
  DSV4_REQUIRE_GPU();
  run_case(Kind::SWA, 65536 + 5, 3, 8, 16, 4, 0, 0);
  run_case(Kind::CSA, 65536 + 70, 20, 4, 16, 4, 9, 3, Path::FastFallback);
}
// Keys stored as bf16 (a Fast model's cache): the tensor-core kernel rounds fp32 keys to bf16
// before its MMAs, so the same keys stored rounded give the same outputs bit for bit.
void run_bf16_keys_case(Kind kind, int64_t R, int64_t p0, int64_t H, int64_t n_entries) {
  SCOPED_TRACE("R=" + std::to_string(R) + " H=" + std::to_string(H) + " kind=" + std::to_string(int(kind)));
  const int64_t D = 512, W = 128, n_sel = 512;
  const std::vector<float> q = randn(R * H * D), chunk = randn(R * D), ring = randn(W * D),
                           entries = randn(std::max<int64_t>(n_entries, 1) * D), sink = randn(H);
  std::vector<int32_t> sel(R * n_sel);
  for (int64_t i = 0; i < R * n_sel; ++i) sel[i] = (i % 5 == 3) ? -1 : static_cast<int32_t>(test::rng()() % n_entries);
  DeviceBuffer dq = to_device(q), dsink = to_device(sink), dsel = to_device(sel);
  DeviceBuffer c32 = to_device(chunk), r32 = to_device(ring), e32 = to_device(entries);
  DeviceBuffer c16 = to_device(bf16_bits(chunk)), r16 = to_device(bf16_bits(ring)), e16 = to_device(bf16_bits(entries));
  DeviceBuffer o32 = poisoned<float>(R * H * D), o16 = poisoned<float>(R * H * D);
  auto rows_of = [&](DeviceBuffer& c, DeviceBuffer& r, DeviceBuffer& e) {
    std::vector<cuda::AttnRow> rows;
    for (int64_t i = 0; i < R; ++i) {
      cuda::AttnRow a{p0 + i, c.as<float>(), p0, r.as<float>(), e.as<float>(), 0, nullptr, 0};
      if (kind == Kind::HCA) a.n_entries = std::min<int64_t>(n_entries, 1 + i % n_entries + n_entries / 2);
      if (kind == Kind::CSA) {
        a.sel = dsel.as<int32_t>() + i * n_sel;
        a.n_sel = n_sel;
      }
      rows.push_back(a);
    }
    return to_device(rows);
  };
  DeviceBuffer rows32 = rows_of(c32, r32, e32), rows16 = rows_of(c16, r16, e16);
  ASSERT_TRUE(cuda::attention_bf16_keys_ok(H, D));
  cuda::sparse_attention(dq.as<float>(), rows32.as<cuda::AttnRow>(), R, H, D, W, dsink.as<float>(), o32.as<float>(),
                         nullptr, true);
  cuda::set_attention_wgmma(false);  // the mma.sync kernel: bit for bit
  cuda::sparse_attention(dq.as<float>(), rows16.as<cuda::AttnRow>(), R, H, D, W, dsink.as<float>(), o16.as<float>(),
                         nullptr, true, cuda::KeyFormat::BF16);
  cuda::set_attention_wgmma(true);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> want = to_host<float>(o32, R * H * D);
  EXPECT_EQ(to_host<float>(o16, R * H * D), want);
  // The warpgroup-MMA kernel: the same bf16 products, its own fp32 summation order.
  DeviceBuffer ow = poisoned<float>(R * H * D);
  cuda::sparse_attention(dq.as<float>(), rows16.as<cuda::AttnRow>(), R, H, D, W, dsink.as<float>(), ow.as<float>(),
                         nullptr, true, cuda::KeyFormat::BF16);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const double err = rel_error(to_host<float>(ow, R * H * D), want);
  std::printf("  bf16 keys R=%lld H=%lld: wgmma vs mma.sync rel error %.2e\n", (long long)R, (long long)H, err);
  EXPECT_LE(err, 2e-3);
  // q stored as bf16 (the values both kernels round fp32 q to): the same outputs bit for bit.
  DeviceBuffer dq16 = to_device(bf16_bits(q)), owq = poisoned<float>(R * H * D), omq = poisoned<float>(R * H * D);
  cuda::sparse_attention(dq16.as<float>(), rows16.as<cuda::AttnRow>(), R, H, D, W, dsink.as<float>(), owq.as<float>(),
                         nullptr, true, cuda::KeyFormat::BF16, cuda::KeyFormat::BF16);
  cuda::set_attention_wgmma(false);
  cuda::sparse_attention(dq16.as<float>(), rows16.as<cuda::AttnRow>(), R, H, D, W, dsink.as<float>(), omq.as<float>(),
                         nullptr, true, cuda::KeyFormat::BF16, cuda::KeyFormat::BF16);
  cuda::set_attention_wgmma(true);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(to_host<float>(owq, R * H * D), to_host<float>(ow, R * H * D)) << "wgmma: bf16 q differs from fp32 q";
  EXPECT_EQ(to_host<float>(omq, R * H * D), want) << "mma.sync: bf16 q differs from fp32 q";
}

// The bf16-key kernels against the CPU formula on the same (rounded) keys: decode splits, a
// window alone, HCA from position 0, a batch, one CTA per row, two head groups, 24 split rows.
TEST(CudaOpsAttention, FastBf16KeysMatchTheFormula) {
  DSV4_REQUIRE_GPU();
  std::printf("  warpgroup-MMA attention kernel: %s\n", cuda::wgmma_available() ? "yes" : "no (mma.sync)");
  run_tensor_core_shapes(Path::FastBf16);
}
TEST(CudaOpsAttention, Bf16KeysGiveBitwiseSameOutputs) {
  DSV4_REQUIRE_GPU();
  run_bf16_keys_case(Kind::CSA, 1, 5000, 64, 3000);   // split keys
  run_bf16_keys_case(Kind::SWA, 1, 5000, 64, 1);      // the window alone, most splits empty
  run_bf16_keys_case(Kind::HCA, 3, 70, 64, 300);      // window from 0 for early rows
  run_bf16_keys_case(Kind::CSA, 40, 200, 64, 800);    // window partly in the ring
  run_bf16_keys_case(Kind::CSA, 300, 1000, 64, 900);  // one CTA per row
  run_bf16_keys_case(Kind::CSA, 2, 600, 128, 700);    // two head groups
  EXPECT_FALSE(cuda::attention_bf16_keys_ok(32, 512));
  EXPECT_FALSE(cuda::attention_bf16_keys_ok(64, 256));
  // bf16 q is only the tensor-core kernels' form, with bf16 keys.
  EXPECT_THROW(cuda::sparse_attention(nullptr, nullptr, 1, 64, 512, 128, nullptr, nullptr, nullptr, true,
                                      cuda::KeyFormat::F32, cuda::KeyFormat::BF16),
               dsv4::Error);
}

// One call's bf16 keys (chunk, ring, entries), CSA selections (some -1), sinks, positions p0 + i
// and rotary frequencies, with its rows: V4-Flash's shapes (D 512, window 128, top-512, 32 pairs).
struct Bf16KeysCall {
  static constexpr int64_t D = 512, W = 128, n_sel = 512, pairs = 32;
  DeviceBuffer c16, r16, e16, dsel, dsink, dfreq, dpos, drows;
  Bf16KeysCall(Kind kind, int64_t R, int64_t p0, int64_t H, int64_t n_entries) {
    c16 = to_device(bf16_bits(randn(R * D)));
    r16 = to_device(bf16_bits(randn(W * D)));
    e16 = to_device(bf16_bits(randn(std::max<int64_t>(n_entries, 1) * D)));
    std::vector<int32_t> sel(R * n_sel);
    for (int64_t i = 0; i < R * n_sel; ++i) sel[i] = (i % 7 == 3) ? -1 : static_cast<int32_t>(test::rng()() % n_entries);
    std::vector<int64_t> pos(R);
    for (int64_t i = 0; i < R; ++i) pos[i] = p0 + i;
    dsel = to_device(sel);
    dsink = to_device(randn(H));
    dfreq = to_device(test::inv_freqs(pairs));
    dpos = to_device(pos);
    std::vector<cuda::AttnRow> rows;
    for (int64_t i = 0; i < R; ++i) {
      cuda::AttnRow a{p0 + i, c16.as<float>(), p0, r16.as<float>(), e16.as<float>(), 0, nullptr, 0};
      if (kind == Kind::HCA) a.n_entries = std::min<int64_t>(n_entries, 1 + i % n_entries + n_entries / 2);
      if (kind == Kind::CSA) {
        a.sel = dsel.as<int32_t>() + i * n_sel;
        a.n_sel = n_sel;
      }
      rows.push_back(a);
    }
    drows = to_device(rows);
  }
  cuda::InverseRope rope() const { return {dfreq.as<float>(), pairs, dpos.as<int64_t>(), D}; }
};

// The FP8 epilogue (cuda::AttnFp8Out): wo_a's activations written by the attention kernel are
// act_quant_fp8_inverse_rope's of the fp32 output, codes and scales bit for bit, for fp32 and bf16
// q. Calls with key splits, or rotary pairs not a multiple of 4, decline it and write o.
// want_taken: the warpgroup-MMA kernel runs it.
void run_fp8_out_case(Kind kind, int64_t R, int64_t p0, int64_t H, int64_t n_entries, bool want_taken,
                      int64_t pairs = Bf16KeysCall::pairs) {
  SCOPED_TRACE("fp8 out R=" + std::to_string(R) + " H=" + std::to_string(H) + " kind=" + std::to_string(int(kind)) +
               " pairs=" + std::to_string(pairs));
  const Bf16KeysCall call(kind, R, p0, H, n_entries);
  const int64_t D = call.D, W = call.W, cols = H * D;
  const std::vector<float> q = randn(R * H * D);
  const DeviceBuffer &drows = call.drows, &dsink = call.dsink;
  const cuda::InverseRope rope{call.dfreq.as<float>(), pairs, call.dpos.as<int64_t>(), D};
  for (const bool bf16_q : {false, true}) {
    DeviceBuffer dq = bf16_q ? to_device(bf16_bits(q)) : to_device(q);
    const cuda::KeyFormat qf = bf16_q ? cuda::KeyFormat::BF16 : cuda::KeyFormat::F32;
    DeviceBuffer o = poisoned<float>(R * H * D), qref = poisoned<uint8_t>(R * cols),
                 sref = poisoned<float>(R * cols / 128);
    EXPECT_FALSE(cuda::sparse_attention(dq.as<float>(), drows.as<cuda::AttnRow>(), R, H, D, W, dsink.as<float>(),
                                        o.as<float>(), nullptr, true, cuda::KeyFormat::BF16, qf));
    const std::vector<float> o_host = to_host<float>(o, R * H * D);  // (the quantisation rotates o in place)
    cuda::act_quant_fp8_inverse_rope(o.as<float>(), R, cols, cols, rope, qref.as<uint8_t>(), cols, sref.as<float>(),
                                     nullptr);
    DeviceBuffer o2 = poisoned<float>(R * H * D), qf8 = poisoned<uint8_t>(R * cols), sf8 = poisoned<float>(R * cols / 128);
    const cuda::AttnFp8Out out{qf8.as<uint8_t>(), sf8.as<float>(), rope};
    const bool taken = cuda::sparse_attention(dq.as<float>(), drows.as<cuda::AttnRow>(), R, H, D, W, dsink.as<float>(),
                                              o2.as<float>(), nullptr, true, cuda::KeyFormat::BF16, qf, &out);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(taken, want_taken) << "bf16 q " << bf16_q;
    if (!taken) {  // o as without the request; codes and scales untouched
      EXPECT_EQ(to_host<float>(o2, R * H * D), o_host);
      EXPECT_EQ(to_host<uint8_t>(qf8, R * cols), std::vector<uint8_t>(R * cols, 0xFF));
      continue;
    }
    EXPECT_EQ(to_host<uint8_t>(qf8, R * cols), to_host<uint8_t>(qref, R * cols)) << "codes, bf16 q " << bf16_q;
    EXPECT_EQ(to_host<float>(sf8, R * cols / 128), to_host<float>(sref, R * cols / 128)) << "scales, bf16 q " << bf16_q;
  }
}

TEST(CudaOpsAttention, Fp8EpilogueIsTheQuantisedOutput) {
  DSV4_REQUIRE_GPU();
  const bool wgmma = cuda::wgmma_available();
  run_fp8_out_case(Kind::CSA, 300, 1000, 64, 900, wgmma);  // one CTA per row, no splits
  run_fp8_out_case(Kind::HCA, 150, 70, 128, 300, wgmma);   // two head groups, windows from 0
  run_fp8_out_case(Kind::CSA, 2, 600, 64, 700, false);     // key splits: declined, o written
  run_fp8_out_case(Kind::SWA, 200, 0, 64, 1, wgmma, 8);    // fewer rotary pairs (columns from 496)
  run_fp8_out_case(Kind::SWA, 200, 0, 64, 1, false, 30);   // pairs not a multiple of 4: declined
}

// q's norm inside attention (cuda::AttnQNorm): bf16 q as wq_b's GEMM writes it, normalised and
// rotated by the kernel once staged, gives the bits of rms_norm_rope_bf16 followed by attention
// on the normed q: o, and the FP8 epilogue's codes and scales where one split takes it. q itself
// stays as it was.
void run_q_norm_case(Kind kind, int64_t R, int64_t p0, int64_t H, int64_t n_entries) {
  SCOPED_TRACE("q norm R=" + std::to_string(R) + " H=" + std::to_string(H) + " kind=" + std::to_string(int(kind)));
  const Bf16KeysCall call(kind, R, p0, H, n_entries);
  const int64_t D = call.D, W = call.W, pairs = call.pairs, cols = H * D;
  const float eps = 1e-6f;
  std::vector<float> q = randn(R * H * D);
  for (int64_t i = 0; i < R * H; ++i)  // heads of different sizes: the norm must do something
    for (int64_t c = 0; c < D; ++c) q[i * D + c] *= 0.05f + 0.4f * static_cast<float>(i % 13);
  const DeviceBuffer &drows = call.drows, &dsink = call.dsink, &dfreq = call.dfreq, &dpos = call.dpos;
  ASSERT_TRUE(cuda::attention_norms_q(H, D, pairs));
  const cuda::AttnQNorm qn{eps, dfreq.as<float>(), pairs, dpos.as<int64_t>()};
  const cuda::InverseRope rope = call.rope();
  for (const bool fp8 : {false, true}) {
    SCOPED_TRACE(fp8 ? "fp8 out" : "o");
    // The reference: the norm's own pass over bf16 q, then attention on it.
    DeviceBuffer qref = to_device(bf16_bits(q));
    cuda::rms_norm_rope_bf16(qref.as<float>(), nullptr, R, H, D, eps, dfreq.as<float>(), pairs, dpos.as<int64_t>(),
                             nullptr);
    const float* normed = qref.as<float>();
    DeviceBuffer o_ref = poisoned<float>(R * H * D), c_ref = poisoned<uint8_t>(R * cols),
                 s_ref = poisoned<float>(R * cols / 128);
    const cuda::AttnFp8Out out_ref{c_ref.as<uint8_t>(), s_ref.as<float>(), rope};
    const bool taken_ref = cuda::sparse_attention(normed, drows.as<cuda::AttnRow>(), R, H, D, W, dsink.as<float>(),
                                                  o_ref.as<float>(), nullptr, true, cuda::KeyFormat::BF16,
                                                  cuda::KeyFormat::BF16, fp8 ? &out_ref : nullptr);
    // Fused: q as stored, the norm in the kernel.
    DeviceBuffer qin = to_device(bf16_bits(q));
    DeviceBuffer o = poisoned<float>(R * H * D), c = poisoned<uint8_t>(R * cols), sc = poisoned<float>(R * cols / 128);
    const cuda::AttnFp8Out out{c.as<uint8_t>(), sc.as<float>(), rope};
    const bool taken = cuda::sparse_attention(qin.as<float>(), drows.as<cuda::AttnRow>(), R, H, D, W,
                                              dsink.as<float>(), o.as<float>(), nullptr, true, cuda::KeyFormat::BF16,
                                              cuda::KeyFormat::BF16, fp8 ? &out : nullptr, &qn);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(taken, taken_ref);
    if (taken) {
      EXPECT_EQ(to_host<uint8_t>(c, R * cols), to_host<uint8_t>(c_ref, R * cols)) << "codes";
      EXPECT_EQ(to_host<float>(sc, R * cols / 128), to_host<float>(s_ref, R * cols / 128)) << "scales";
    } else {
      EXPECT_EQ(to_host<float>(o, R * H * D), to_host<float>(o_ref, R * H * D)) << "o";
    }
    EXPECT_EQ(to_host<uint16_t>(qin, R * H * D), bf16_bits(q)) << "q changed";
  }
}

TEST(CudaOpsAttention, QNormInsideAttentionIsNormThenAttention) {
  DSV4_REQUIRE_GPU();
  if (!cuda::wgmma_available()) GTEST_SKIP() << "the warpgroup-MMA attention kernel is not available here";
  run_q_norm_case(Kind::CSA, 1, 5000, 64, 3000);    // decode: key splits
  run_q_norm_case(Kind::SWA, 5, 300, 64, 1);        // a few rows, splits
  run_q_norm_case(Kind::CSA, 300, 1000, 64, 900);   // one CTA per row (FP8 epilogue)
  run_q_norm_case(Kind::HCA, 150, 70, 128, 300);    // two head groups
  EXPECT_FALSE(cuda::attention_norms_q(64, 256, 32));
  EXPECT_FALSE(cuda::attention_norms_q(64, 512, 300));
  // Only the bf16-key kernel normalises q, and only bf16 q: a request elsewhere is an error, not
  // a silent skip.
  const cuda::AttnQNorm qn{1e-6f, nullptr, 32, nullptr};
  EXPECT_THROW(cuda::sparse_attention(nullptr, nullptr, 1, 64, 512, 128, nullptr, nullptr, nullptr, true,
                                      cuda::KeyFormat::F32, cuda::KeyFormat::F32, nullptr, &qn),
               dsv4::Error);
  EXPECT_THROW(cuda::sparse_attention(nullptr, nullptr, 1, 64, 512, 128, nullptr, nullptr, nullptr, true,
                                      cuda::KeyFormat::BF16, cuda::KeyFormat::F32, nullptr, &qn),
               dsv4::Error);
}

TEST(CudaOpsAttention, TinyModelShapes) {
  DSV4_REQUIRE_GPU();
  run_case(Kind::CSA, 6, 9, 4, 128, 8, 5, 4);  // H < 8 heads per block, D 128
  run_case(Kind::HCA, 6, 9, 4, 128, 8, 2, 0);
}

}  // namespace
}  // namespace dsv4
