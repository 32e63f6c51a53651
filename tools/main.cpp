// dsv4 command line: make-tiny | generate | inspect.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "core/error.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "model/random_checkpoint.h"
#include "model/weights.h"
#include "tools/generate.h"
#include "tools/parallel_generate.h"
#include "tools/bench.h"
#ifdef DSV4_HAVE_CUDA
#include "model/cuda/cuda_model.h"
#include "runtime/cuda_backend.h"
#endif
#ifdef DSV4_HAVE_SERVER
#include "server/bench_serve.h"
#include "server/serve.h"
#endif

using namespace dsv4;

namespace {

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    size_t used = 0;
    long v = 0;
    try {
      v = std::stol(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    DSV4_CHECK(used == item.size() && used > 0, "--prompt-ids: not an integer: '", item, "'");
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

std::string default_model_dir() {
#ifdef DSV4_SOURCE_DIR
  return std::string(DSV4_SOURCE_DIR) + "/models/tiny";
#else
  return "models/tiny";
#endif
}

void print_spec_stats(const SpecStats& ss) {
  if (ss.rounds > 0)
    std::fprintf(stderr, "speculative: %lld rounds, %lld/%lld drafts accepted (%.1f%%)\n",
                 static_cast<long long>(ss.rounds), static_cast<long long>(ss.accepted),
                 static_cast<long long>(ss.drafted), 100.0 * ss.acceptance());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dsv4: DeepSeek-V4 inference engine"};
  app.require_subcommand(1);

  auto* tiny = app.add_subcommand("make-tiny", "write a random tiny checkpoint (official layout) and its dequantised twin");
  std::string tiny_out, tiny_deq, tiny_cfg;
  uint64_t tiny_seed = 1;
  bool tiny_no_mtp = false;
  tiny->add_option("--out", tiny_out, "output folder (quantised FP8/FP4 checkpoint)")->required();
  tiny->add_option("--dequant-out", tiny_deq, "output folder for the dequantised BF16 twin");
  tiny->add_option("--config", tiny_cfg, "config.json to use instead of the built-in tiny config");
  tiny->add_option("--seed", tiny_seed, "random seed");
  tiny->add_flag("--no-mtp", tiny_no_mtp, "omit the mtp.* tensors");
  float tiny_output_scale = 1.0f;
  tiny->add_option("--output-scale", tiny_output_scale, "init std factor of sub-layer output projections (<1: well conditioned)");

  auto* gen = app.add_subcommand("generate", "generate tokens from prompt token ids");
  std::string gen_model = default_model_dir(), gen_ids = "0,1,2,3", gen_device = "cpu";
  GenerateOptions gopt;
  gen->add_option("--model", gen_model, "checkpoint folder")->capture_default_str();
  gen->add_option("--prompt-ids", gen_ids, "comma-separated token ids")->capture_default_str();
  gen->add_option("--max-new-tokens", gopt.max_new_tokens)->capture_default_str();
  gen->add_option("--temperature", gopt.temperature, "0 = greedy")->capture_default_str();
  gen->add_option("--top-p", gopt.top_p)->capture_default_str();
  gen->add_option("--top-k", gopt.top_k)->capture_default_str();
  gen->add_option("--seed", gopt.seed)->capture_default_str();
  gen->add_option("--prefill-chunk", gopt.prefill_chunk, "prefill in chunks of this many tokens")->capture_default_str();
  gen->add_option("--speculative-tokens", gopt.speculative_tokens, "MTP draft tokens per step (0 = off)")
      ->capture_default_str();
  std::string gen_precision = "exact";
  int64_t gen_capacity = 4096;
  gen->add_option("--device", gen_device, "cpu or cuda")->capture_default_str();
  ParallelLayout gen_par;
  gen->add_option("--tp", gen_par.tp, "tensor-parallel degree (attention heads, shared expert)")->capture_default_str();
  gen->add_option("--ep", gen_par.ep, "expert-parallel degree (routed experts)")->capture_default_str();
  gen->add_option("--precision", gen_precision, "cuda: exact (fp32) or fast (FP8/FP4 tensor cores)")->capture_default_str();
  gen->add_option("--max-context", gen_capacity, "cuda: per-sequence state capacity in tokens")->capture_default_str();

  auto* insp = app.add_subcommand("inspect", "validate a checkpoint folder and print its layout");
  std::string insp_model = default_model_dir();
  insp->add_option("--model", insp_model)->capture_default_str();

  auto* bench = app.add_subcommand("bench", "GPU end-to-end benchmark of a V4-shaped model (random weights)");
  BenchOptions bopt;  // a plain struct: parsed in every build, run only with CUDA
  bench->add_option("--preset", bopt.preset, "v4-flash or v4-pro")->capture_default_str();
  bench->add_option("--layers", bopt.layers, "main layers to build")->capture_default_str();
  bench->add_flag("--random-weights", bopt.random_weights, "random weights generated on the device");
  bench->add_option("--precision", bopt.precision, "fast or exact")->capture_default_str();
  bench->add_option("--batches", bopt.batches, "decode batch sizes")->delimiter(',');
  bench->add_option("--context", bopt.context, "tokens per sequence before decode timing")->capture_default_str();
  bench->add_option("--prefill", bopt.prefill, "prefill length")->capture_default_str();
  bench->add_option("--steps", bopt.steps, "timed decode steps")->capture_default_str();
  bench->add_flag("--profile", bopt.profile, "per-op GPU time of the prefill and of eager decode steps");
  bench->add_option("--speculative-tokens", bopt.speculative_tokens,
                    "also engine decode with MTP drafting k tokens (1..3) against none")->capture_default_str();

#ifdef DSV4_HAVE_SERVER
  ServeOptions sopt;
  auto* serve = add_serve_command(app, sopt);
  BenchServeOptions bsopt;
  auto* bench_serve = add_bench_serve_command(*bench, bsopt);
#endif
  CLI11_PARSE(app, argc, argv);
  try {
#ifdef DSV4_HAVE_SERVER
    if (*serve) return run_serve(sopt);
    if (*bench_serve) return run_bench_serve(bsopt);
#endif
    if (*tiny) {
      ModelConfig cfg = tiny_cfg.empty() ? tiny_config() : load_config(tiny_cfg);
      RandomCheckpointOptions opt{tiny_seed, !tiny_no_mtp, tiny_output_scale};
      write_random_checkpoint(cfg, tiny_out, true, opt);
      if (!tiny_deq.empty()) write_random_checkpoint(cfg, tiny_deq, false, opt);
      std::printf("wrote %s%s%s\n", tiny_out.c_str(), tiny_deq.empty() ? "" : " and ", tiny_deq.c_str());
    } else if (*gen) {
      gopt.prompt = parse_ids(gen_ids);
      std::vector<int32_t> out;
      if (parallel_requested(gen_par)) {
        check_parallel_flags(gen_par, gen_device, gopt.speculative_tokens);
        out = generate_parallel(gen_model, gen_par, gopt);
      } else if (gen_device == "cpu") {
        Model model(load_weights(gen_model));
        SpecStats ss;
        out = gopt.speculative_tokens > 0 ? generate_speculative(model, gopt, &ss) : generate(model, gopt);
        print_spec_stats(ss);
      } else if (gen_device == "cuda") {
#ifdef DSV4_HAVE_CUDA
        DSV4_CHECK(gen_precision == "exact" || gen_precision == "fast", "--precision ", gen_precision,
                   ": unsupported (exact or fast)");
        ModelWeights w = load_weights(gen_model);
        CudaModel model(w, gen_precision == "fast" ? cuda::Precision::Fast : cuda::Precision::Exact);
        if (gopt.speculative_tokens > 0) {
          DSV4_CHECK(model.has_mtp(), "--speculative-tokens: ", gen_model, " has no mtp.* weights");
          CudaBackend backend(model, true);
          SpecStats ss;
          out = generate_speculative(backend, gopt, &ss);
          print_spec_stats(ss);
        } else {
          DeviceSequence seq = model.new_sequence(gen_capacity);
          auto feed = [&](std::span<const int32_t> toks) {
            DeviceChunk c{&seq, toks};
            return model.forward(std::span<const DeviceChunk>(&c, 1), false);
          };
          out = generate(feed, w.config.vocab_size, static_cast<int32_t>(w.config.eos_token_id), gopt);
        }
#else
        fail("--device cuda: this build has no CUDA backend (configure with -DDSV4_CUDA=ON)");
#endif
      } else {
        fail("--device ", gen_device, ": unsupported (cpu or cuda)");
      }
      for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? "," : "", out[i]);
      std::printf("\n");
    } else if (*bench) {
#ifdef DSV4_HAVE_CUDA
      bopt.random_weights = true;  // the only source a single GPU can hold at real dims
      return run_bench(bopt);
#else
      fail("dsv4 bench: this build has no CUDA backend (configure with -DDSV4_CUDA=ON)");
#endif
    } else if (*insp) {
      ModelWeights w = load_weights(insp_model);
      const ModelConfig& c = w.config;
      std::printf("layers %lld, hidden %lld, heads %lld x %lld, experts %lld top-%lld, vocab %lld, mtp %zu\n",
                  (long long)c.num_layers, (long long)c.hidden_size, (long long)c.num_heads, (long long)c.head_dim,
                  (long long)c.n_routed_experts, (long long)c.num_experts_per_tok, (long long)c.vocab_size,
                  w.mtp.size());
      for (size_t i = 0; i < w.layers.size(); ++i) {
        const auto& L = w.layers[i];
        std::printf("  layer %zu: %s ratio %lld%s\n", i,
                    L.kind == AttnKind::SWA ? "SWA" : L.kind == AttnKind::CSA ? "CSA" : "HCA", (long long)L.ratio,
                    L.hash ? " hash-routed" : "");
      }
      std::printf("tensors %zu\n", w.checkpoint->tensors().size());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsv4: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
