#include "tools/parallel_generate.h"

#include <cstdio>

#include "core/error.h"
#include "model/parallel/local_world.h"

namespace dsv4 {

std::vector<int32_t> generate_parallel(const std::string& model_dir, const ParallelLayout& l, const GenerateOptions& opt) {
  LocalWorld world(load_weights(model_dir), l);
  std::fprintf(stderr, "parallel: tp %d ep %d = %d ranks simulated in-process\n", l.tp, l.ep, world.world());
  LocalWorld::Sequence seq = world.new_sequence();
  auto feed = [&](std::span<const int32_t> toks) {
    LocalWorld::Chunk c{&seq, toks};
    return world.forward(std::span<const LocalWorld::Chunk>(&c, 1), false);
  };
  return generate(feed, world.config().vocab_size, static_cast<int32_t>(world.config().eos_token_id), opt);
}

}  // namespace dsv4
