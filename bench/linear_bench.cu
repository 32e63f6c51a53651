// bench_linear: FastLinear (FP8 block weights) at V4-Flash shapes and the routed MoE (256
// experts, top-6, d 4096, I 2048, FP4) on random device weights. Prints the median of >= 20
// timed calls (cudaEvent, after warm-up; weights rotated over copies larger than L2 when one
// copy would fit in it), the floor max(bytes / 4.2e12 B/s, FLOPs / 1.0e15 FLOP/s) and the ratio.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/device.h"
#include "backend/cuda/fill_random.h"
#include "backend/cuda/gemm_fp8_grouped.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/moe.h"
#include "bench/event_timing.h"

using namespace dsv4;
using namespace dsv4::cuda;

namespace {

constexpr double kBandwidth = 4.2e12, kFp8Flops = 1.0e15;
constexpr size_t kRotateBytes = 256ull << 20;  // > 50 MB L2 by a wide margin
constexpr int kReps = 25, kWarm = 3;

// Random bytes with a bit mask (e4m3 codes: 0x77 keeps |v| <= 240, never NaN; e2m1: any).
__global__ void fill_kernel(uint8_t* p, size_t n, uint32_t seed, uint8_t mask, uint8_t add) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    p[i] = static_cast<uint8_t>((h & mask) + add);
  }
}

void fill(DeviceBuffer& b, uint32_t seed, uint8_t mask, uint8_t add) {
  fill_kernel<<<1024, 256>>>(b.as<uint8_t>(), b.bytes(), seed, mask, add);
  DSV4_CUDA_LAUNCH_CHECK();
}

template <class F>
double median_us(F call) {
  return dsv4::bench::median_event_ms(call, kWarm, kReps) * 1e3;
}

// BENCH_LINEAR_ONLY=name[,name]: only those weights; BENCH_LINEAR_ROWS=1[,8]: only those row
// counts — so that an ncu run can name its kernel by launch index (3 warm-ups, then the first
// timed call).
bool listed(const char* env_name, const std::string& item) {
  const char* env = std::getenv(env_name);
  if (!env || !*env) return true;
  const std::string list = std::string(",") + env + ",";
  return list.find("," + item + ",") != std::string::npos;
}

bool selected(const char* name, int64_t rows) {
  return listed("BENCH_LINEAR_ONLY", name) && listed("BENCH_LINEAR_ROWS", std::to_string(rows));
}

void report(const char* what, double us, double bytes, double flops) {
  const double floor_us = std::max(bytes / kBandwidth, flops / kFp8Flops) * 1e6;
  std::printf("%-34s %10.1f us  floor %8.1f us (%s)  ratio %5.2f  %7.1f TFLOP/s %7.0f GB/s\n", what, us, floor_us,
              bytes / kBandwidth > flops / kFp8Flops ? "bytes" : "flops", us / floor_us, flops / us * 1e-6,
              bytes / us * 1e-3);
}

// groups > 1: a block-diagonal weight of `groups` blocks of out/groups rows (wo_a), x of
// groups*in columns; timed as one run_grouped call and as the per-group run() loop.
void bench_fp8_linear(FastLinear& fast, const char* name, int64_t out, int64_t in, int64_t groups = 1) {
  if (!listed("BENCH_LINEAR_ONLY", name)) return;
  const size_t wbytes = static_cast<size_t>(out * in), sbytes = static_cast<size_t>((out / 128) * (in / 128));
  const int copies = static_cast<int>(std::max<size_t>(1, kRotateBytes / wbytes));
  std::vector<DeviceBuffer> data, scale;
  std::vector<WeightView> views;
  for (int c = 0; c < copies; ++c) {
    data.emplace_back(wbytes);
    scale.emplace_back(sbytes);
    fill(data.back(), 17 + c, 0x77, 0);
    fill(scale.back(), 91 + c, 0x3, 120);
  }
  for (int c = 0; c < copies; ++c) {
    WeightView w;
    w.format = WeightFormat::FP8Block;
    w.dtype = DType::F8_E4M3;
    w.out = out;
    w.in = in;
    w.data = data[c].as<uint8_t>();
    w.scale = scale[c].as<uint8_t>();
    w.scale_cols = in / 128;
    views.push_back(w);
  }
  const int64_t xin = groups * in, ng = out / groups;
  for (int64_t rows : {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 4096}) {
    if (groups > 1 && rows != 1 && rows != 8 && rows != 16 && rows != 32 && rows != 64 && rows != 256 && rows != 4096)
      continue;
    if (!selected(name, rows)) continue;
    DeviceBuffer x(static_cast<size_t>(rows * xin) * 4), y(static_cast<size_t>(rows * out) * 4);
    // Random activations (zeros would let the hardware skip work): N(0, 1).
    dsv4::cuda::fill_normal_f32(x.as<float>(), rows * xin, 1.f, 5 + rows, nullptr);
    const double bytes = double(wbytes + sbytes) + rows * xin * 4.0 + rows * out * 4.0, flops = 2.0 * rows * out * in;
    char buf[96];
    if (groups == 1) {
      // Decode sizes: the tensor-core GEMV (<= 32 rows), the SIMT GEMV on quantised activations
      // (<= 16 rows) and cuBLASLt (rows padded to 4); past 32 rows cuBLASLt and the wgmma GEMM
      // (gemm_fp8_grouped.h with one group).
      const int def = fast.gemv_max_rows();
      for (const char* how : {"mma", "gemv", "lt", "wg"}) {
        const std::string h = how;
        if ((rows > 32 && h != "lt" && h != "wg") || (rows <= 32 && h == "wg") || (rows > 16 && h == "gemv")) continue;
        fast.set_mma_gemv(h == "mma");
        fast.set_wide_mma_max_bytes(int64_t(1) << 40);  // "mma" is the GEMV at every size
        fast.set_gemv_max_rows(h == "lt" || h == "wg" ? 0 : 16);
        fast.set_fp8_gemm(h == "wg" ? 1 : -1);
        const double us = median_us([&](int i) {
          fast.run(views[i % copies], x.as<float>(), rows, y.as<float>(), 0, out, in, out, nullptr);
        });
        std::snprintf(buf, sizeof buf, "fp8 %-5s %5lldx%-5lld rows %4lld %s", name, (long long)out, (long long)in,
                      (long long)rows, how);
        report(buf, us, bytes, flops);
      }
      fast.set_fp8_gemm(0);
      fast.set_gemv_max_rows(def);
      fast.set_mma_gemv(true);
      fast.set_wide_mma_max_bytes(FastLinear::kDefaultWideMmaMaxBytes);
      continue;
    }
    auto run_grouped = [&](int i) {
      fast.run_grouped(views[i % copies], groups, x.as<float>(), rows, y.as<float>(), xin, out, nullptr);
    };
    const double grouped = median_us(run_grouped);
    if (rows == 64 || rows == 256) {  // the own GEMM's CTA tiles, each forced
      const char* tiles[] = {"", "64x64", "128x128", "128x64", "64x128"};
      for (int c = 1; c <= 4; ++c) {
        cuda::detail::set_grouped_gemm_cfg(c);
        std::snprintf(buf, sizeof buf, "  (tile %s) rows %4lld", tiles[c], (long long)rows);
        report(buf, median_us(run_grouped), bytes, flops);
      }
      cuda::detail::set_grouped_gemm_cfg(0);
    }
    fast.set_fp8_gemm(-1);  // past the GEMV: one quantisation, then cuBLASLt per group
    const double grouped_lt = rows > 32 ? median_us(run_grouped) : 0.0;
    fast.set_fp8_gemm(0);
    // The per-group loop as it ran before the tensor-core GEMV took grouped rows: above 8 rows
    // on cuBLASLt (rows <= 8 still on the GEMV).
    fast.set_mma_gemv(rows <= 8);
    const double looped = median_us([&](int i) {
      for (int64_t g = 0; g < groups; ++g)
        fast.run(views[i % copies], x.as<float>() + g * in, rows, y.as<float>() + g * ng, g * ng, (g + 1) * ng, xin,
                 out, nullptr);
    });
    fast.set_mma_gemv(true);
    std::snprintf(buf, sizeof buf, "fp8 %-5s %lldx%lldx%lld rows %4lld", name, (long long)groups, (long long)ng,
                  (long long)in, (long long)rows);
    report(buf, grouped, bytes, flops);
    if (rows > 32) {
      std::snprintf(buf, sizeof buf, "  (cuBLASLt per group) rows %4lld", (long long)rows);
      report(buf, grouped_lt, bytes, flops);
    }
    std::snprintf(buf, sizeof buf, "  (per-group loop) rows %4lld", (long long)rows);
    report(buf, looped, bytes, flops);
  }
}

// BF16 weights (head, compressors, router, indexer weights): fp32 math (exact precision) against
// FastLinear (GEMV up to gemv_max_rows, then bf16 tensor cores through cuBLASLt).
void bench_bf16_linear(FastLinear& fast, const char* name, int64_t out, int64_t in) {
  if (!listed("BENCH_LINEAR_ONLY", name)) return;
  const size_t wbytes = static_cast<size_t>(out * in) * 2;
  const int copies = static_cast<int>(std::max<size_t>(1, kRotateBytes / wbytes));
  std::vector<DeviceBuffer> data;
  std::vector<WeightView> views;
  for (int c = 0; c < copies; ++c) {
    data.emplace_back(wbytes);
    dsv4::cuda::fill_normal_bf16(data.back().as<uint16_t>(), out * in, 0.02f, 31 + c, nullptr);
    WeightView w;
    w.format = WeightFormat::Dense;
    w.dtype = DType::BF16;
    w.out = out;
    w.in = in;
    w.data = data.back().as<uint8_t>();
    views.push_back(w);
  }
  for (int64_t rows : {1, 2, 16, 64, 256, 4096}) {
    if (!selected(name, rows)) continue;
    DeviceBuffer x(static_cast<size_t>(rows * in) * 4), y(static_cast<size_t>(rows * out) * 4);
    dsv4::cuda::fill_normal_f32(x.as<float>(), rows * in, 1.f, 9 + rows, nullptr);
    const double bytes = double(wbytes) + rows * in * 4.0 + rows * out * 4.0, flops = 2.0 * rows * out * in;
    for (const char* how : {"exact", "fast"}) {
      const bool exact = std::string(how) == "exact";
      if (exact && rows > 256) continue;  // the fp32 tiles take seconds at prefill sizes
      const double us = median_us([&](int i) {
        if (exact)
          linear_exact(views[i % copies], x.as<float>(), rows, y.as<float>(), 0, out, in, out, nullptr);
        else
          fast.run(views[i % copies], x.as<float>(), rows, y.as<float>(), 0, out, in, out, nullptr);
      });
      char buf[96];
      std::snprintf(buf, sizeof buf, "bf16 %-5s %6lldx%-5lld rows %4lld %s", name, (long long)out, (long long)in,
                    (long long)rows, how);
      // The floor uses the bf16 tensor rate (half the FP8 rate).
      report(buf, us, bytes, 2.0 * flops);
    }
  }
}

void bench_moe() {
  const int E = 256, K = 6;
  const int64_t d = 4096, I = 2048;
  std::vector<DeviceBuffer> bufs;
  ExpertSet set;
  set.d = d;
  set.I = I;
  auto make = [&](int64_t out, int64_t in, uint32_t seed) {
    bufs.emplace_back(static_cast<size_t>(out * in / 2));
    fill(bufs.back(), seed, 0xFF, 0);
    const uint8_t* data = bufs.back().as<uint8_t>();
    bufs.emplace_back(static_cast<size_t>(out * in / 32));
    fill(bufs.back(), seed + 7, 0x3, 122);
    WeightView w;
    w.format = WeightFormat::FP4Group32;
    w.dtype = DType::U8;
    w.out = out;
    w.in = in;
    w.data = data;
    w.scale = bufs.back().as<uint8_t>();
    w.scale_cols = in / 32;
    return w;
  };
  for (int e = 0; e < E; ++e) {
    set.w1.push_back(make(I, d, 3 * e));
    set.w2.push_back(make(d, I, 3 * e + 1));
    set.w3.push_back(make(I, d, 3 * e + 2));
  }
  const double expert_bytes = 3.0 * (I * d / 2 + I * d / 32);
  MoeRunner runner;
  std::mt19937 g(7);
  // Stored layout (Exact, then Fast), then the tensor-core layout of pack_for_tensor_cores (Fast).
  // BENCH_MOE_TOKENS=a,b,..: only these token counts, packed experts only (keeps ncu runs short).
  std::vector<int64_t> counts = {1, 8, 64, 256, 512, 1024, 2048, 4096};
  const char* only = std::getenv("BENCH_MOE_TOKENS");
  if (only && *only) {
    counts.clear();
    for (const char* c = only; *c;) {
      char* end = nullptr;
      const long long v = std::strtoll(c, &end, 10);
      if (end == c || v <= 0) {
        std::fprintf(stderr, "bench_linear: BENCH_MOE_TOKENS must be a comma list of positive counts\n");
        std::exit(2);
      }
      counts.push_back(v);
      c = *end == ',' ? end + 1 : end;
    }
  }
  for (const bool packed : {false, true}) {
    if (!packed && only && *only) continue;
    if (packed && !runner.pack_for_tensor_cores(set, nullptr)) break;
    for (int64_t R : counts) {
      // Eight routings to rotate through (different experts each call).
      const int sets = 8;
      std::vector<int32_t> ex(sets * R * K);
      std::vector<float> wt(sets * R * K, 0.3f);
      std::vector<int32_t> ids(E);
      for (int i = 0; i < E; ++i) ids[i] = i;
      double distinct = 0;
      for (int s = 0; s < sets; ++s) {
        std::vector<char> used(E, 0);
        for (int64_t r = 0; r < R; ++r) {
          std::shuffle(ids.begin(), ids.end(), g);
          for (int k = 0; k < K; ++k) {
            ex[(s * R + r) * K + k] = ids[k];
            used[ids[k]] = 1;
          }
        }
        for (char u : used) distinct += u;
      }
      distinct /= sets;
      DeviceBuffer dex = to_device(ex), dwt = to_device(wt);
      DeviceBuffer x(static_cast<size_t>(R * d) * 4), out(static_cast<size_t>(R * d) * 4);
      dsv4::cuda::fill_normal_f32(x.as<float>(), R * d, 1.f, 11 + R, nullptr);
      DSV4_CUDA_CHECK(cudaMemset(out.get(), 0, out.bytes()));
      // Packed at decode sizes: the default (2 row blocks per CTA, 3 CTAs per SM) and its variants
      // (same bits, different latency hiding). From 256 tokens: the size rule, then 8-token and
      // 64-token tiles forced (moe_mma_wide.cu, wgmma). (The persistent streaming kernels of step 8
      // lost on the H100 and the H200 and were removed: bench/NOTES.md step 9.)
      // dec: the 8-token tiles on FP8 wgmma (0, the default where available) or mma.sync (-1);
      // tile: the FP8 wgmma tiles' tokens (0 by size, 8, 16).
      struct Variant {
        int rb, occ, wide, dec, tile;
        const char* tag;
      };
      const std::vector<Variant> all = {{0, 3, 0, 0, 0, ""},
                                        {0, 3, 0, 0, 8, " fp8 8-token tiles"},
                                        {0, 3, 0, 0, 16, " fp8 16-token tiles"},
                                        {0, 3, 0, -1, 0, " mma.sync"},
                                        {1, 3, 0, -1, 0, " mma.sync rb1"},
                                        {0, 2, 0, -1, 0, " mma.sync occ2"}};
      std::vector<Variant> tiles = {{0, 3, 0, 0, 0, ""},
                                    {0, 3, -1, 0, 8, " 8-token tiles"},
                                    {0, 3, -1, 0, 16, " 16-token tiles"},
                                    {0, 3, -1, -1, 0, " 8-token mma.sync tiles"},
                                    {0, 3, 1, 0, 0, " 64-token tiles"}};
      if (dsv4::cuda::moe_wgmma_available()) {
        tiles.push_back({0, 3, 2, 0, 0, " 64-token wgmma tiles"});
        tiles.push_back({0, 3, 3, 0, 0, " 128-token wgmma tiles"});
        tiles.push_back({0, 3, 4, 0, 0, " 128-token fp8 wgmma tiles"});
        tiles.push_back({0, 3, 5, 0, 0, " 128-token fp8 ws tiles"});
        tiles.push_back({0, 3, 6, 0, 0, " 128-token fp8 ws consumer-fence tiles"});
        tiles.push_back({0, 3, 7, 0, 0, " 128-token fp8 ws2 tiles"});
        tiles.push_back({0, 3, 8, 0, 0, " 128-token fp8 ws2 consumer-fence tiles"});
        tiles.push_back({0, 3, 22, 0, 0, " 128-token fp8 ws persistent tiles"});
      }
      const std::vector<Variant> variants = !packed ? std::vector<Variant>{all[0]} : R < 256 ? all : tiles;
      // BENCH_MOE_VARIANT=text: the default and the variants whose tag holds text (e.g. "fp8");
      // BENCH_MOE_SKIP=a,b: not those whose tag holds any of the texts.
      const char* want = std::getenv("BENCH_MOE_VARIANT");
      const char* skip = std::getenv("BENCH_MOE_SKIP");
      const auto skipped = [&](const char* tag) {
        if (!skip) return false;
        std::string list = skip;
        for (size_t b = 0, e; b < list.size(); b = e + 1) {
          e = std::min(list.find(',', b), list.size());
          if (e > b && std::strstr(tag, list.substr(b, e - b).c_str())) return true;
        }
        return false;
      };
      for (const Variant& v : variants) {
        if (want && *want && *v.tag && !std::strstr(v.tag, want)) continue;
        if (skipped(v.tag)) continue;
        const int rb = v.rb;
        for (Precision p : {Precision::Exact, Precision::Fast}) {
          if ((packed || R > 256) && p == Precision::Exact) continue;  // Exact at 4096 tokens: seconds
          dsv4::cuda::set_moe_mma_variant(rb, v.occ);
          dsv4::cuda::set_moe_wide_tiles(v.wide);
          dsv4::cuda::set_moe_decode_wgmma(v.dec);
          dsv4::cuda::set_moe_decode_tile(v.tile);
          const double us = median_us([&](int i) {
            const int s = i % sets;
            runner.run(set, x.as<float>(), R, dex.as<int32_t>() + s * R * K, dwt.as<float>() + s * R * K, K, 10.f,
                       out.as<float>(), p, nullptr);
          });
          char buf[96];
          std::snprintf(buf, sizeof buf, "moe fp4 %s tokens %4lld (%3.0f exp)%s",
                        p == Precision::Exact ? "exact" : packed ? "fast packed" : "fast ", (long long)R, distinct,
                        v.tag);
          report(buf, us, distinct * expert_bytes + R * d * 8.0, 2.0 * R * K * 3 * d * I);
        }
      }
      dsv4::cuda::set_moe_mma_variant(0, 3);
      dsv4::cuda::set_moe_wide_tiles(0);
      dsv4::cuda::set_moe_decode_wgmma(0);
      dsv4::cuda::set_moe_decode_tile(0);
    }
  }
}

}  // namespace

// Usage: bench_linear [linear|moe] (default both; one part keeps ncu runs short). BENCH_LINEAR_ONLY /
// BENCH_LINEAR_ROWS narrow the linear part to some weights and row counts (selected()).
int main(int argc, char** argv) {
  if (!available()) {
    std::printf("no CUDA device\n");
    return 0;
  }
  const std::string part = argc > 1 ? argv[1] : "";
  if (!part.empty() && part != "linear" && part != "moe") {
    std::fprintf(stderr, "bench_linear: unknown part '%s' (linear | moe)\n", part.c_str());
    return 2;
  }
  if (part != "moe") {
    FastLinear fast;
    bench_fp8_linear(fast, "wq_a", 1024, 4096);
    bench_fp8_linear(fast, "wq_b", 32768, 1024);
    bench_fp8_linear(fast, "wkv", 512, 4096);
    bench_fp8_linear(fast, "wo_a", 8192, 4096, 8);
    bench_fp8_linear(fast, "wo_b", 4096, 8192);
    bench_fp8_linear(fast, "w1", 2048, 4096);
    bench_bf16_linear(fast, "head", 129280, 4096);
    bench_bf16_linear(fast, "cmp", 1024, 4096);
  }
  if (part != "linear") bench_moe();
  return 0;
}
