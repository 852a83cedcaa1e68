// Global gradient norm and clipping.
#include "triax/optim/grad_norm.h"

#include <cmath>

namespace triax {
namespace {
double sumsq(std::span<const float> x) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (size_t i = 0; i < x.size(); ++i) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  return s;
}

// Copies that another rank owns are not counted, but a NaN/inf in them still is: the copies
// should be equal, and when they are not, skipping on every rank beats diverging replicas.
double owned_plus_nonfinite(double owned, double others) { return std::isfinite(others) ? owned : owned + others; }

}  // namespace

double local_grad_sumsq(const ParamStore& store) {
  double owned = 0.0, others = 0.0;
  const auto g = store.flat_grads();
  for (const auto& p : store.infos()) (p.spec.norm_owner ? owned : others) += sumsq(g.subspan(p.offset, p.numel));
  return owned_plus_nonfinite(owned, others);
}

double local_grad_sumsq(const ParamStore& store, const GradBuffer& zero) {
  if (zero.options().sync != GradSync::reduce_scatter)
    TRIAX_THROW(ConfigError, "local_grad_sumsq: the GradBuffer does not reduce-scatter (not ZeRO-1)");
  double owned = 0.0, others = 0.0;
  const auto g = zero.shard_grads();
  for (const auto& seg : zero.shard_segments())
    (store.info(seg.param).spec.norm_owner ? owned : others) += sumsq(g.subspan(seg.shard_offset, seg.count));
  return owned_plus_nonfinite(owned, others);
}

double global_grad_norm(const ParamStore& store, ProcessGrid& grid, const GradBuffer* zero) {
  double mine;
  if (zero) {
    mine = local_grad_sumsq(store, *zero);
  } else {
    // Dense parameters: DP replicas agree, DP rank 0 counts them. MoE experts: the ranks of one
    // expert-data-parallel group agree, and the EP groups hold different experts, so the first
    // EP group (expert_dp rank 0) counts them. With ep = 1 both are DP rank 0.
    double dense_owned = 0.0, dense_others = 0.0, expert_owned = 0.0, expert_others = 0.0;
    const auto g = store.flat_grads();
    for (const auto& p : store.infos()) {
      const double v = sumsq(g.subspan(p.offset, p.numel));
      if (p.spec.expert) (p.spec.norm_owner ? expert_owned : expert_others) += v;
      else (p.spec.norm_owner ? dense_owned : dense_others) += v;
    }
    const double d = owned_plus_nonfinite(dense_owned, dense_others);
    const double e = owned_plus_nonfinite(expert_owned, expert_others);
    mine = (grid.coord().dp == 0 || !std::isfinite(d) ? d : 0.0) +
           (grid.expert_dp().rank() == 0 || !std::isfinite(e) ? e : 0.0);
  }
  double buf[1] = {mine};
  grid.world().all_reduce(std::span<double>(buf), ReduceOp::sum).wait();
  return std::sqrt(buf[0]);
}

double clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0.0 || !(norm > max_norm)) return 1.0;
  return max_norm / (norm + 1e-6);
}

double clip_grad_norm(ParamStore& store, ProcessGrid& grid, double max_norm, GradBuffer* zero) {
  const double norm = global_grad_norm(store, grid, zero);
  if (!std::isfinite(norm)) return norm;
  const float c = static_cast<float>(clip_coefficient(norm, max_norm));
  if (c == 1.0f) return norm;
  auto g = zero ? zero->shard_grads() : store.flat_grads();
  for (auto& x : g) x *= c;
  return norm;
}

}  // namespace triax
