// The model backend `dsv4 serve` runs on, from its flags: the CPU reference (optionally with
// the MTP module for speculative decoding), the CUDA model (DSV4_HAVE_CUDA builds), or the
// test-only scripted replay. Every unusable combination is an Error before weights load.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "chat/tokenizer.h"
#include "runtime/backend.h"

namespace dsv4 {

struct BackendChoice {
  std::string device = "cpu";          // cpu | cuda
  std::string precision = "exact";     // cuda: exact (fp32) | fast (FP8/FP4 tensor cores)
  double gpu_memory_utilization = 0.9;  // cuda: fraction of device memory weights + KV may take
  int64_t speculative_tokens = 0;      // MTP drafts per step (CPU only for now)
  std::string fake_output_file;        // TEST ONLY: scripted replay
  int tp = 1, ep = 1;                  // --tp/--ep: a LocalWorld of simulated ranks (CPU)
};

struct ServeBackend {
  std::unique_ptr<ModelBackend> backend;
  std::shared_ptr<void> model;  // what backend points into (Model / CudaModel and its weights)
  size_t kv_budget = 0;         // cuda: from free device memory; 0 = use --kv-memory
};

// Throws Error on a bad combination (message names the flag).
void check_backend_choice(const BackendChoice& c);
ServeBackend make_serve_backend(const std::string& model_dir, const Tokenizer& tok, const BackendChoice& c);

}  // namespace dsv4
