#include "tools/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include <nvtx3/nvToolsExt.h>

#include "backend/cuda/check.h"
#include "backend/cuda/device.h"
#include "core/error.h"
#include "model/cuda/cuda_model.h"
#include "model/cuda/random_device_weights.h"
#include "tools/bench_spec.h"

namespace dsv4 {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

size_t view_bytes(const WeightView& w) {
  if (w.empty()) return 0;
  const int64_t rows_of_scale = w.format == WeightFormat::FP8Block ? (w.out + 127) / 128 : w.out;
  const size_t data = w.format == WeightFormat::FP4Group32 ? size_t(w.out * w.in / 2)
                                                          : size_t(w.out * w.in) * dtype_size(w.dtype);
  const size_t scale = w.scale ? size_t(rows_of_scale * w.scale_cols) * dtype_size(w.scale_dtype) : 0;
  return data + scale;
}

// Device-to-device copy bandwidth (bytes read + written per second), median of 10.
double measure_copy_bandwidth() {
  const size_t n = size_t{2} << 30;
  cuda::DeviceBuffer a(n), b(n);
  a.fill_bytes(1);
  cudaEvent_t e0, e1;
  DSV4_CUDA_CHECK(cudaEventCreate(&e0));
  DSV4_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int i = 0; i < 13; ++i) {
    DSV4_CUDA_CHECK(cudaEventRecord(e0));
    DSV4_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), n, cudaMemcpyDeviceToDevice));
    DSV4_CUDA_CHECK(cudaEventRecord(e1));
    DSV4_CUDA_CHECK(cudaEventSynchronize(e1));
    float t;
    DSV4_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
    if (i >= 3) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return 2.0 * n / (ms[ms.size() / 2] * 1e-3);
}

}  // namespace

int run_bench(const BenchOptions& opt) {
  DSV4_CHECK(opt.random_weights, "dsv4 bench: only --random-weights is supported (a real checkpoint of a full "
                                 "V4 model does not fit one GPU)");
  DSV4_CHECK(cuda::available(), "dsv4 bench: no CUDA device");
  DSV4_CHECK(opt.precision == "fast" || opt.precision == "exact", "--precision ", opt.precision, ": unsupported");
  DSV4_CHECK(opt.speculative_tokens >= 0 && opt.speculative_tokens <= 3, "--speculative-tokens ",
             opt.speculative_tokens, ": must be in [0, 3]");
  ModelConfig cfg = preset_config(opt.preset, opt.layers);
  cfg.num_nextn_predict_layers = opt.speculative_tokens > 0 ? 1 : 0;  // the MTP layer only when measured
  auto t0 = std::chrono::steady_clock::now();
  ModelWeights w = random_device_weights(cfg, opt.seed);
  CudaModel model(w, opt.precision == "fast" ? cuda::Precision::Fast : cuda::Precision::Exact);
  std::printf("model %s, %lld layers, random weights on device: %.2f GB (%.1f s)\n", opt.preset.c_str(),
              (long long)cfg.num_layers, model.weight_bytes() / 1e9, seconds_since(t0));
  const double bw = measure_copy_bandwidth();
  std::printf("measured copy bandwidth: %.2f TB/s\n", bw / 1e12);

  // Bytes a decode step must read: every non-routed weight, the routed experts the batch touches
  // (expected distinct count under uniform routing), the head, and each sequence's cache.
  // FLOPs per token (params): 2 per weight element touched (routed: K experts); the head's own are
  // added for decode (every decode token runs it), not for prefill (its last token only).
  const double E = double(cfg.n_routed_experts), K = double(cfg.num_experts_per_tok);
  size_t dense = view_bytes(w.head) + size_t(cfg.hidden_size) * 2, expert = 0;
  double params = 0;
  for (const LayerWeights& L : w.layers) {
    const AttentionWeights& A = L.attn;
    for (const WeightView* v : {&A.wq_a, &A.wq_b, &A.wkv, &A.wo_a, &A.wo_b, &A.compressor.wkv, &A.compressor.wgate,
                                &A.indexer.wq_b, &A.indexer.weights_proj, &A.indexer.compressor.wkv,
                                &A.indexer.compressor.wgate, &L.ffn.gate, &L.ffn.shared.w1, &L.ffn.shared.w2,
                                &L.ffn.shared.w3}) {
      dense += view_bytes(*v);
      params += double(v->out) * double(v->in);
    }
    expert = view_bytes(L.ffn.experts[0].w1) * 3;
    params += K * 3.0 * double(cfg.moe_intermediate_size) * double(cfg.hidden_size);
  }
  constexpr double kFp8Rate = 1.0e15;  // FLOP/s: the FP8 floor of prefill and of large decode batches

  std::mt19937 rng(opt.seed);
  std::uniform_int_distribution<int32_t> tok(2, static_cast<int32_t>(cfg.vocab_size) - 1);
  auto random_tokens = [&](int64_t n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& t : v) t = tok(rng);
    return v;
  };

  // ---- prefill
  {
    // The warm-up has the timed length: the first call at a size grows the workspaces and the
    // scratch pool (cudaMalloc), which a serving engine pays once, not per prompt (with a 256-token
    // warm-up the 8192-token prefill took ~18 ms longer than its kernels).
    std::vector<int32_t> warm = random_tokens(opt.prefill), ids = random_tokens(opt.prefill);
    DeviceSequence s0 = model.new_sequence(opt.prefill + 8), s1 = model.new_sequence(opt.prefill + 8);
    const float* lg;
    DeviceChunk c0{&s0, warm};
    model.forward_device(std::span<const DeviceChunk>(&c0, 1), false, &lg);
    auto t = std::chrono::steady_clock::now();
    DeviceChunk c1{&s1, ids};
    model.forward_device(std::span<const DeviceChunk>(&c1, 1), false, &lg);
    const double sec = seconds_since(t);
    const double flops = 2.0 * params * opt.prefill;  // linears only (attention and indexer excluded)
    const double floor_s = flops / kFp8Rate;
    std::printf("prefill %lld tokens: %.3f s, %.0f tokens/s; linear FLOPs %.2f TFLOP, floor at 1.0 PFLOP/s (FP8) "
                "%.4f s, ratio %.2fx\n",
                (long long)opt.prefill, sec, opt.prefill / sec, flops / 1e12, floor_s, sec / floor_s);
    if (opt.profile) {  // the same prefill again on a fresh sequence, one event pair per op
      DeviceSequence s2 = model.new_sequence(opt.prefill + 8);
      DeviceChunk c2{&s2, ids};
      OpProfile prof;
      model.set_profile(&prof);
      model.forward_device(std::span<const DeviceChunk>(&c2, 1), false, &lg);
      model.set_profile(nullptr);
      std::printf("  per-op GPU time, prefill %lld tokens:\n%s", (long long)opt.prefill, prof.report().c_str());
    }
  }

  // ---- decode per batch size: the same sequences stepped eagerly, then with CUDA graphs
  // The floor of a step is the larger of its bytes at the copy bandwidth and its linear FLOPs at
  // the FP8 rate (issue #6: "whichever is larger"); the ratio is against that one.
  std::printf("%-6s %-10s %-10s %-12s %-14s %-12s %-12s %s\n", "batch", "eager ms", "graph ms", "tokens/s",
              "bytes/step GB", "floor ms", "FLOP floor", "ratio (graphs)");
  const int64_t profile_steps = opt.profile ? 5 : 0;
  for (int64_t B : opt.batches) {
    const int64_t total_steps = 2 * (opt.steps + 2) + profile_steps;
    std::vector<DeviceSequence> seqs;
    for (int64_t b = 0; b < B; ++b) seqs.push_back(model.new_sequence(opt.context + total_steps + 8));
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(B));
    std::vector<DeviceChunk> chunks;
    const float* lg;
    // The contexts in calls of at most ~16k rows: one call of B x context rows (131072 at batch
    // 256) held activations past an H200's memory.
    const int64_t per_call = std::max<int64_t>(1, 16384 / std::max<int64_t>(opt.context, 1));
    for (int64_t b0 = 0; b0 < B; b0 += per_call) {
      chunks.clear();
      for (int64_t b = b0; b < std::min(B, b0 + per_call); ++b) {
        prompts[b] = random_tokens(opt.context);
        chunks.push_back({&seqs[b], prompts[b]});
      }
      model.forward_device(chunks, false, &lg);
    }
    std::vector<int32_t> next = random_tokens(B * total_steps);
    int64_t step = 0;
    auto run_steps = [&](int64_t n, bool timed) {
      std::vector<double> ms;
      for (int64_t st = 0; st < n; ++st, ++step) {
        chunks.clear();
        for (int64_t b = 0; b < B; ++b) chunks.push_back({&seqs[b], std::span<const int32_t>(&next[step * B + b], 1)});
        auto t = std::chrono::steady_clock::now();
        model.forward_device(chunks, false, &lg);
        if (timed && st >= 2) ms.push_back(seconds_since(t) * 1e3);
      }
      std::sort(ms.begin(), ms.end());
      return ms.empty() ? 0.0 : ms[ms.size() / 2];
    };
    model.set_graphs(false);
    const double eager_ms = run_steps(opt.steps + 2, true);
    model.set_graphs(true);
    const double graph_ms = run_steps(opt.steps + 2, true);  // the first two capture
    const double step_ms = graph_ms;
    const double touched = E * (1.0 - std::pow(1.0 - K / E, double(B)));
    // Cache read per sequence: window + visible compressed entries + indexer keys, each in the
    // format the model stores (bf16 keys in Fast precision where the kernels take them).
    double cache = 0;
    const double ctx = double(opt.context), key_bytes = model.index_keys() == cuda::KeyFormat::BF16 ? 2 : 4;
    const double kv_bytes = model.kv_format() == cuda::KeyFormat::BF16 ? 2 : 4;
    for (int64_t l = 0; l < cfg.num_layers; ++l) {
      const int64_t m = cfg.compress_ratio[l];
      cache += double(std::min<int64_t>(cfg.sliding_window, opt.context)) * cfg.head_dim * kv_bytes;
      if (m > 0) cache += std::floor(ctx / m) * cfg.head_dim * kv_bytes;
      if (cfg.layer_kinds[l] == AttnKind::CSA) cache += std::floor(ctx / m) * cfg.index_head_dim * key_bytes;
    }
    const double bytes = double(dense) + touched * double(expert) * cfg.num_layers + cache * B;
    const double bytes_ms = bytes / bw * 1e3;
    const double flop_ms = 2.0 * (params + double(w.head.out) * double(w.head.in)) * double(B) / kFp8Rate * 1e3;
    const double floor_ms = std::max(bytes_ms, flop_ms);
    std::printf("%-6lld %-10.3f %-10.3f %-12.1f %-14.3f %-12.3f %-12.3f %.2fx%s\n", (long long)B, eager_ms, graph_ms,
                B / (step_ms * 1e-3), bytes / 1e9, bytes_ms, flop_ms, step_ms / floor_ms,
                flop_ms > bytes_ms ? " (FLOPs)" : "");
    if (opt.profile) {
      OpProfile prof;
      model.set_profile(&prof);
      run_steps(profile_steps - 1, false);
      model.set_profile(nullptr);
      // One more eager step inside an NVTX range: `ncu --nvtx --nvtx-include dsv4_decode_step/`
      // gives each kernel's own duration (what a graph replay pays, without launch gaps).
      model.set_graphs(false);
      nvtxRangePushA("dsv4_decode_step");
      run_steps(1, false);
      nvtxRangePop();
      model.set_graphs(true);
      std::printf("  per-op GPU time, batch %lld, eager launches (%lld steps):\n%s", (long long)B,
                  (long long)prof.calls(), prof.report().c_str());
    }
  }
  if (opt.speculative_tokens > 0) bench_speculative(model, opt);
  return 0;
}

}  // namespace dsv4
