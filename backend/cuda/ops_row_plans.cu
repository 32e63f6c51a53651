// expand_row_plans: a call's per-row attention and indexer descriptors from per-segment jobs.
// Twin: CudaModel::describe_layer's per-row loop before the jobs (same fields, same values).
#include <cuda_runtime.h>

#include "backend/cuda/check.h"
#include "backend/cuda/ops.h"

namespace dsv4::cuda {
namespace {

// blockIdx.y: the job; x: rows of it.
__global__ void expand_row_plans_kernel(const RowPlanJob* jobs) {
  const RowPlanJob& J = jobs[blockIdx.y];
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= J.n) return;
  AttnRow r = J.first;
  r.pos += i;
  if (J.hca) r.n_entries = (r.pos + 1) / J.ratio;
  if (r.sel) r.sel += i * J.sel_stride;
  J.attn[i] = r;
  if (J.index) J.index[i] = IndexerRow{J.index_keys, (r.pos + 1) / J.ratio};
}

}  // namespace

void expand_row_plans(const RowPlanJob* jobs, int64_t n_jobs, int64_t max_n, cudaStream_t s) {
  DSV4_CHECK(n_jobs < 65536, "cuda::expand_row_plans: too many jobs");
  if (n_jobs <= 0 || max_n <= 0) return;
  constexpr int kThreads = 128;
  expand_row_plans_kernel<<<dim3(static_cast<unsigned>((max_n + kThreads - 1) / kThreads),
                                 static_cast<unsigned>(n_jobs)),
                            kThreads, 0, s>>>(jobs);
  DSV4_CUDA_LAUNCH_CHECK();
}

}  // namespace dsv4::cuda
