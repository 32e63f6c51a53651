// bench_ops: the fp32 CUDA ops of backend/cuda/ops.h at V4-Flash shapes (d 4096, n 4 streams,
// H 64 × D 512 attention over window 128 + 512 selected entries, indexer 64 × 128 heads,
// top-512) for decode batches 1/8/64/256 and a 4096-token prefill. Prints the median of 25
// timed calls (cudaEvent, after 3 warm-up calls), the floor max(bytes / 4.2e12 B/s,
// FLOPs / 6e13 FLOP/s fp32 SIMT, 5e14 bf16 tensor cores for the fast indexer) and measured / floor.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/act_quant.h"
#include "backend/cuda/async_scratch.h"
#include "backend/cuda/check.h"
#include "backend/cuda/ops_mhc_decode.h"
#include "backend/cuda/device.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/ops_indexer_mma.h"
#include "backend/cuda/ops_indexer_select.h"
#include "bench/event_timing.h"

using namespace dsv4;
using namespace dsv4::cuda;

namespace {

constexpr double kBandwidth = 4.2e12, kSimtFlops = 6.0e13;
constexpr int kReps = 25, kWarm = 3;

// Fills a float buffer with N(0, std) values: one random block uploaded, then tiled on device.
void fill_random(DeviceBuffer& b, float std = 1.0f) {
  static std::mt19937 g(1234);
  const size_t n = b.bytes() / sizeof(float), blk = std::min<size_t>(n, size_t(1) << 22);
  std::normal_distribution<float> d(0.0f, std);
  std::vector<float> h(blk);
  for (auto& x : h) x = d(g);
  b.upload(h.data(), blk * sizeof(float));
  for (size_t off = blk; off < n; off += blk)
    DSV4_CUDA_CHECK(cudaMemcpy(b.as<float>() + off, b.as<float>(), std::min(blk, n - off) * sizeof(float),
                               cudaMemcpyDeviceToDevice));
}

DeviceBuffer floats(size_t n, float std = 1.0f) {
  DeviceBuffer b(n * sizeof(float));
  fill_random(b, std);
  return b;
}

// n fp32 values rounded to bf16 (nearest even), as a Fast model's indexer cache stores keys.
DeviceBuffer bf16_copy(const DeviceBuffer& f32, size_t n) {
  const std::vector<uint32_t> h = to_host<uint32_t>(f32, n);
  std::vector<uint16_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint16_t>((h[i] + 0x7FFFu + ((h[i] >> 16) & 1u)) >> 16);
  return to_device(b);
}

// Events on `stream` (the legacy default stream unless given).
template <class F>
double median_us(F call, cudaStream_t stream = nullptr) {
  return dsv4::bench::median_event_ms([&](int) { call(); }, kWarm, kReps, stream) * 1e3;
}

// rate: the FLOP rate of the unit the kernel runs on (fp32 SIMT unless given).
constexpr double kBf16Flops = 5e14;  // dense bf16 mma.sync, half the FP8 rate the linears use

void report(const char* op, int64_t R, const char* shape, double us, double bytes, double flops,
            double rate = kSimtFlops) {
  const double floor_us = std::max(bytes / kBandwidth, flops / rate) * 1e6;
  std::printf("%-18s R=%-5lld %-26s %10.2f us  floor %9.2f us (%s)  ratio %6.2f\n", op, static_cast<long long>(R),
              shape, us, floor_us, bytes / kBandwidth >= flops / rate ? "bytes" : "flops", us / floor_us);
}

// BENCH_OPS_ROWS="4096 ...": only these row counts (an ncu run wants one shape).
const std::vector<int64_t> kRows = [] {
  std::vector<int64_t> rows;
  if (const char* env = std::getenv("BENCH_OPS_ROWS")) {
    std::istringstream in(env);
    for (int64_t r; in >> r;) rows.push_back(r);
  }
  return rows.empty() ? std::vector<int64_t>{1, 8, 64, 256, 4096} : rows;
}();

void bench_rms_norm() {
  const int64_t d = 4096;
  for (int64_t R : kRows) {
    DeviceBuffer x = floats(R * d), g = floats(d), y(R * d * sizeof(float));
    const double us = median_us([&] { rms_norm(x.as<float>(), g.as<float>(), y.as<float>(), R, d, 1e-6f, nullptr); });
    report("rms_norm", R, "d 4096", us, (2.0 * R * d + d) * 4, 3.0 * R * d);
  }
}

// Where the one-launch decode hc_pre spends its time: clock64() at each phase end of every block
// (ops_mhc_decode.cu), as the slowest block's cycles since its own start; with the gates inside
// and with them on a side stream (the model's form).
void trace_hc_pre_decode(const HcParams& p, const float* X, int64_t n, int64_t d, const float* g, DeviceBuffer& pre,
                         DeviceBuffer& post, DeviceBuffer& comb, DeviceBuffer& u) {
  const int ks = dsv4::cuda::detail::hc_pre_decode_slices(1, n, d);
  if (ks == 0) return;
  const int blocks = ks + 1, points = 8;
  DeviceBuffer tr(static_cast<size_t>(blocks * points) * sizeof(long long));
  cudaStream_t side = nullptr;
  cudaEvent_t ev = nullptr;
  DSV4_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  DSV4_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  int khz = 0;
  DSV4_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  for (bool gates_inside : {true, false}) {
    tr.fill_bytes(0);
    dsv4::cuda::detail::set_hc_pre_decode_trace(tr.as<long long>());
    for (int rep = 0; rep < 3; ++rep)  // the last call's stamps stay
      hc_pre(p, X, 1, n, d, 20, 1e-6f, 1e-6f, pre.as<float>(), post.as<float>(), comb.as<float>(), u.as<float>(),
             nullptr, gates_inside ? nullptr : side, gates_inside ? nullptr : ev, g, 1e-6f);
    DSV4_CUDA_CHECK(cudaDeviceSynchronize());
    dsv4::cuda::detail::set_hc_pre_decode_trace(nullptr);
    std::vector<long long> t(static_cast<size_t>(blocks * points));
    DSV4_CUDA_CHECK(cudaMemcpy(t.data(), tr.get(), t.size() * sizeof(long long), cudaMemcpyDeviceToHost));
    const char* names[] = {"", "projected", "barrier", "mu", "norm sum", "", "done"};
    std::printf("hc_pre+norm R=1 one launch, gates %s (%d slices; slowest block, cycles since its start; %d MHz):",
                gates_inside ? "inside" : "on a side stream", ks, khz / 1000);
    for (int pt = 1; pt < points - 1; ++pt) {
      long long worst = 0;
      for (int b = 0; b < ks; ++b)
        if (t[b * points + pt]) worst = std::max(worst, t[b * points + pt] - t[b * points]);
      if (worst > 0) std::printf(" %s %lld", names[pt], worst);
    }
    if (gates_inside) std::printf("; gates block done %lld", t[ks * points + 6] - t[ks * points]);
    std::printf("\n");
  }
  cudaEventDestroy(ev);
  cudaStreamDestroy(side);
}

void bench_hc() {
  const int64_t n = 4, d = 4096, n_out = (2 + n) * n;
  DeviceBuffer fn = floats(n_out * n * d, 1.0f / 128), base = floats(n_out), scale = floats(3), g = floats(d);
  const HcParams p{fn.as<float>(), base.as<float>(), scale.as<float>()};
  for (int64_t R : kRows) {
    DeviceBuffer X = floats(R * n * d), pre(R * n * 4), post(R * n * 4), comb(R * n * n * 4), u(R * d * 4),
        F = floats(R * d);
    double us = median_us([&] {
      hc_pre(p, X.as<float>(), R, n, d, 20, 1e-6f, 1e-6f, pre.as<float>(), post.as<float>(), comb.as<float>(),
             u.as<float>(), nullptr);
    });
    report("hc_pre", R, "n 4, d 4096", us, (double(R) * n * d + n_out * n * d + R * d) * 4,
           2.0 * R * n * d * (n_out + 1 + n));
    if (R >= 256) {  // the tiled projection's fp32 FMA form against its split-TF32 default
      dsv4::cuda::set_hc_project_tf32(false);
      us = median_us([&] {
        hc_pre(p, X.as<float>(), R, n, d, 20, 1e-6f, 1e-6f, pre.as<float>(), post.as<float>(), comb.as<float>(),
               u.as<float>(), nullptr);
      });
      dsv4::cuda::set_hc_project_tf32(true);
      report("  (fp32 FMA tiles)", R, "n 4, d 4096", us, (double(R) * n * d + n_out * n * d + R * d) * 4,
             2.0 * R * n * d * (n_out + 1 + n));
    }
    // With the sub-layer norm (the model's call): one launch up to 4 rows, against the split-K
    // projection + finish + rms_norm it replaces.
    for (bool fused : {true, false}) {
      if (!fused && dsv4::cuda::detail::hc_pre_decode_slices(R, n, d) == 0) continue;
      dsv4::cuda::detail::set_hc_pre_decode_enabled(fused);
      us = median_us([&] {
        hc_pre(p, X.as<float>(), R, n, d, 20, 1e-6f, 1e-6f, pre.as<float>(), post.as<float>(), comb.as<float>(),
               u.as<float>(), nullptr, nullptr, nullptr, g.as<float>(), 1e-6f);
      });
      dsv4::cuda::detail::set_hc_pre_decode_enabled(true);
      report(fused ? "hc_pre+norm" : "  (3 launches)", R, "n 4, d 4096", us,
             (double(R) * n * d + n_out * n * d + R * d + d) * 4, 2.0 * R * n * d * (n_out + 1 + n));
    }
    if (R == 1) trace_hc_pre_decode(p, X.as<float>(), n, d, g.as<float>(), pre, post, comb, u);
    us = median_us([&] {
      hc_post(post.as<float>(), comb.as<float>(), F.as<float>(), X.as<float>(), R, n, d, nullptr);
    });
    report("hc_post", R, "n 4, d 4096", us, (2.0 * R * n * d + R * d) * 4, 2.0 * R * n * d * (n + 1));
    // The model's pair: hc_post, then the next sub-layer's hc_pre+norm; with the projection done
    // by hc_post (hc_post_project, the default where it applies) and without it. Floor: hc_post's
    // bytes plus one read of X and the write of u.
    const double pair_bytes = (3.0 * R * n * d + 2.0 * R * d + n_out * n * d + d) * 4;
    for (bool in_post : {true, false}) {
      if (in_post && !dsv4::cuda::detail::hc_post_project_applies(R, n, d)) continue;
      dsv4::cuda::detail::set_hc_project_in_post(in_post);
      us = median_us([&] {
        const bool projected =
            hc_post_project(post.as<float>(), comb.as<float>(), F.as<float>(), X.as<float>(), R, n, d, p, nullptr);
        if (!projected) hc_post(post.as<float>(), comb.as<float>(), F.as<float>(), X.as<float>(), R, n, d, nullptr);
        hc_pre(p, X.as<float>(), R, n, d, 20, 1e-6f, 1e-6f, pre.as<float>(), post.as<float>(), comb.as<float>(),
               u.as<float>(), nullptr, nullptr, nullptr, g.as<float>(), 1e-6f, projected);
      });
      dsv4::cuda::detail::set_hc_project_in_post(true);
      report(in_post ? "hc_post+hc_pre" : "  (projection in hc_pre)", R, "n 4, d 4096", us, pair_bytes,
             2.0 * R * n * d * (n_out + 2 + 2 * n));
      if (!in_post) continue;
      us = median_us([&] {
        hc_post_project(post.as<float>(), comb.as<float>(), F.as<float>(), X.as<float>(), R, n, d, p, nullptr);
      });
      report("  (its hc_post_project)", R, "n 4, d 4096", us, (2.0 * R * n * d + R * d + n_out * n * d) * 4,
             2.0 * R * n * d * (n + 1 + n_out));
    }
    // The streams as bf16 (the Fast model past 4 rows): plain hc_post, and the model's pair, whose
    // tiled projection reads them in 64-byte row pieces (32 columns a step).
    if (dsv4::cuda::hc_streams_bf16_ok(R, n, d)) {
      using dsv4::cuda::StreamStore;
      DeviceBuffer X16(R * n * d * 2);
      uint16_t* x16 = X16.as<uint16_t>();
      hc_post(post.as<float>(), comb.as<float>(), F.as<float>(), X.as<float>(), R, n, d, nullptr, nullptr, nullptr,
              StreamStore::F32ToBF16, x16);
      us = median_us([&] {
        hc_post(post.as<float>(), comb.as<float>(), F.as<float>(), X.as<float>(), R, n, d, nullptr, nullptr, nullptr,
                StreamStore::BF16, x16);
      });
      report("hc_post, bf16 streams", R, "n 4, d 4096", us, 4.0 * R * n * d + 4.0 * R * d, 2.0 * R * n * d * (n + 1));
      us = median_us([&] {
        hc_post_project(post.as<float>(), comb.as<float>(), F.as<float>(), X.as<float>(), R, n, d, p, nullptr, nullptr,
                        nullptr, StreamStore::BF16, x16);
        hc_pre(p, X.as<float>(), R, n, d, 20, 1e-6f, 1e-6f, pre.as<float>(), post.as<float>(), comb.as<float>(),
               u.as<float>(), nullptr, nullptr, nullptr, g.as<float>(), 1e-6f, true, x16);
      });
      report("hc_post+hc_pre, bf16 streams", R, "n 4, d 4096", us,
             6.0 * R * n * d + (2.0 * R * d + n_out * n * d + d) * 4, 2.0 * R * n * d * (n_out + 2 + 2 * n));
      us = median_us([&] {
        hc_post_project(post.as<float>(), comb.as<float>(), F.as<float>(), X.as<float>(), R, n, d, p, nullptr, nullptr,
                        nullptr, StreamStore::BF16, x16);
      });
      report("  (its hc_post_project)", R, "n 4, d 4096", us, 4.0 * R * n * d + (1.0 * R * d + n_out * n * d) * 4,
             2.0 * R * n * d * (n + 1 + n_out));
    }
  }
}

// Decode rows are separate sequences (own ring and entry pool); prefill rows share one sequence.
// BENCH_ATTN_FP8=window / all: only the prefill form's rows (window-only key lists, or both), for
// an ncu run that wants those launches alone.
void bench_attention() {
  const int64_t H = 64, D = 512, W = 128, n_sel = 512, pool = 1024;
  const char* fp8_env = std::getenv("BENCH_ATTN_FP8");
  const std::string fp8_only = fp8_env ? fp8_env : "";
  for (int64_t R : kRows) {
    const bool prefill = R == 4096;
    const int64_t seqs = prefill ? 1 : R;
    DeviceBuffer q = floats(R * H * D), kv = floats(R * D), ring = floats(seqs * W * D),
                 entries = floats(seqs * pool * D), sink = floats(H), o(R * H * D * 4);
    std::mt19937 g(7);
    std::vector<int32_t> sel(R * n_sel);
    for (auto& s : sel) s = static_cast<int32_t>(g() % pool);
    DeviceBuffer dsel = to_device(sel);
    std::vector<AttnRow> rows;
    const int64_t p0 = 100000;
    for (int64_t r = 0; r < R; ++r) {
      const int64_t sq = prefill ? 0 : r;
      rows.push_back(AttnRow{prefill ? p0 + r : p0, kv.as<float>() + (prefill ? 0 : r * D), p0,
                             ring.as<float>() + sq * W * D, entries.as<float>() + sq * pool * D, pool,
                             dsel.as<int32_t>() + r * n_sel, n_sel});
    }
    DeviceBuffer drows = to_device(rows);
    // The same keys stored as bf16 (a Fast model's cache): D / 2 float slots per key.
    DeviceBuffer kv16 = bf16_copy(kv, R * D), ring16 = bf16_copy(ring, seqs * W * D),
                 entries16 = bf16_copy(entries, seqs * pool * D);
    std::vector<AttnRow> rows16 = rows;
    for (int64_t r = 0; r < R; ++r) {
      const int64_t sq = prefill ? 0 : r, half = D / 2;
      rows16[r].chunk_kv = kv16.as<float>() + (prefill ? 0 : r * half);
      rows16[r].ring = ring16.as<float>() + sq * W * half;
      rows16[r].entries = entries16.as<float>() + sq * pool * half;
    }
    DeviceBuffer drows16 = to_device(rows16), q16 = bf16_copy(q, R * H * D);
    // fp32 (Exact), bf16 tensor cores (Fast), and on bf16 keys and q (a Fast model's form).
    for (int variant = 0; variant < (fp8_only.empty() ? 3 : 0); ++variant) {
      const bool fast = variant > 0, k16 = variant == 2;
      const KeyFormat f = k16 ? KeyFormat::BF16 : KeyFormat::F32;
      const double us = median_us([&] {
        sparse_attention((k16 ? q16 : q).as<float>(), (k16 ? drows16 : drows).as<AttnRow>(), R, H, D, W,
                         sink.as<float>(), o.as<float>(), nullptr, fast, f, f);
      });
      const double keys = W + n_sel, kb = k16 ? 2.0 : 4.0;
      const double key_bytes = prefill ? (R + W + pool) * D * kb : R * keys * D * kb;
      report(k16 ? "attention fast bf16" : fast ? "attention fast" : "attention exact", R, "H 64 D 512, 128+512 keys",
             us, R * H * D * (kb + 4.0) + key_bytes, 4.0 * R * H * keys * D, fast ? kBf16Flops : kSimtFlops);
    }
    // q's norm + RoPE (32 pairs) in their own pass over bf16 q, and inside the bf16 kernel instead.
    const int64_t pairs = 32;
    std::vector<float> freq(pairs);
    for (int64_t i = 0; i < pairs; ++i) freq[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / (2 * pairs)));
    std::vector<int64_t> pos(R);
    for (int64_t r = 0; r < R; ++r) pos[r] = rows[r].pos;
    DeviceBuffer dfreq = to_device(freq), dpos = to_device(pos), qn16 = bf16_copy(q, R * H * D);
    const double norm_us = !fp8_only.empty() ? 0.0 : median_us([&] {
      rms_norm_rope_bf16(qn16.as<float>(), nullptr, R, H, D, 1e-6f, dfreq.as<float>(), pairs, dpos.as<int64_t>(),
                         nullptr);
    });
    report("q norm+rope bf16 (own pass)", R, "H 64 D 512", norm_us, 4.0 * R * H * D, 0, kBf16Flops);
    if (!attention_norms_q(H, D, pairs)) continue;
    const AttnQNorm qn{1e-6f, dfreq.as<float>(), pairs, dpos.as<int64_t>()};
    const double fused_us = !fp8_only.empty() ? 0.0 : median_us([&] {
      sparse_attention(q16.as<float>(), drows16.as<AttnRow>(), R, H, D, W, sink.as<float>(), o.as<float>(), nullptr,
                       true, KeyFormat::BF16, KeyFormat::BF16, nullptr, &qn);
    });
    const double key_bytes = prefill ? (R + W + pool) * D * 2.0 : R * (W + n_sel) * D * 2.0;
    report("attention fast bf16 + q norm", R, "H 64 D 512, 128+512 keys", fused_us,
           R * H * D * 6.0 + key_bytes, 4.0 * R * H * (W + n_sel) * D, kBf16Flops);
    // The prefill's form: q's norm inside, wo_a's FP8 activations out (the kernel's epilogue), on
    // CSA's key lists and on the window's alone (SWA).
    if (R < 1024) continue;
    DeviceBuffer codes(R * H * D), scales(R * H * D / 128 * 4);
    const AttnFp8Out f8{codes.as<uint8_t>(), scales.as<float>(), InverseRope{dfreq.as<float>(), pairs, dpos.as<int64_t>(), D}};
    std::vector<AttnRow> swa = rows16;
    for (AttnRow& a : swa) a.sel = nullptr, a.n_sel = 0, a.n_entries = 0;
    DeviceBuffer dswa = to_device(swa);
    for (const bool window_only : {false, true}) {
      if (fp8_only == "window" && !window_only) continue;
      const double us = median_us([&] {
        sparse_attention(q16.as<float>(), (window_only ? dswa : drows16).as<AttnRow>(), R, H, D, W, sink.as<float>(),
                         o.as<float>(), nullptr, true, KeyFormat::BF16, KeyFormat::BF16, &f8, &qn);
      });
      const double keys = window_only ? W : W + n_sel;
      const double kbytes = prefill ? (R + W + (window_only ? 0 : pool)) * D * 2.0 : R * keys * D * 2.0;
      report("attention bf16 + q norm + fp8 out", R, window_only ? "H 64 D 512, 128 keys" : "H 64 D 512, 128+512 keys",
             us, R * H * D * 3.0 + R * H * D / 128 * 4.0 + kbytes, 4.0 * R * H * keys * D, kBf16Flops);
    }
  }
}

// Median of kReps replays of call(stream) captured once into a CUDA graph: the device time of a
// decode step's op without the host's launch overhead (median_us includes it, ~4 us per launch).
template <class F>
double graph_median_us(F call) {
  cudaStream_t s;
  DSV4_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  call(s);  // scratch pools warm, attributes set
  DSV4_CUDA_CHECK(cudaStreamSynchronize(s));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  DSV4_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  call(s);
  DSV4_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  DSV4_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  const double us = median_us([&] { DSV4_CUDA_CHECK(cudaGraphLaunch(ge, s)); }, s);
  DSV4_CUDA_CHECK(cudaGraphExecDestroy(ge));
  DSV4_CUDA_CHECK(cudaGraphDestroy(g));
  DSV4_CUDA_CHECK(cudaStreamDestroy(s));
  return us;
}

// What stream-ordered scratch costs inside a graph (every split attention, indexer and MoE call
// of a captured decode step allocates some): a 1 MB memset on a fixed buffer, and the same memset
// on scratch allocated and released around it (graph memory nodes).
// The inverse RoPE + FP8 quantisation before wo_a (act_quant_fp8_inverse_rope): V4-Flash's
// attention output, 64 heads of 512 with 32 rotary pairs each, at decode and prefill rows.
void bench_rope_quant() {
  const int64_t heads = 64, hl = 512, pairs = 32, in = heads * hl, kb = in / 128;
  std::vector<float> f(pairs);
  for (int64_t i = 0; i < pairs; ++i) f[i] = std::pow(10000.0f, -2.0f * float(i) / float(2 * pairs));
  DeviceBuffer df = to_device(f);
  for (int64_t R : kRows) {
    std::vector<int64_t> pos(R);
    for (int64_t r = 0; r < R; ++r) pos[r] = 1000 + 37 * r;
    DeviceBuffer x = floats(R * in), dp = to_device(pos), q(R * in), sc(R * kb * sizeof(float));
    const InverseRope rope{df.as<float>(), pairs, dp.as<int64_t>(), hl};
    const double us = median_us(
        [&] { act_quant_fp8_inverse_rope(x.as<float>(), R, in, in, rope, q.as<uint8_t>(), in, sc.as<float>(), nullptr); });
    // x read, its rotary channels written back, the codes and scales written.
    const double bytes = R * (in * 4.0 + heads * 2 * pairs * 4.0 + in + kb * 4.0);
    report("inverse rope+quant", R, "64 heads x 512, 32 pairs", us, bytes, 0.0);
  }
}

void bench_scratch() {
  const size_t bytes = size_t(1) << 20;
  DeviceBuffer fixed(bytes);
  const double plain =
      graph_median_us([&](cudaStream_t s) { DSV4_CUDA_CHECK(cudaMemsetAsync(fixed.as<uint8_t>(), 0, bytes, s)); });
  const double scratch = graph_median_us([&](cudaStream_t s) {
    void* p = async_scratch(bytes, s);
    DSV4_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, s));
    async_release(p, s);
  });
  report("memset 1 MB graph", 1, "fixed buffer", plain, 2.0 * bytes, 0.0);
  report("memset 1 MB graph", 1, "async scratch", scratch, 2.0 * bytes, 0.0);
}

// The keys of one sequence are shared by all rows. Exact: fp32 SIMT scores (FLOP-bound, 32 FLOP
// per key byte at 64 heads); fast: bf16 tensor cores, bound by the key bytes — fp32 keys, or bf16
// as a Fast model's cache stores them. 262144 entries = a 1M-token context at ratio 4 (the
// issue's 256k-candidate target); at one row that case is also timed as a graph replay and split
// into its scoring and its selection.
void bench_indexer() {
  const int64_t nh = 64, hd = 128, topk = 512;
  struct Variant {
    const char* name;
    bool fast;
    KeyFormat keys;
  };
  const Variant variants[] = {{"exact", false, KeyFormat::F32}, {"fast", true, KeyFormat::F32},
                              {"fast bf16", true, KeyFormat::BF16}};
  std::vector<int64_t> entries = {16384, 65536, 262144};
  // BENCH_INDEXER_SPLIT=1: the graph and score / select rows at every shape, not only 262144 x 1;
  // BENCH_INDEXER_CAUSAL=1: rows see a prefill's triangle of the entries (row i: (i + 1) n / R).
  const bool split = std::getenv("BENCH_INDEXER_SPLIT") != nullptr, causal = std::getenv("BENCH_INDEXER_CAUSAL") != nullptr;
  if (const char* env = std::getenv("BENCH_INDEXER_ENTRIES")) {  // e.g. "262144": one size (profiling runs)
    entries.clear();
    std::istringstream in(env);
    for (int64_t e; in >> e;) entries.push_back(e);
  }
  for (int64_t n_vis : entries) {
    DeviceBuffer keys32 = floats(n_vis * hd), keys16 = bf16_copy(keys32, n_vis * hd);
    for (const Variant& v : variants)
      for (int64_t R : kRows) {
        if (R > 64 && (n_vis > 65536 || !v.fast)) continue;  // seconds per call on the fp32 path
        DeviceBuffer q = floats(R * nh * hd), om = floats(R * nh, 0.01f), out(R * topk * 4);
        const void* k =
            v.keys == KeyFormat::BF16 ? static_cast<const void*>(keys16.as<uint8_t>()) : keys32.as<uint8_t>();
        std::vector<IndexerRow> rows(R, IndexerRow{k, n_vis});
        if (causal)  // a prefill's rows: row i sees (i + 1) n_vis / R entries
          for (int64_t i = 0; i < R; ++i) rows[i].n_visible = std::max<int64_t>(1, (i + 1) * n_vis / R);
        DeviceBuffer drows = to_device(rows);
        auto call = [&](cudaStream_t s) {
          indexer_topk(q.as<float>(), om.as<float>(), drows.as<IndexerRow>(), R, nh, hd, topk, n_vis,
                       out.as<int32_t>(), s, v.fast, v.keys);
        };
        const double key_bytes = n_vis * hd * (v.keys == KeyFormat::BF16 ? 2.0 : 4.0);
        const double bytes = key_bytes + R * (nh * hd * 4.0 + n_vis * 4.0 * 2), flops = 2.0 * R * n_vis * nh * hd;
        char name[48], shape[64];
        std::snprintf(shape, sizeof shape, "%lld entries, top-512", static_cast<long long>(n_vis));
        std::snprintf(name, sizeof name, "indexer_topk %s", v.name);
        report(name, R, shape, median_us([&] { call(nullptr); }), bytes, flops, v.fast ? kBf16Flops : kSimtFlops);
        if (!v.fast || !(split || (n_vis == 262144 && R == 1))) continue;
        std::snprintf(name, sizeof name, "indexer_topk %s graph", v.name);
        report(name, R, shape, graph_median_us(call), bytes, flops, kBf16Flops);
        // The two halves, each as a graph: scores into a buffer, then the top-k over it.
        DeviceBuffer sc(static_cast<size_t>(R * n_vis) * sizeof(float));
        std::snprintf(name, sizeof name, "indexer score %s", v.name);
        report(name, R, shape, graph_median_us([&](cudaStream_t s) {
                 dsv4::cuda::detail::indexer_score_mma(q.as<float>(), om.as<float>(), drows.as<IndexerRow>(), R, nh, hd, n_vis,
                                           sc.as<float>(), n_vis, s, v.keys);
               }),
               key_bytes + R * (nh * hd * 4.0 + n_vis * 4.0), flops, kBf16Flops);
        if (v.keys != KeyFormat::BF16) continue;
        if (dsv4::cuda::detail::indexer_wgmma_ok(nh, hd)) {  // the mma.sync scorer on the same keys
          dsv4::cuda::detail::set_indexer_wgmma(false);
          report("indexer score mma.sync", R, shape, graph_median_us([&](cudaStream_t s) {
                   dsv4::cuda::detail::indexer_score_mma(q.as<float>(), om.as<float>(), drows.as<IndexerRow>(), R, nh,
                                                         hd, n_vis, sc.as<float>(), n_vis, s, v.keys);
                 }),
                 key_bytes + R * (nh * hd * 4.0 + n_vis * 4.0), flops, kBf16Flops);
          dsv4::cuda::detail::set_indexer_wgmma(true);
        }
        report("indexer select", R, shape, graph_median_us([&](cudaStream_t s) {
                 dsv4::cuda::detail::indexer_select(sc.as<float>(), n_vis, drows.as<IndexerRow>(), R, topk, n_vis,
                                        out.as<int32_t>(), s);
               }),
               R * n_vis * 4.0 * 2, 0.0);
      }
  }
}

}  // namespace

// Usage: bench_ops [norm|hc|attention|indexer|rope-quant|scratch]... (default all).
int main(int argc, char** argv) {
  const std::vector<std::string> parts(argv + 1, argv + argc);
  const char* known[] = {"norm", "hc", "attention", "indexer", "rope-quant", "scratch"};
  for (const std::string& p : parts)
    if (std::find(std::begin(known), std::end(known), p) == std::end(known)) {
      std::fprintf(stderr, "bench_ops: unknown part '%s' (norm | hc | attention | indexer | rope-quant | scratch)\n", p.c_str());
      return 2;
    }
  if (!available()) {
    std::printf("bench_ops: no CUDA device\n");
    return 0;
  }
  auto want = [&](const char* p) { return parts.empty() || std::find(parts.begin(), parts.end(), p) != parts.end(); };
  if (want("norm")) bench_rms_norm();
  if (want("hc")) bench_hc();
  if (want("attention")) bench_attention();
  if (want("indexer")) bench_indexer();
  if (want("rope-quant")) bench_rope_quant();
  if (want("scratch")) bench_scratch();
  return 0;
}
