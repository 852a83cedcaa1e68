// The backward pass against an independent reference: central finite differences of the loss in
// float64 (the CPU backend built for float64), for a few random elements of every parameter
// tensor of a GPT chunk - dense and MoE layers, every recompute mode, and (tp = 2) sequence
// parallelism. Every TP/PP/DP equivalence test compares the code with itself; this one checks the
// math. The objective is what backward differentiates: the micro-batch losses weighted by dloss,
// plus aux_loss_coef x dloss x the MoE load-balancing losses.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cmath>
#include <random>

#include "support/multirank.h"
#include "triax/backend/backend.h"
#include "triax/distributed/comm/self_comm.h"
#include "triax/model/gpt.h"

using namespace triax;

namespace {

struct Case {
  const char* name;
  Recompute rc;
  bool sp;
  bool moe;
};

GptConfig tiny() {
  GptConfig c = GptConfig::preset("nano");
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.ffn = 32;
  c.vocab = 23;  // not divisible by tp: the padding path runs
  c.max_seq = 8;
  return c;
}

std::vector<double> host(Backend& be, const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  be.copy_to_host(v.data(), t, v.size() * sizeof(double));
  return v;
}

void set_elem(Backend& be, const Tensor& t, int64_t e, double x) { be.copy_from_host(t.slice(e, e + 1), &x, sizeof x); }

void check_case(const Case& k) {
  Communicator& tp = test::world();
  auto be = make_cpu_backend(DType::f64);
  ParamStore store(*be);
  auto ep = make_self_communicator("ep", tp.rank());
  const GptConfig cfg = tiny();
  ChunkMoe moe;
  if (k.moe) {
    moe.every = 2;  // layer 1 is MoE
    moe.cfg.experts = 4;
    moe.cfg.top_k = 2;
    moe.cfg.drop_tokens = false;  // capacity is discrete: no drops keeps the loss smooth
    moe.cfg.aux_loss_coef = 0.05f;
    moe.ep = ep.get();
  }
  GptChunk chunk(cfg, {0, cfg.n_layer, true, true}, tp, store, k.rc, true, k.sp, moe);
  store.finalize();
  REQUIRE(store.dtype() == DType::f64);
  chunk.init_params(99);
  const int B = 2, T = 8, M = 2;  // two micro-batches: gradients must accumulate
  std::mt19937 gen(7);
  std::uniform_int_distribution<int32_t> tok(0, cfg.vocab - 1);
  std::vector<std::vector<int32_t>> xs(M), ys(M);
  for (int m = 0; m < M; ++m)
    for (int i = 0; i < B * T; ++i) {
      xs[m].push_back(tok(gen));
      ys[m].push_back(tok(gen));
    }
  const float dloss = 1.0f / M;
  const double coef = k.moe ? moe.cfg.aux_loss_coef : 0.0;
  auto objective = [&] {
    double J = 0;
    for (int m = 0; m < M; ++m) J += dloss * chunk.forward(100 + m, B, T, xs[m], ys[m], Tensor(), Tensor(), false, dloss);
    return J + coef * dloss * chunk.take_aux_loss();
  };
  // Analytic gradients.
  store.zero_grads();
  chunk.take_aux_loss();
  for (int m = 0; m < M; ++m) chunk.forward(m, B, T, xs[m], ys[m], Tensor(), Tensor(), true, dloss);
  for (int m = M; m-- > 0;) chunk.backward(m, Tensor(), Tensor(), false);
  chunk.take_aux_loss();

  // float64 end to end (the backend, the returned losses, the MoE routing): with steps of 1e-3 of
  // the weight's scale, truncation and rounding errors stay near 1e-10, far below the tolerance.
  std::mt19937 pick(1234);  // same on every rank: every rank perturbs the same parameter in step
  int checked = 0, failed = 0;
  double worst = 0;
  std::string failures;  // one line per element out of tolerance
  for (size_t i = 0; i < store.size(); ++i) {
    const auto& info = store.info(i);
    const Tensor p = store.param_t(i);
    const auto grad = host(*be, store.grad_t(i));
    const auto vals = host(*be, p);
    for (int s = 0; s < 3; ++s) {
      const auto e = static_cast<int64_t>(pick() % static_cast<uint32_t>(info.numel));
      // A TP-sharded tensor is perturbed on one rank (its owner of that element); a replicated
      // one on every rank, as the replicas must stay equal.
      const int owner = static_cast<int>(pick() % static_cast<uint32_t>(tp.size()));
      const bool mine = info.spec.split == TpSplit::none || owner == tp.rank();
      // The owner's value and analytic gradient, shared with the other ranks: every rank divides
      // by the same step h and compares with the same value.
      const bool reports = mine && (info.spec.split != TpSplit::none || tp.rank() == 0);
      double own[2] = {reports ? vals[e] : 0.0, reports ? grad[e] : 0.0};
      tp.all_reduce(std::span<double>(own), ReduceOp::sum).wait();
      const double h = 1e-3 * std::max(0.02, std::abs(own[0]));
      if (mine) set_elem(*be, p, e, vals[e] + h);
      const double jp = objective();
      if (mine) set_elem(*be, p, e, vals[e] - h);
      const double jm = objective();
      if (mine) set_elem(*be, p, e, vals[e]);
      const double fd = (jp - jm) / (2 * h);
      const double an[1] = {own[1]};
      const double err = std::abs(fd - an[0]);
      const double tol = 1e-8 + 1e-5 * std::abs(an[0]);
      worst = std::max(worst, err / tol);
      ++checked;
      if (err > tol) {
        ++failed;
        failures += fmt::format("\n  {}: {}[{}] analytic {:.10g} finite difference {:.10g} (|diff| {:.3g} > {:.3g})",
                                k.name, info.spec.name, e, an[0], fd, err, tol);
      }
    }
  }
  INFO(k.name << ": " << checked << " elements checked, worst error / tolerance " << worst << failures);
  CHECK(checked >= 3 * static_cast<int>(store.size()));
  CHECK(failed == 0);
}

}  // namespace

TEST_CASE("gradcheck: every parameter of a dense GPT chunk, each recompute mode", "[gradcheck]") {
  for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full}) {
    const Case k{"dense", rc, false, false};
    INFO("recompute " << recompute_name(rc));
    check_case(k);
  }
}

TEST_CASE("gradcheck: sequence parallelism", "[gradcheck]") {
  if (test::world().size() < 2) SUCCEED("sequence parallelism needs tp >= 2");
  else
    for (Recompute rc : {Recompute::none, Recompute::full}) {
      INFO("recompute " << recompute_name(rc));
      check_case({"sequence parallel", rc, true, false});
    }
}

TEST_CASE("gradcheck: MoE layers (router, experts, load-balancing loss)", "[gradcheck]") {
  for (Recompute rc : {Recompute::none, Recompute::full}) {
    INFO("recompute " << recompute_name(rc));
    check_case({"moe", rc, false, true});
  }
}
