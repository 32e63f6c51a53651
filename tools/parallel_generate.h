// `dsv4 generate --tp N --ep M`: a tensor × expert parallel world (model/parallel/). On the CPU
// it runs the ranks simulated in this process (the same sharding, collectives and all-to-all
// as one process per GPU); on CUDA it is an Error until the CUDA model has a TP/EP forward.
#pragma once
#include <string>
#include <vector>

#include "model/parallel/shard_spec.h"
#include "runtime/parallel_cpu_backend.h"
#include "tools/generate.h"

namespace dsv4 {

std::vector<int32_t> generate_parallel(const std::string& model_dir, const ParallelLayout& l, const GenerateOptions& opt);

}  // namespace dsv4
