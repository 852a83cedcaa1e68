// Context parallelism's backward in float64 (the CPU backend built for float64): with the sequence
// split over cp 2 (np 2; np 4: tp 2 x cp 2, with and without sequence parallelism), the gradient
// of every parameter - summed over the CP ranks, divided by cp, as the dp x cp reduction does -
// equals the one-process gradient of the whole sequence to ~1e-10, and at np 2 equals central
// finite differences of the CP loss for a few elements of every tensor. GPT-2 (learned positions
// gathered and scattered at the zigzag rows' true positions) and Llama (RoPE at true positions,
// grouped-query attention), every recompute mode, p2p and allgather. The one-process run is
// independent of the ring: plain causal attention over the whole sequence.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cmath>
#include <random>

#include "support/multirank.h"
#include "triax/backend/backend.h"
#include "triax/distributed/grid.h"
#include "triax/model/gpt.h"
#include "triax/parallel/context_parallel.h"

using namespace triax;

namespace {

constexpr int kSeq = 16, kMicro = 2;

struct Case {
  const char* name;
  bool llama;
  Recompute rc;
  CpCommType comm;
  bool sp = false;
  int B = 2;
};

// test_gradcheck's scale: 2 layers, 16 wide, a vocabulary not divisible by tp; sequences of 16
// (chunks of 4 at cp 2). Llama: 4 query heads over 2 KV heads, every position rotating.
GptConfig model_of(const Case& k) {
  GptConfig c = GptConfig::preset(k.llama ? "llama-nano" : "nano");
  c.n_layer = 2;
  c.n_head = k.llama ? 4 : 2;
  if (k.llama) c.n_kv_head = 2;
  c.n_embd = 16;
  c.ffn = k.llama ? 24 : 32;
  c.vocab = 23;
  c.max_seq = kSeq;
  c.rope_theta = 100.0;
  return c;
}

// One chunk holding the whole model on a float64 CPU backend, with or without context parallelism.
struct Model {
  std::unique_ptr<Backend> be = make_cpu_backend(DType::f64);
  ParamStore store{*be};
  std::unique_ptr<ContextParallel> cp;
  std::unique_ptr<GptChunk> chunk;
  int T = kSeq;

  Model(const Case& k, Communicator& tp, Communicator* cp_group) {
    const GptConfig cfg = model_of(k);
    chunk = std::make_unique<GptChunk>(cfg, ChunkSpec{0, cfg.n_layer, true, true}, tp, store, k.rc, true, k.sp);
    if (cp_group) {
      cp = std::make_unique<ContextParallel>(*cp_group, *be, k.comm);
      chunk->set_context_parallel(cp.get());
      T = kSeq / cp->size();
    }
    store.finalize();
    REQUIRE(store.dtype() == DType::f64);
    chunk->init_params(99);
  }
  // This rank's rows of the micro-batch's whole sequences.
  std::vector<int32_t> rows(std::vector<int32_t> v, int B) const {
    if (cp) cp_slice_rows(cp->zigzag(kSeq), B, v);
    return v;
  }
  std::vector<double> host(const Tensor& t) const {
    std::vector<double> v(static_cast<size_t>(t.numel()));
    be->copy_to_host(v.data(), t, v.size() * sizeof(double));
    return v;
  }
};

struct Batch {
  std::vector<std::vector<int32_t>> x, y;  // kMicro micro-batches of B whole sequences
};

Batch make_batch(int B) {
  std::mt19937 gen(7);
  std::uniform_int_distribution<int32_t> tok(0, 22);
  Batch b;
  b.x.resize(kMicro);
  b.y.resize(kMicro);
  for (int m = 0; m < kMicro; ++m)
    for (int i = 0; i < B * kSeq; ++i) {
      b.x[m].push_back(tok(gen));
      b.y[m].push_back(tok(gen));
    }
  return b;
}

// Forward and backward of every micro-batch (dloss 1 / kMicro): this rank's gradient per parameter.
std::vector<std::vector<double>> gradients(Model& md, const Batch& b, int B) {
  md.store.zero_grads();
  const float dloss = 1.0f / kMicro;
  for (int m = 0; m < kMicro; ++m)
    md.chunk->forward(m, B, md.T, md.rows(b.x[m], B), md.rows(b.y[m], B), Tensor(), Tensor(), true, dloss);
  for (int m = kMicro; m-- > 0;) md.chunk->backward(m, Tensor(), Tensor(), false);
  std::vector<std::vector<double>> g;
  for (size_t i = 0; i < md.store.size(); ++i) g.push_back(md.host(md.store.grad_t(i)));
  return g;
}

// Summed over the CP group and divided by cp (the dp x cp mean of the optimizer's reduction).
void mean_over(Communicator& cp, std::vector<std::vector<double>>& g) {
  for (auto& v : g) {
    cp.all_reduce(std::span<double>(v), ReduceOp::sum).wait();
    for (double& x : v) x /= cp.size();
  }
}

// The CP loss: the mean over the CP ranks of each rank's loss (each the mean over as many tokens).
double objective(Model& md, Communicator& cp, const Batch& b, int B) {
  double J[1] = {0};
  for (int m = 0; m < kMicro; ++m)
    J[0] += md.chunk->forward(100 + m, B, md.T, md.rows(b.x[m], B), md.rows(b.y[m], B), Tensor(), Tensor(), false) / kMicro;
  cp.all_reduce(std::span<double>(J), ReduceOp::sum).wait();
  return J[0] / cp.size();
}

double norm(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

void check_against_one_process(const Case& k, Model& md, const std::vector<std::vector<double>>& got,
                               Communicator& tp, const Batch& b) {
  Model ref(k, tp, nullptr);
  const auto want = gradients(ref, b, k.B);
  REQUIRE(want.size() == got.size());
  int nonzero = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const std::string& name = md.store.info(i).spec.name;
    REQUIRE(ref.store.info(i).spec.name == name);
    REQUIRE(got[i].size() == want[i].size());
    std::vector<double> d(got[i].size());
    for (size_t e = 0; e < d.size(); ++e) d[e] = got[i][e] - want[i][e];
    INFO(k.name << ": " << name << " |grad| " << norm(want[i]) << " |cp - one process| " << norm(d));
    CHECK(norm(d) <= 1e-10 * norm(want[i]) + 1e-15);
    nonzero += norm(want[i]) > 1e-8;
  }
  CHECK(nonzero >= static_cast<int>(got.size()) - 2);  // (a key bias may be ~0: softmax's shift invariance)
}

void check_finite_differences(const Case& k, Model& md, const std::vector<std::vector<double>>& grad,
                              Communicator& cp, const Batch& b) {
  std::mt19937 pick(1234);  // the same elements on every rank: the replicas stay equal
  int checked = 0, failed = 0;
  for (size_t i = 0; i < md.store.size(); ++i) {
    const Tensor p = md.store.param_t(i);
    const auto vals = md.host(p);
    for (int s = 0; s < 3; ++s) {
      const auto e = static_cast<int64_t>(pick() % vals.size());
      const double h = 1e-3 * std::max(0.02, std::abs(vals[e]));
      auto set = [&](double x) { md.be->copy_from_host(p.slice(e, e + 1), &x, sizeof x); };
      set(vals[e] + h);
      const double jp = objective(md, cp, b, k.B);
      set(vals[e] - h);
      const double jm = objective(md, cp, b, k.B);
      set(vals[e]);
      const double fd = (jp - jm) / (2 * h), an = grad[i][static_cast<size_t>(e)];
      const bool ok = std::abs(fd - an) <= 1e-8 + 1e-5 * std::abs(an);
      if (!ok) UNSCOPED_INFO(k.name << ": " << md.store.info(i).spec.name << "[" << e << "] analytic " << an << " fd " << fd);
      ++checked;
      failed += !ok;
    }
  }
  CHECK(checked == 3 * static_cast<int>(md.store.size()));
  CHECK(failed == 0);
}

void check_case(const Case& k) {
  const int W = test::world().size(), tp_size = W / 2;
  ProcessGrid grid(test::world_ptr(), GridShape{tp_size, 1, 1, 1, "tp-cp-dp-pp", 2});
  INFO(k.name << " recompute " << recompute_name(k.rc) << " " << cp_comm_type_name(k.comm) << " tp " << tp_size
              << " sp " << k.sp);
  const Batch b = make_batch(k.B);
  Model md(k, grid.tp(), &grid.cp());
  REQUIRE(md.T == kSeq / 2);
  auto g = gradients(md, b, k.B);
  mean_over(grid.cp(), g);
  check_against_one_process(k, md, g, grid.tp(), b);
  if (tp_size == 1) check_finite_differences(k, md, g, grid.cp(), b);
}

}  // namespace

TEST_CASE("cp gradcheck: GPT-2 (learned positions), each recompute mode, both exchanges", "[gradcheck][cp]") {
  check_case({"gpt2", false, Recompute::none, CpCommType::p2p});
  check_case({"gpt2", false, Recompute::selective, CpCommType::allgather});
  check_case({"gpt2", false, Recompute::full, CpCommType::p2p});
}

TEST_CASE("cp gradcheck: Llama (RoPE, GQA), each recompute mode, both exchanges", "[gradcheck][cp]") {
  check_case({"llama", true, Recompute::none, CpCommType::allgather});
  check_case({"llama", true, Recompute::selective, CpCommType::p2p});
  check_case({"llama", true, Recompute::full, CpCommType::allgather});
}

TEST_CASE("cp gradcheck: tp 2 x cp 2 under sequence parallelism", "[gradcheck][cp]") {
  if (test::world().size() < 4) {
    SUCCEED("tp 2 x cp 2 needs 4 ranks");
    return;
  }
  check_case({"gpt2 sp", false, Recompute::none, CpCommType::p2p, true, 3});
  check_case({"llama sp", true, Recompute::selective, CpCommType::allgather, true, 3});
}
