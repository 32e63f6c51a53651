#include "model/parallel/shard_spec.h"

#include "core/error.h"

namespace dsv4 {

void check_layout(const ParallelLayout& l) {
  DSV4_CHECK(l.tp >= 1 && l.ep >= 1, "--tp and --ep must be >= 1 (got ", l.tp, ", ", l.ep, ")");
  const int lo = l.tp < l.ep ? l.tp : l.ep, hi = l.world();
  DSV4_CHECK(hi % lo == 0, "--tp ", l.tp, " --ep ", l.ep, ": one must divide the other (the world is max(tp, ep) ranks)");
}

void check_shardable(const ModelConfig& cfg, const ParallelLayout& l) {
  check_layout(l);
  // A TP rank owns whole output groups (and so whole heads): wo_a/wo_b split by group.
  DSV4_CHECK(cfg.o_groups % l.tp == 0, "--tp ", l.tp, ": o_groups ", cfg.o_groups,
             " is not divisible by it (a rank owns whole output groups and their heads)");
  DSV4_CHECK(cfg.moe_intermediate_size % l.tp == 0, "--tp ", l.tp, ": the shared expert's moe_intermediate_size ",
             cfg.moe_intermediate_size, " is not divisible by it");
  DSV4_CHECK(cfg.n_routed_experts % l.ep == 0, "--ep ", l.ep, ": n_routed_experts ", cfg.n_routed_experts,
             " is not divisible by it (a rank owns a contiguous block of experts)");
}

}  // namespace dsv4
