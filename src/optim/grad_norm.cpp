// Global gradient norm and clipping.
#include "triax/optim/grad_norm.h"

#include <cmath>

namespace triax {

namespace {
// Copies that another rank owns are not counted, but a NaN/inf in them still is: the copies
// should be equal, and when they are not, skipping on every rank beats diverging replicas.
double owned_plus_nonfinite(double owned, double others) { return std::isfinite(others) ? owned : owned + others; }

// acc (f64, n) on the store's backend, zeroed: per-class sums of squares gathered there and read
// back once.
Tensor accumulators(Backend& be, int n) { return be.zeros(Shape{n}, DType::f64); }
std::vector<double> read(Backend& be, const Tensor& acc) {
  std::vector<double> h(static_cast<size_t>(acc.numel()));
  be.copy_to_host(h.data(), acc, h.size() * sizeof(double));
  return h;
}
}  // namespace

double local_grad_sumsq(ParamStore& store) {
  Backend& be = store.backend();
  const Tensor acc = accumulators(be, 2);
  for (size_t i = 0; i < store.size(); ++i) be.sum_squares_into(acc, store.info(i).spec.norm_owner ? 0 : 1, store.grad_t(i));
  const auto h = read(be, acc);
  return owned_plus_nonfinite(h[0], h[1]);
}

GradShard shard_of(const GradBuffer& zero) {
  if (zero.options().sync != GradSync::reduce_scatter)
    TRIAX_THROW(ConfigError, "the GradBuffer does not reduce-scatter (not ZeRO-1)");
  return GradShard{zero.shard_grads_t(), &zero.shard_segments(), true};
}

namespace {
double shard_sumsq(ParamStore& store, const GradShard& sh) {
  Backend& be = store.backend();
  const Tensor acc = accumulators(be, 2);
  const Tensor& g = sh.grads;
  for (const auto& seg : *sh.segments) {
    const auto o = static_cast<int64_t>(seg.shard_offset);
    be.sum_squares_into(acc, store.info(seg.param).spec.norm_owner ? 0 : 1, g.slice(o, o + static_cast<int64_t>(seg.count)));
  }
  const auto h = read(be, acc);
  const double v = owned_plus_nonfinite(h[0], h[1]);
  return sh.counts || !std::isfinite(v) ? v : 0.0;
}
double world_sum(ProcessGrid& grid, double mine) {
  double buf[1] = {mine};
  grid.world().all_reduce(std::span<double>(buf), ReduceOp::sum).wait();
  return buf[0];
}
}  // namespace

double local_grad_sumsq(ParamStore& store, const GradBuffer& zero) { return shard_sumsq(store, shard_of(zero)); }

double global_grad_norm(ParamStore& store, ProcessGrid& grid, const GradShard& shard) {
  return std::sqrt(world_sum(grid, shard_sumsq(store, shard)));
}

bool any_nonfinite_grad(ParamStore& store, ProcessGrid& grid, const GradShard& shard) {
  Backend& be = store.backend();
  const Tensor acc = accumulators(be, 1);
  if (shard.grads.defined() && shard.grads.numel() > 0) be.count_nonfinite_into(acc, 0, shard.grads);
  double buf[1] = {read(be, acc)[0]};
  grid.world().all_reduce(std::span<double>(buf), ReduceOp::max).wait();
  return buf[0] > 0;
}

double global_grad_norm(ParamStore& store, ProcessGrid& grid, const GradBuffer* zero) {
  if (zero) return global_grad_norm(store, grid, shard_of(*zero));
  double mine;
  {
    // Dense parameters: DP replicas agree, DP rank 0 counts them. MoE experts: the ranks of one
    // expert-data-parallel group agree, and the EP groups hold different experts, so the first
    // EP group (expert_dp rank 0) counts them. With ep = 1 both are DP rank 0.
    // Slots: 0 dense owned, 1 dense others, 2 expert owned, 3 expert others.
    Backend& be = store.backend();
    const Tensor acc = accumulators(be, 4);
    for (size_t i = 0; i < store.size(); ++i) {
      const auto& sp = store.info(i).spec;
      be.sum_squares_into(acc, (sp.expert ? 2 : 0) + (sp.norm_owner ? 0 : 1), store.grad_t(i));
    }
    const auto h = read(be, acc);
    const double d = owned_plus_nonfinite(h[0], h[1]);
    const double e = owned_plus_nonfinite(h[2], h[3]);
    mine = (grid.dp_cp().rank() == 0 || !std::isfinite(d) ? d : 0.0) +
           (grid.expert_dp_cp().rank() == 0 || !std::isfinite(e) ? e : 0.0);
  }
  return std::sqrt(world_sum(grid, mine));
}

bool any_nonfinite_grad(ParamStore& store, ProcessGrid& grid, const GradBuffer* zero) {
  if (zero) return any_nonfinite_grad(store, grid, shard_of(*zero));
  Backend& be = store.backend();
  const Tensor acc = accumulators(be, 1);
  if (store.padded_numel() > 0) {
    be.count_nonfinite_into(acc, 0, store.grads_t());
  }
  double buf[1] = {read(be, acc)[0]};
  grid.world().all_reduce(std::span<double>(buf), ReduceOp::max).wait();
  return buf[0] > 0;
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
  store.backend().scale(zero ? zero->shard_grads_t() : store.grads_t(), c);
  return norm;
}

}  // namespace triax
