// `dsv4 bench --speculative-tokens k`: decode tokens/s through the serving engine with and
// without MTP speculation, per batch size, with the measured acceptance rate. Random weights
// accept almost nothing, so the table also projects tokens/s from the measured round time at
// given acceptance rates (expected tokens per round 1 + α + … + α^k).
#pragma once
#include "model/cuda/cuda_model.h"
#include "tools/bench.h"

namespace dsv4 {

void bench_speculative(CudaModel& model, const BenchOptions& opt);

}  // namespace dsv4
