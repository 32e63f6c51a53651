#include "server/serve_backend.h"

#include <cstdio>

#include "core/error.h"
#include "io/config.h"
#include "model/model.h"
#include "model/weights.h"
#include "runtime/cpu_backend.h"
#include "runtime/parallel_cpu_backend.h"
#include "server/scripted_backend.h"

#ifdef DSV4_HAVE_CUDA
#include <cuda_runtime.h>

#include "model/cuda/cuda_model.h"
#include "runtime/cuda_backend.h"
#include "runtime/kv_budget.h"
#endif

namespace dsv4 {

void check_backend_choice(const BackendChoice& c) {
  DSV4_CHECK(c.device == "cpu" || c.device == "cuda", "--device ", c.device, ": unsupported (cpu or cuda)");
  DSV4_CHECK(c.precision == "exact" || c.precision == "fast", "--precision ", c.precision,
             ": unsupported (exact or fast)");
  DSV4_CHECK(c.speculative_tokens >= 0 && c.speculative_tokens <= 16, "--speculative-tokens must be in [0, 16], got ",
             c.speculative_tokens);
  DSV4_CHECK(c.fake_output_file.empty() || c.speculative_tokens == 0,
             "--speculative-tokens: the scripted test backend has no MTP module");
  if (parallel_requested({c.tp, c.ep})) {
    DSV4_CHECK(c.fake_output_file.empty(), "--fake-output-file replays without a model: drop --tp/--ep");
    check_parallel_flags({c.tp, c.ep}, c.device, c.speculative_tokens);
  }
  if (c.device != "cuda") return;
#ifndef DSV4_HAVE_CUDA
  fail("--device cuda: this build has no CUDA backend (configure with -DDSV4_CUDA=ON)");
#endif
  DSV4_CHECK(c.fake_output_file.empty(), "--fake-output-file replays on the CPU: drop --device cuda");
  DSV4_CHECK(c.gpu_memory_utilization > 0 && c.gpu_memory_utilization <= 1,
             "--gpu-memory-utilization must be in (0, 1], got ", c.gpu_memory_utilization);
}

namespace {

// Speculative decoding needs the checkpoint's MTP module.
void check_mtp_weights(const ModelWeights& w, const std::string& dir, const BackendChoice& c) {
  DSV4_CHECK(c.speculative_tokens == 0 || !w.mtp.empty(), "--speculative-tokens ", c.speculative_tokens, ": ", dir,
             " has no mtp.* weights (num_nextn_predict_layers = ", w.config.num_nextn_predict_layers,
             "); MTP speculative decoding needs them");
}

ServeBackend cpu_backend(const std::string& dir, const BackendChoice& c) {
  ModelWeights w = load_weights(dir);
  check_mtp_weights(w, dir, c);
  auto model = std::make_shared<Model>(std::move(w));
  ServeBackend s;
  s.backend = std::make_unique<CpuBackend>(*model, c.speculative_tokens > 0);
  s.model = model;
  return s;
}

#ifdef DSV4_HAVE_CUDA
// The host weights stay mapped for the model's lifetime, as in `dsv4 generate --device cuda`.
struct CudaParts {
  CudaParts(ModelWeights w, cuda::Precision p) : weights(std::move(w)), model(weights, p) {}
  ModelWeights weights;
  CudaModel model;
};

ServeBackend cuda_backend(const std::string& dir, const BackendChoice& c) {
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  DSV4_CHECK(err == cudaSuccess && devices > 0, "--device cuda: no usable CUDA device (",
             err == cudaSuccess ? "none found" : cudaGetErrorString(err), ")");
  ModelWeights w = load_weights(dir);
  check_mtp_weights(w, dir, c);
  auto parts = std::make_shared<CudaParts>(std::move(w), c.precision == "fast" ? cuda::Precision::Fast : cuda::Precision::Exact);
  // The budget is what the utilization target leaves once the weights are resident.
  size_t free_b = 0, total_b = 0;
  DSV4_CHECK(cudaMemGetInfo(&free_b, &total_b) == cudaSuccess, "--device cuda: cudaMemGetInfo failed");
  ServeBackend s;
  s.kv_budget = gpu_kv_budget(total_b, total_b - free_b, c.gpu_memory_utilization);
  s.backend = std::make_unique<CudaBackend>(parts->model, c.speculative_tokens > 0);
  s.model = parts;
  return s;
}
#endif

}  // namespace

ServeBackend make_serve_backend(const std::string& dir, const Tokenizer& tok, const BackendChoice& c) {
  check_backend_choice(c);
  if (!c.fake_output_file.empty()) {
    std::fprintf(stderr, "dsv4 serve: TEST MODE: replaying %s instead of running the model\n",
                 c.fake_output_file.c_str());
    ServeBackend s;
    s.backend = std::make_unique<ScriptedBackend>(load_config(dir + "/config.json"), tok,
                                                  load_script(c.fake_output_file, tok));
    return s;
  }
  if (parallel_requested({c.tp, c.ep})) {
    auto world = std::make_shared<LocalWorld>(load_weights(dir), ParallelLayout{c.tp, c.ep});
    std::fprintf(stderr, "dsv4 serve: tp %d ep %d = %d ranks simulated in-process\n", c.tp, c.ep, world->world());
    ServeBackend s;
    s.backend = std::make_unique<ParallelCpuBackend>(*world);
    s.model = world;
    return s;
  }
#ifdef DSV4_HAVE_CUDA
  if (c.device == "cuda") return cuda_backend(dir, c);
#endif
  return cpu_backend(dir, c);
}

}  // namespace dsv4
