// The backward pass against an independent reference: central finite differences of the loss in
// float64 (the CPU backend built for float64), for a few random elements of every parameter
// tensor of a GPT chunk - dense and MoE layers (with and without capacity drops), every recompute
// mode, and (tp = 2) sequence parallelism. Every TP/PP/DP equivalence test compares the code with
// itself; this one checks the math. The objective is what backward differentiates: the micro-batch
// losses weighted by dloss, plus aux_loss_coef x dloss x the MoE load-balancing losses.
// Sequence parallelism runs with B = 3, T = 8: each rank's 12 rows start at a row that is not a
// multiple of T, so a position offset lost on one side (forward or backward) shows.
// A consistent error a finite difference cannot see: a softmax that sums over the padded
// vocabulary columns. The last case checks that padded logits change neither loss nor gradient.
// The Llama block (RMSNorm, SwiGLU, RoPE, grouped-query attention, untied head) runs the same
// cases, and a variant with biases on its fused q/k/v and gate/up projections and a tied head.
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
  int B = 2;          // sequences per micro-batch
  bool drop = false;  // MoE: a capacity that drops assignments
  int block = 0;      // 0: GPT-2; 1: Llama; 2: Llama with linear biases and a tied head
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

// The Llama block at the same scale: 4 query heads over 2 KV heads (tp 2 splits both), head size
// 4 (RoPE rotates pairs (0, 2) and (1, 3)), a base small enough that every position rotates.
GptConfig tiny_llama(int block) {
  GptConfig c = GptConfig::preset("llama-nano");
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 16;
  c.ffn = 24;
  c.vocab = 23;
  c.max_seq = 8;
  c.rope_theta = 100.0;
  if (block == 2) {
    c.bias = true;
    c.tied_embeddings = true;
  }
  return c;
}

GptConfig model_of(const Case& k) { return k.block == 0 ? tiny() : tiny_llama(k.block); }

ChunkMoe moe_config(const Case& k, Communicator* ep) {
  ChunkMoe moe;
  if (!k.moe) return moe;
  moe.every = 2;  // layer 1 is MoE
  moe.cfg.experts = 4;
  moe.cfg.top_k = 2;
  // Capacity is discrete, but the assignments kept stay put under steps of 1e-3 of a weight: with
  // 48 assignments for 4 experts of 6 slots (factor 0.5) half are dropped, every step alike.
  moe.cfg.drop_tokens = k.drop;
  moe.cfg.capacity_factor = 0.5;
  moe.cfg.aux_loss_coef = 0.05f;
  moe.ep = ep;
  return moe;
}

std::vector<double> host(Backend& be, const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  be.copy_to_host(v.data(), t, v.size() * sizeof(double));
  return v;
}

void set_elem(Backend& be, const Tensor& t, int64_t e, double x) { be.copy_from_host(t.slice(e, e + 1), &x, sizeof x); }

// The capacity really drops: the same weights without drops give another loss.
void require_drops(GptChunk& chunk, const Case& k, const ChunkMoe& moe, const std::vector<int32_t>& x,
                   const std::vector<int32_t>& y, int B, int T) {
  const GptConfig cfg = model_of(k);
  ParamStore store(chunk.backend());
  ChunkMoe all = moe;
  all.cfg.drop_tokens = false;
  GptChunk c2(cfg, {0, cfg.n_layer, true, true}, test::world(), store, k.rc, true, k.sp, all);
  store.finalize();
  c2.init_params(99);
  const double with_drops = chunk.forward(0, B, T, x, y, Tensor(), Tensor(), false);
  const double without = c2.forward(0, B, T, x, y, Tensor(), Tensor(), false);
  INFO("loss with drops " << with_drops << ", without " << without);
  REQUIRE(std::abs(with_drops - without) > 1e-6);
  chunk.take_aux_loss();
}

void check_case(const Case& k) {
  Communicator& tp = test::world();
  auto be = make_cpu_backend(DType::f64);
  ParamStore store(*be);
  auto ep = make_self_communicator("ep", tp.rank());
  const GptConfig cfg = model_of(k);
  const ChunkMoe moe = moe_config(k, ep.get());
  GptChunk chunk(cfg, {0, cfg.n_layer, true, true}, tp, store, k.rc, true, k.sp, moe);
  store.finalize();
  REQUIRE(store.dtype() == DType::f64);
  chunk.init_params(99);
  const int B = k.B, T = 8, M = 2;  // two micro-batches: gradients must accumulate
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
  if (k.drop) require_drops(chunk, k, moe, xs[0], ys[0], B, T);
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
  INFO(k.name << " (" << cfg.describe() << "): " << checked << " elements checked, worst error / tolerance " << worst << failures);
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
      check_case({"sequence parallel", rc, true, false, 3});
    }
}

TEST_CASE("gradcheck: MoE layers (router, experts, load-balancing loss)", "[gradcheck]") {
  for (Recompute rc : {Recompute::none, Recompute::full}) {
    INFO("recompute " << recompute_name(rc));
    check_case({"moe", rc, false, true});
  }
  // Capacity drops: a dropped assignment adds nothing, yet its router probability still shapes
  // the kept gates (top-2 renormalises over both choices), so its gradient is not zero.
  check_case({"moe with drops", Recompute::none, false, true, 3, true});
}

TEST_CASE("gradcheck: padded vocabulary columns contribute nothing to the loss or the gradient", "[gradcheck]") {
  Communicator& tp = test::world();
  auto be = make_cpu_backend(DType::f64);
  ParamStore store(*be);
  GptConfig cfg = tiny();
  cfg.vocab_pad_to = 16;  // 23 -> 32 rows: at tp 2, rank 1 holds 7 real rows and 9 padded ones
  GptChunk chunk(cfg, {0, cfg.n_layer, true, true}, tp, store, Recompute::none, true, false, {});
  store.finalize();
  chunk.init_params(99);
  REQUIRE(chunk.padded_vocab() > cfg.vocab);
  const int B = 2, T = 8, C = cfg.n_embd;
  std::mt19937 gen(11);
  std::uniform_int_distribution<int32_t> tok(0, cfg.vocab - 1);
  std::vector<int32_t> x(B * T), y(B * T);
  for (auto& t : x) t = tok(gen);
  for (auto& t : y) t = tok(gen);
  store.zero_grads();
  const double loss = chunk.forward(0, B, T, x, y, Tensor(), Tensor(), true, 1.0f);
  chunk.backward(0, Tensor(), Tensor(), false);
  size_t wte = store.size();
  for (size_t i = 0; i < store.size(); ++i)
    if (store.info(i).spec.name == "transformer.wte.weight") wte = i;
  REQUIRE(wte < store.size());
  // This rank's rows [v0, v1) of the padded table; rows from the vocabulary size on are padding.
  const int v0 = chunk.vocab_begin(), v1 = chunk.vocab_end(), pad0 = std::max(v0, cfg.vocab);
  const auto grad = host(*be, store.grad_t(wte));
  double pad_grad = 0, real_grad = 0;
  for (int r = v0; r < v1; ++r)
    for (int c = 0; c < C; ++c) {
      double& largest = r >= cfg.vocab ? pad_grad : real_grad;
      largest = std::max(largest, std::abs(grad[static_cast<size_t>(r - v0) * C + c]));
    }
  INFO("rows [" << v0 << ", " << v1 << ") of " << chunk.padded_vocab() << ", vocabulary " << cfg.vocab
                << ": largest gradient of a padded row " << pad_grad << ", of a real row " << real_grad);
  CHECK(pad_grad == 0.0);
  if (v0 < cfg.vocab) CHECK(real_grad > 0.0);
  // Padded rows of any value (so padded logits of order 1): the loss stays the same on every rank.
  if (pad0 < v1) {
    std::normal_distribution<double> nd(0.0, 1.0);
    std::vector<double> rows(static_cast<size_t>(v1 - pad0) * C);
    for (auto& v : rows) v = nd(gen);
    const Tensor p = store.param_t(wte);
    be->copy_from_host(p.slice(static_cast<int64_t>(pad0 - v0) * C, static_cast<int64_t>(v1 - v0) * C), rows.data(),
                       rows.size() * sizeof(double));
  }
  const double moved = chunk.forward(1, B, T, x, y, Tensor(), Tensor(), false);
  INFO("loss " << loss << ", with random padded rows " << moved);
  CHECK(std::abs(moved - loss) <= 1e-12 * std::abs(loss));
}

TEST_CASE("gradcheck: the Llama block (RMSNorm, SwiGLU, RoPE, GQA, untied head), each recompute mode", "[gradcheck]") {
  for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full}) {
    INFO("recompute " << recompute_name(rc));
    check_case({"llama", rc, false, false, 2, false, 1});
  }
  check_case({"llama with biases, tied head", Recompute::selective, false, false, 2, false, 2});
}

TEST_CASE("gradcheck: the Llama block under sequence parallelism", "[gradcheck]") {
  if (test::world().size() < 2) SUCCEED("sequence parallelism needs tp >= 2");
  else
    for (Recompute rc : {Recompute::none, Recompute::selective}) {
      INFO("recompute " << recompute_name(rc));
      check_case({"llama sequence parallel", rc, true, false, 3, false, 1});
    }
}

TEST_CASE("gradcheck: Llama MoE layers (SwiGLU experts, no biases)", "[gradcheck]") {
  check_case({"llama moe", Recompute::none, false, true, 2, false, 1});
  check_case({"llama moe with drops", Recompute::full, false, true, 3, true, 1});
}
