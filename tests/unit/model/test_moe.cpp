// MoE on one process: routing and capacity against hand-computed cases, the aux loss against its
// formula, the whole block (ep = 1) against a direct double-precision reference, its gradients
// against finite differences of that reference, on a float64 backend against central differences
// of its own forward, chunk-count invariance, and every bad input; for GPT-2 experts (GELU,
// biases) and Mixtral's (SwiGLU, no biases, HF names).
#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "triax/distributed/comm/self_comm.h"
#include "triax/model/moe.h"
#include "triax/model/param_shards.h"
#include "unit/ops_testing.h"

using namespace triax;
using namespace triax::test;
using Catch::Matchers::Contains;

namespace {

// ---- a direct double-precision MoE (loops, no communication): the obviously-correct reference
struct RefExpert {
  // GELU: c_fc (fcw, fcb), c_proj (pw, pb). SwiGLU: gate (fcw, fcb), up (uw, ub), down (pw, pb).
  std::vector<double> fcw, fcb, uw, ub, pw, pb;  // (F, C), (F), (F, C), (F), (C, F), (C); biases 0 without
};
struct RefModel {
  int C = 0, F = 0, E = 0, k = 1;
  bool swiglu = false, bias = true;
  std::vector<double> wr;  // (E, C)
  std::vector<RefExpert> ex;
};

// The expert's tensors in MoeMlp's registration order (moe.h): GELU c_fc.weight, c_fc.bias,
// c_proj.weight, c_proj.bias; SwiGLU gate.weight, up.weight, gate.bias, up.bias, down.weight,
// down.bias; the biases only with bias.
std::vector<std::vector<double>*> expert_parts(RefExpert& X, bool swiglu, bool bias) {
  std::vector<std::vector<double>*> p = {&X.fcw};
  if (swiglu) p.push_back(&X.uw);
  if (bias) {
    p.push_back(&X.fcb);
    if (swiglu) p.push_back(&X.ub);
  }
  p.push_back(&X.pw);
  if (bias) p.push_back(&X.pb);
  return p;
}
struct RefOut {
  std::vector<double> y;  // (N, C)
  double aux = 0;
  std::vector<int> expert, kept;  // (N, k)
  double margin = 1;              // smallest probability gap at a top-k decision
};

double gelu(double x) { return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }
double silu(double x) { return x / (1.0 + std::exp(-x)); }

RefOut ref_moe(const RefModel& m, const std::vector<double>& x, int N, int64_t capacity) {
  const int C = m.C, F = m.F, E = m.E, k = m.k;
  RefOut r;
  r.y.assign(static_cast<size_t>(N) * C, 0.0);
  r.expert.resize(static_cast<size_t>(N) * k);
  r.kept.assign(static_cast<size_t>(N) * k, 0);
  std::vector<double> probs(static_cast<size_t>(N) * E), gate(static_cast<size_t>(N) * k);
  std::vector<int64_t> load(E, 0);
  for (int n = 0; n < N; ++n) {
    std::vector<double> l(E);
    double mx = -1e300;
    for (int e = 0; e < E; ++e) {
      for (int c = 0; c < C; ++c) l[e] += m.wr[e * C + c] * x[n * C + c];
      mx = std::max(mx, l[e]);
    }
    double s = 0;
    for (int e = 0; e < E; ++e) s += std::exp(l[e] - mx);
    double* p = &probs[static_cast<size_t>(n) * E];
    for (int e = 0; e < E; ++e) p[e] = std::exp(l[e] - mx) / s;
    std::vector<int> order(E);
    for (int e = 0; e < E; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    for (int j = 0; j < k; ++j) r.expert[n * k + j] = order[j], ++load[order[j]];
    for (int j = 0; j + 1 < E && j < k; ++j) r.margin = std::min(r.margin, p[order[j]] - p[order[j + 1]]);
    double S = 0;
    for (int j = 0; j < k; ++j) S += p[order[j]];
    for (int j = 0; j < k; ++j) gate[n * k + j] = k == 1 ? p[order[0]] : p[order[j]] / S;
  }
  int64_t cap = capacity;
  if (cap < 0) cap = *std::max_element(load.begin(), load.end());
  std::vector<int64_t> fill(E, 0);
  for (int j = 0; j < k; ++j)
    for (int n = 0; n < N; ++n) {
      const int e = r.expert[n * k + j];
      if (fill[e] < cap) ++fill[e], r.kept[n * k + j] = 1;
    }
  for (int n = 0; n < N; ++n)
    for (int j = 0; j < k; ++j) {
      if (!r.kept[n * k + j]) continue;
      const RefExpert& X = m.ex[r.expert[n * k + j]];
      std::vector<double> a(F);
      for (int f = 0; f < F; ++f) {
        double h = X.fcb[f], u = X.ub[f];
        for (int c = 0; c < C; ++c) h += X.fcw[f * C + c] * x[n * C + c];
        for (int c = 0; c < C && m.swiglu; ++c) u += X.uw[f * C + c] * x[n * C + c];
        a[f] = m.swiglu ? silu(h) * u : gelu(h);
      }
      for (int c = 0; c < C; ++c) {
        double o = X.pb[c];
        for (int f = 0; f < F; ++f) o += X.pw[c * F + f] * a[f];
        r.y[n * C + c] += gate[n * k + j] * o;
      }
    }
  for (int e = 0; e < E; ++e) {
    double P = 0;
    for (int n = 0; n < N; ++n) P += probs[static_cast<size_t>(n) * E + e];
    r.aux += static_cast<double>(load[e]) / (static_cast<double>(N) * k) * (P / N);
  }
  r.aux *= E;
  return r;
}

// Fills every parameter of the store from (seed, name) with large enough values that routing is
// decisive and biases are non-zero (init_params would leave them 0 and hide a bias bug).
void fill_params(ParamStore& store, uint64_t seed) {
  for (size_t i = 0; i < store.size(); ++i) {
    const auto& name = store.info(i).spec.name;
    const float std = name.find("router") != std::string::npos ? 1.0f : 0.5f;
    const auto v = init_normal(seed, name, store.info(i).numel, std);
    std::copy(v.begin(), v.end(), store.param(i).begin());
  }
}

std::vector<double> to_double(std::span<const float> s) { return std::vector<double>(s.begin(), s.end()); }

RefModel ref_of(ParamStore& store, const MoeMlp& moe, int C, int F) {
  RefModel m;
  m.C = C;
  m.F = F;
  m.E = moe.config().experts;
  m.k = moe.config().top_k;
  m.swiglu = moe.config().swiglu;
  m.bias = moe.config().bias;
  const auto& idx = moe.param_indices();
  m.wr = to_double(store.param(idx[0]));
  const size_t per = (idx.size() - 1) / static_cast<size_t>(m.E);
  for (int e = 0; e < m.E; ++e) {
    RefExpert X;
    X.fcb.assign(F, 0.0);
    X.ub.assign(F, 0.0);
    X.pb.assign(C, 0.0);
    const auto parts = expert_parts(X, m.swiglu, m.bias);
    REQUIRE(parts.size() == per);
    for (size_t j = 0; j < per; ++j) *parts[j] = to_double(store.param(idx[1 + per * e + j]));
    m.ex.push_back(std::move(X));
  }
  return m;
}

// The expert variants under test: GPT-2's, Mixtral's with HF names, and SwiGLU with biases.
struct Kind {
  bool swiglu, bias, hf_names;
  const char* what;
};
constexpr Kind kGelu{false, true, false, "GELU + bias"};
constexpr Kind kMixtral{true, false, true, "SwiGLU, no bias, HF names"};
constexpr Kind kSwigluBias{true, true, false, "SwiGLU + bias"};
constexpr Kind kGeluNoBiasHf{false, false, true, "GELU, no bias, HF names"};

MoeConfig with_kind(MoeConfig cfg, const Kind& kind) {
  cfg.swiglu = kind.swiglu;
  cfg.bias = kind.bias;
  cfg.hf_names = kind.hf_names;
  return cfg;
}

// ||got - want|| / ||want||: the chunk-count comparisons (a GEMM over M rows may round a row
// differently from one over M' rows, so element-wise bits can move by an ulp of the tensor's scale).
double rel_err(std::span<const float> got, std::span<const float> want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

std::vector<float> random_floats(size_t n, double lo = -1, double hi = 1) { return cast<float>(random_vec(n, lo, hi)); }

}  // namespace

TEST_CASE("expert capacity is ceil(cf * N * k / E)", "[moe]") {
  CHECK(expert_capacity(16, 4, 2, 1.25) == 10);   // exactly 10
  CHECK(expert_capacity(16, 4, 1, 1.0) == 4);
  CHECK(expert_capacity(17, 4, 1, 1.0) == 5);     // 4.25 -> 5
  CHECK(expert_capacity(10, 11, 1, 1.1) == 1);    // 1.1 * 10 / 11 = 1 (binary 1.1 is a hair above)
  CHECK(expert_capacity(7, 8, 1, 1.0) == 1);      // 0.875 -> 1
  CHECK(expert_capacity(0, 8, 2, 1.0) == 0);
  CHECK(expert_capacity(100, 8, 2, 0.5) == 13);   // 12.5 -> 13
  CHECK_THROWS_WITH(expert_capacity(8, 4, 1, 0.0), Contains("capacity factor"));
  CHECK_THROWS_WITH(expert_capacity(8, 4, 1, NAN), Contains("capacity factor"));
  CHECK_THROWS_WITH(expert_capacity(-1, 4, 1, 1.0), Contains("N >= 0"));
}

TEST_CASE("routing: softmax, top-1, raw gate, ties to the lower expert, token-order capacity", "[moe]") {
  // 4 tokens, 3 experts.
  const std::vector<float> logits = {
      2.0f, 0.0f, 1.0f,   // -> e0
      0.5f, 0.5f, 0.0f,   // tie e0/e1 -> e0
      0.0f, 3.0f, 0.0f,   // -> e1
      1.0f, -1.0f, 0.0f,  // -> e0 (third for e0: dropped at capacity 2)
  };
  const Routing R = route_tokens(logits.data(), 4, 3, 1, 2);
  REQUIRE(R.expert == std::vector<int32_t>{0, 0, 1, 0});
  for (int n = 0; n < 4; ++n) {
    double s = 0;
    for (int e = 0; e < 3; ++e) s += std::exp(double(logits[n * 3 + e]));
    for (int e = 0; e < 3; ++e) CHECK(R.probs[n * 3 + e] == Approx(std::exp(double(logits[n * 3 + e])) / s).epsilon(1e-6));
    CHECK(R.gate[n] == R.probs[n * 3 + R.expert[n]]);  // Switch: the raw probability
  }
  CHECK(R.load == std::vector<int64_t>{3, 1, 0});
  CHECK(R.capacity == 2);
  CHECK(R.slot == std::vector<int32_t>{0, 1, 0, -1});
  CHECK(R.dropped == 1);
  CHECK(!R.kept(3, 0));
  // aux = E * sum_e f_e P_e with f from the pre-capacity assignment.
  double aux = 0;
  for (int e = 0; e < 3; ++e) {
    double P = 0;
    for (int n = 0; n < 4; ++n) P += R.probs[n * 3 + e];
    aux += R.load[e] / 4.0 * P / 4.0;
  }
  CHECK(R.aux_loss == Approx(3 * aux).epsilon(1e-6));
  // No-drop: capacity = largest load.
  const Routing Q = route_tokens(logits.data(), 4, 3, 1, -1);
  CHECK(Q.capacity == 3);
  CHECK(Q.dropped == 0);
  CHECK(Q.slot == std::vector<int32_t>{0, 1, 0, 2});
}

TEST_CASE("routing: top-2 renormalised gates, first choices before second choices", "[moe]") {
  // Token 0 prefers e1 then e0; token 1 prefers e0 then e1. Capacity 1: both first choices fit,
  // both second choices are dropped (token order alone would give token 0 both experts).
  const std::vector<float> logits = {0.0f, 1.0f, -2.0f, 1.5f, 0.5f, -1.0f};
  const Routing R = route_tokens(logits.data(), 2, 3, 2, 1);
  REQUIRE(R.expert == std::vector<int32_t>{1, 0, 0, 1});
  CHECK(R.slot == std::vector<int32_t>{0, -1, 0, -1});
  CHECK(R.dropped == 2);
  for (int n = 0; n < 2; ++n) {
    const double* p = &R.probs[n * 3];
    CHECK(R.gate[n * 2] + R.gate[n * 2 + 1] == Approx(1.0f).epsilon(1e-6));
    CHECK(R.gate[n * 2] == Approx(p[R.expert[n * 2]] / (p[R.expert[n * 2]] + p[R.expert[n * 2 + 1]])).epsilon(1e-6));
  }
  // f_e counts all k assignments / k.
  CHECK(R.load == std::vector<int64_t>{2, 2, 0});
  double aux = 0;
  for (int e = 0; e < 3; ++e) aux += R.load[e] / 4.0 * (R.probs[e] + R.probs[3 + e]) / 2.0;
  CHECK(R.aux_loss == Approx(3 * aux).epsilon(1e-6));
}

TEST_CASE("aux loss is 1 for perfectly balanced routing and E for collapsed routing", "[moe]") {
  // 4 tokens, 4 experts, token n strongly prefers expert n: f_e = 1/4, P_e = 1/4 by symmetry.
  std::vector<float> logits(16, 0.0f);
  for (int n = 0; n < 4; ++n) logits[n * 4 + n] = 3.0f;
  CHECK(route_tokens(logits.data(), 4, 4, 1, -1).aux_loss == Approx(1.0f).epsilon(1e-6));
  // Every token on expert 0 with probability ~1: aux -> E * 1 * 1.
  std::vector<float> col(16, -50.0f);
  for (int n = 0; n < 4; ++n) col[n * 4] = 50.0f;
  CHECK(route_tokens(col.data(), 4, 4, 1, -1).aux_loss == Approx(4.0f).epsilon(1e-6));
}

TEST_CASE("routing rejects bad arguments", "[moe]") {
  const std::vector<float> l = {0, 1, 2, 3};
  CHECK_THROWS_WITH(route_tokens(l.data(), 2, 2, 3, 1), Contains("k <= E"));
  CHECK_THROWS_WITH(route_tokens(l.data(), -1, 2, 1, 1), Contains("N >= 0"));
  CHECK_THROWS_WITH(route_tokens(static_cast<const float*>(nullptr), 2, 2, 1, 1), Contains("null logits"));
  const std::vector<float> bad = {0, NAN};
  CHECK_THROWS_WITH(route_tokens(bad.data(), 1, 2, 1, 1), Contains("non-finite"));
}

TEST_CASE("MoE config validation names the field", "[moe]") {
  MoeConfig c;
  CHECK_NOTHROW(c.validate(4));
  CHECK_THROWS_WITH(c.validate(3), Contains("8 experts cannot be split"));
  c.top_k = 3;
  CHECK_THROWS_WITH(c.validate(1), Contains("top_k = 3"));
  c = MoeConfig{};
  c.experts = 1;
  CHECK_THROWS_WITH(c.validate(1), Contains("exceeds"));
  c = MoeConfig{};
  c.capacity_factor = 0;
  CHECK_THROWS_WITH(c.validate(1), Contains("capacity_factor"));
  c.drop_tokens = false;  // ignored in no-drop mode
  CHECK_NOTHROW(c.validate(1));
  c = MoeConfig{};
  c.aux_loss_coef = -1;
  CHECK_THROWS_WITH(c.validate(1), Contains("aux_loss_coef"));
  c = MoeConfig{};
  c.chunks = 0;
  CHECK_THROWS_WITH(c.validate(1), Contains("chunks"));
  CHECK_THROWS_WITH(c.validate(0), Contains("expert-parallel size"));
}

TEST_CASE("MoE parameters: names, shapes, expert flag, init independent of the store", "[moe]") {
  auto self = make_self_communicator("ep", 0);
  ParamStore store;
  MoeConfig cfg;
  cfg.experts = 4;
  MoeMlp moe(cfg, 3, 8, 32, *self, store, false);
  store.finalize();
  moe.init_params(7, 12);
  REQUIRE(store.size() == 1 + 4 * 4);
  const auto& r = store.info(store.find("transformer.h.3.moe.router.weight"));
  CHECK(r.spec.full_shape == std::vector<int64_t>{4, 8});
  CHECK(!r.spec.expert);
  CHECK(!r.spec.norm_owner);
  const auto& w = store.info(store.find("transformer.h.3.moe.experts.2.c_fc.weight"));
  CHECK(w.spec.full_shape == std::vector<int64_t>{32, 8});
  CHECK(w.spec.expert);
  CHECK(w.spec.weight_decay);
  CHECK(!store.info(store.find("transformer.h.3.moe.experts.3.c_proj.bias")).spec.weight_decay);
  // Values are a function of (seed, name) only.
  const auto v = init_normal(7, w.spec.name, w.numel, 0.02f);
  const auto got = store.param(store.find(w.spec.name));
  CHECK(std::equal(v.begin(), v.end(), got.begin()));
  const auto pv = init_normal(7, "transformer.h.3.moe.experts.1.c_proj.weight", 8 * 32, 0.02f / std::sqrt(24.0f));
  const auto pg = store.param(store.find("transformer.h.3.moe.experts.1.c_proj.weight"));
  CHECK(std::equal(pv.begin(), pv.end(), pg.begin()));
  for (float b : store.param(store.find("transformer.h.3.moe.experts.0.c_fc.bias"))) CHECK(b == 0.0f);
}

TEST_CASE("MoE parameters of Mixtral's experts: HF names, gate and up adjacent, no biases", "[moe]") {
  auto self = make_self_communicator("ep", 0);
  ParamStore store;
  MoeConfig cfg = with_kind(MoeConfig{}, kMixtral);
  cfg.experts = 4;
  MoeMlp moe(cfg, 3, 8, 32, *self, store);
  store.finalize();
  moe.init_params(7, 12);
  REQUIRE(store.size() == 1 + 3 * 4);  // router, then w1, w3, w2 per expert
  CHECK(moe.param_indices().size() == store.size());
  const std::string p = "model.layers.3.block_sparse_moe.";
  const auto& r = store.info(store.find(p + "gate.weight"));
  CHECK(r.spec.full_shape == std::vector<int64_t>{4, 8});
  CHECK(!r.spec.expert);
  CHECK(moe.router_param() == store.find(p + "gate.weight"));
  for (int e = 0; e < 4; ++e) {
    INFO("expert " << e);
    const std::string q = p + "experts." + std::to_string(e) + ".";
    const auto& w1 = store.info(store.find(q + "w1.weight"));
    const auto& w3 = store.info(store.find(q + "w3.weight"));
    const auto& w2 = store.info(store.find(q + "w2.weight"));
    CHECK(w1.spec.full_shape == std::vector<int64_t>{32, 8});
    CHECK(w3.spec.full_shape == std::vector<int64_t>{32, 8});
    CHECK(w2.spec.full_shape == std::vector<int64_t>{8, 32});
    CHECK(w3.offset == w1.offset + w1.numel);  // one GEMM over [gate | up]
    for (const auto* w : {&w1, &w3, &w2}) {
      CHECK(w->spec.expert);
      CHECK(w->spec.weight_decay);
      CHECK(w->spec.split == TpSplit::none);
    }
    // Gate and up N(0, 0.02), down N(0, 0.02 / sqrt(2 n_layer)), from (seed, name).
    for (const auto& [name, sd] : {std::pair{q + "w1.weight", 0.02f}, std::pair{q + "w3.weight", 0.02f},
                                   std::pair{q + "w2.weight", 0.02f / std::sqrt(24.0f)}}) {
      const auto want = init_normal(7, name, 32 * 8, sd);
      const auto got = store.param(store.find(name));
      CHECK(std::equal(want.begin(), want.end(), got.begin()));
    }
  }
  for (const auto& info : store.infos()) {
    CHECK(!info.spec.name.ends_with(".bias"));
    CHECK(info.spec.name.starts_with(p));
  }
  // SwiGLU with biases and triax's own names: gate_proj, up_proj (and their biases) adjacent.
  ParamStore s2;
  MoeMlp m2(with_kind(cfg, kSwigluBias), 1, 8, 32, *self, s2);
  s2.finalize();
  REQUIRE(s2.size() == 1 + 6 * 4);
  const std::string q = "transformer.h.1.moe.experts.2.";
  const std::vector<std::string> order = {"gate_proj.weight", "up_proj.weight", "gate_proj.bias",
                                          "up_proj.bias",     "down_proj.weight", "down_proj.bias"};
  for (size_t j = 0; j + 1 < order.size(); ++j) {
    const auto& a = s2.info(s2.find(q + order[j]));
    CHECK(s2.info(s2.find(q + order[j + 1])).offset == a.offset + a.numel);
  }
  CHECK(!s2.info(s2.find(q + "up_proj.bias")).spec.weight_decay);
  // GELU without biases under HF names: w1, w2 only.
  ParamStore s3;
  MoeMlp m3(with_kind(cfg, kGeluNoBiasHf), 0, 8, 32, *self, s3);
  s3.finalize();
  REQUIRE(s3.size() == 1 + 2 * 4);
  CHECK(s3.info(s3.find("model.layers.0.block_sparse_moe.experts.1.w2.weight")).spec.full_shape ==
        std::vector<int64_t>{8, 32});
  CHECK_THROWS_WITH(s3.find("model.layers.0.block_sparse_moe.experts.1.w3.weight"), Contains("w3"));
}

namespace {
// The block (ep = 1) against ref_moe and its gradients against finite differences of it, for k = 1,
// 2, drop and no-drop.
void check_against_reference(const Kind& kind) {
  INFO(kind.what);
  const int C = 4, F = 8, E = 4, N = 9;
  for (int k : {1, 2})
    for (bool drop : {true, false}) {
      INFO("k " << k << " drop " << drop);
      auto self = make_self_communicator("ep", 0);
      ParamStore store;
      MoeConfig cfg = with_kind(MoeConfig{}, kind);
      cfg.experts = E;
      cfg.top_k = k;
      cfg.capacity_factor = 0.8;  // E * capacity < N * k: some assignments always drop
      cfg.drop_tokens = drop;
      cfg.aux_loss_coef = 0.3f;   // large, so a wrong aux gradient shows
      MoeMlp moe(cfg, 0, C, F, *self, store);
      store.finalize();
      // Resample until every top-k decision has a clear margin (finite differences must not flip
      // a routing decision).
      RefModel m;
      std::vector<float> x;
      RefOut ref;
      for (int attempt = 0;; ++attempt) {
        REQUIRE(attempt < 50);
        fill_params(store, static_cast<uint64_t>(rng()()));
        m = ref_of(store, moe, C, F);
        x = random_floats(static_cast<size_t>(N) * C);
        ref = ref_moe(m, to_double(x), N, drop ? expert_capacity(N, E, k, 0.8) : -1);
        if (ref.margin > 1e-3) break;
      }
      const auto w = random_vec(static_cast<size_t>(N) * C);  // loss = sum w . y + coef * aux
      std::vector<float> y(static_cast<size_t>(N) * C), dx(y.size());
      const float aux = moe.forward(0, N, x.data(), y.data(), true);
      const Routing& R = moe.last_routing();
      CHECK(R.expert == std::vector<int32_t>(ref.expert.begin(), ref.expert.end()));
      for (size_t a = 0; a < ref.kept.size(); ++a) CHECK((R.slot[a] >= 0) == (ref.kept[a] == 1));
      if (drop) CHECK(R.dropped > 0);
      else CHECK(R.dropped == 0);
      require_close(y, ref.y, 1e-5, 1e-6 * max_abs(ref.y), "y");
      CHECK(aux == Approx(ref.aux).epsilon(1e-6));
      const auto wf = cast<float>(w);
      moe.backward(0, wf.data(), dx.data(), 1.0f);

      // Finite differences of the double reference (analytic grads are float).
      const double coef = cfg.aux_loss_coef;
      auto loss = [&](const RefModel& mm, const std::vector<double>& xx) {
        const RefOut o = ref_moe(mm, xx, N, drop ? expert_capacity(N, E, k, 0.8) : -1);
        return dot(w, o.y) + coef * o.aux;
      };
      auto fd = [&](std::vector<double>& v, const std::function<double()>& f) {
        std::vector<double> g(v.size());
        const double h = 1e-6;
        for (size_t i = 0; i < v.size(); ++i) {
          const double keep = v[i];
          v[i] = keep + h;
          const double up = f();
          v[i] = keep - h;
          const double dn = f();
          v[i] = keep;
          g[i] = (up - dn) / (2 * h);
        }
        return g;
      };
      std::vector<double> xd = to_double(x);
      const auto gx = fd(xd, [&] { return loss(m, xd); });
      REQUIRE(max_abs(gx) > 1e-3);
      require_close(dx, gx, 1e-4, 2e-5 * max_abs(gx), "dx");
      const auto& idx = moe.param_indices();
      {
        const auto g = fd(m.wr, [&] { return loss(m, xd); });
        REQUIRE(max_abs(g) > 1e-4);
        const auto s = store.grad(idx[0]);
        require_close(std::vector<float>(s.begin(), s.end()), g, 1e-4, 2e-5 * max_abs(g), "router");
      }
      for (int e = 0; e < E; ++e) {
        const auto parts = expert_parts(m.ex[e], kind.swiglu, kind.bias);
        const size_t per = parts.size();
        REQUIRE(idx.size() == 1 + per * E);
        for (size_t p = 0; p < per; ++p) {
          const auto g = fd(*parts[p], [&] { return loss(m, xd); });
          const auto s = store.grad(idx[1 + per * e + p]);
          require_close(std::vector<float>(s.begin(), s.end()), g, 1e-4, 2e-5 * std::max(1e-3, max_abs(g)),
                        store.info(idx[1 + per * e + p]).spec.name);
        }
      }
    }
}

}  // namespace

TEST_CASE("MoE block equals the double reference; gradients equal finite differences", "[moe]") {
  check_against_reference(kGelu);
}

TEST_CASE("SwiGLU experts (Mixtral) equal the double reference; gradients equal finite differences", "[moe]") {
  check_against_reference(kMixtral);
  check_against_reference(kSwigluBias);
  check_against_reference(kGeluNoBiasHf);
}

namespace {
// Host <-> backend copies of whole float64 buffers.
std::vector<double> host_f64(Backend& be, const Tensor& t, size_t n) {
  std::vector<double> v(n);
  be.copy_to_host(v.data(), t, n * sizeof(double));
  return v;
}
Tensor device_f64(Backend& be, const std::vector<double>& v) {
  Tensor t = be.empty(Shape{static_cast<int64_t>(v.size())}, DType::f64);
  be.copy_from_host(t, v.data(), v.size() * sizeof(double));
  return t;
}
// The smallest gap between consecutive probabilities among each token's k + 1 largest: a
// perturbation below it cannot change which experts a token picks nor their order.
double routing_margin(const Routing& R) {
  double m = 1;
  for (int n = 0; n < R.N; ++n) {
    std::vector<double> p(R.probs.begin() + static_cast<ptrdiff_t>(n) * R.E, R.probs.begin() + static_cast<ptrdiff_t>(n + 1) * R.E);
    std::sort(p.rbegin(), p.rend());
    for (int j = 0; j < R.k && j + 1 < R.E; ++j) m = std::min(m, p[j] - p[j + 1]);
  }
  return m;
}
}  // namespace

TEST_CASE("float64 backend: MoE gradients equal central differences of its own forward", "[moe]") {
  const int C = 4, F = 6, E = 4, N = 9;
  for (const Kind& kind : {kMixtral, kSwigluBias, kGelu})
    for (int k : {1, 2}) {
      INFO(kind.what << " k " << k);
      auto be = make_cpu_backend(DType::f64);
      auto self = make_self_communicator("ep", 0);
      ParamStore store(*be);
      MoeConfig cfg = with_kind(MoeConfig{}, kind);
      cfg.experts = E;
      cfg.top_k = k;
      cfg.capacity_factor = 0.8;  // drops assignments
      cfg.aux_loss_coef = 0.3f;
      MoeMlp moe(cfg, 0, C, F, *self, store);
      store.finalize();
      REQUIRE(store.dtype() == DType::f64);
      REQUIRE(!store.has_compute_copy());  // params_t() is what forward reads
      const size_t P = store.numel(), NC = static_cast<size_t>(N) * C;
      std::vector<double> theta(store.padded_numel(), 0.0), x;
      const auto w = random_vec(NC);  // loss = w . y + coef * aux
      Tensor yt = be->empty(Shape{static_cast<int64_t>(NC)}, DType::f64);
      auto loss = [&](const std::vector<double>& th, const std::vector<double>& xx) {
        be->copy_from_host(store.params_t(), th.data(), th.size() * sizeof(double));
        const double aux = moe.forward(0, N, device_f64(*be, xx), yt, false);
        return dot(w, host_f64(*be, yt, NC)) + static_cast<double>(cfg.aux_loss_coef) * aux;
      };
      for (int attempt = 0;; ++attempt) {
        REQUIRE(attempt < 50);
        const uint64_t seed = rng()();
        for (size_t i = 0; i < store.size(); ++i) {
          const auto& info = store.info(i);
          const float sd = info.spec.name == store.info(moe.router_param()).spec.name ? 1.0f : 0.5f;
          const auto v = init_normal(seed, info.spec.name, info.numel, sd);
          std::copy(v.begin(), v.end(), theta.begin() + static_cast<ptrdiff_t>(info.offset));
        }
        x = random_vec(NC);
        loss(theta, x);
        if (routing_margin(moe.last_routing()) > 1e-4) break;
      }
      REQUIRE(moe.last_routing().dropped > 0);
      // Analytic gradients.
      be->copy_from_host(store.params_t(), theta.data(), theta.size() * sizeof(double));
      store.zero_grads();
      moe.forward(0, N, device_f64(*be, x), yt, true);
      Tensor dxt = be->empty(Shape{static_cast<int64_t>(NC)}, DType::f64);
      moe.backward(0, device_f64(*be, w), dxt, 1.0f);
      const auto dx = host_f64(*be, dxt, NC);
      const auto g = host_f64(*be, store.grads_t(), P);
      // Central differences in float64 (h 1e-5: truncation ~1e-10, rounding ~1e-11).
      const double h = 1e-5;
      auto fd = [&](std::vector<double>& v, size_t i) {
        const double keep = v[i];
        v[i] = keep + h;
        const double up = loss(theta, x);
        v[i] = keep - h;
        const double dn = loss(theta, x);
        v[i] = keep;
        return (up - dn) / (2 * h);
      };
      std::vector<double> gx(NC), gp(P);
      for (size_t i = 0; i < NC; ++i) gx[i] = fd(x, i);
      for (size_t i = 0; i < P; ++i) gp[i] = fd(theta, i);
      REQUIRE(max_abs(gx) > 1e-3);
      require_close(dx, gx, 1e-6, 1e-8 * max_abs(gx), "dx");
      for (size_t i = 0; i < store.size(); ++i) {
        const auto& info = store.info(i);
        const std::vector<double> got(g.begin() + static_cast<ptrdiff_t>(info.offset),
                                      g.begin() + static_cast<ptrdiff_t>(info.offset + info.numel));
        const std::vector<double> want(gp.begin() + static_cast<ptrdiff_t>(info.offset),
                                       gp.begin() + static_cast<ptrdiff_t>(info.offset + info.numel));
        require_close(got, want, 1e-6, 1e-8 * std::max(1e-3, max_abs(gp)), info.spec.name);
      }
    }
}

TEST_CASE("chunk count does not change the results", "[moe]") {
  const int C = 16, F = 40, E = 4, N = 37;
  for (const Kind& kind : {kGelu, kMixtral}) {
    for (int k : {1, 2}) {
      INFO(kind.what << " k " << k);
      const auto x = random_floats(static_cast<size_t>(N) * C);
      const auto dy = random_floats(static_cast<size_t>(N) * C);
      const uint64_t seed = rng()();
      std::vector<float> y1, dx1, g1;
      for (int chunks : {1, 2, 4, 8, 64}) {  // 64 > N: most chunks are empty
        INFO("chunks " << chunks);
        auto self = make_self_communicator("ep", 0);
        ParamStore store;
        MoeConfig cfg = with_kind(MoeConfig{}, kind);
        cfg.experts = E;
        cfg.top_k = k;
        // Capacity ceil(0.5 * 37 k / 4) per expert holds at most 20 k of the 37 k assignments, so
        // tokens are dropped whatever the random routing (at 1.0 a balanced draw dropped none).
        cfg.capacity_factor = 0.5;
        cfg.chunks = chunks;
        MoeMlp moe(cfg, 0, C, F, *self, store);
        store.finalize();
        fill_params(store, seed);
        std::vector<float> y(x.size()), dx(x.size());
        moe.forward(0, N, x.data(), y.data(), true);
        REQUIRE(moe.forward_stats().dropped > 0);
        moe.backward(0, dy.data(), dx.data(), 0.5f);
        const auto g = store.flat_grads();
        if (chunks == 1) {
          y1 = y;
          dx1 = dx;
          g1.assign(g.begin(), g.end());
          continue;
        }
        // Row-wise math is identical; weight gradients sum the rows in chunk-sized pieces.
        CHECK(rel_err(y, y1) <= 1e-6);
        CHECK(rel_err(dx, dx1) <= 1e-6);
        CHECK(rel_err(g, g1) <= 1e-6);
        for (size_t i = 0; i < store.size(); ++i) {
          INFO(store.info(i).spec.name);
          const auto gi = store.grad(i);
          CHECK(rel_err(gi, std::span<const float>(g1).subspan(store.info(i).offset, gi.size())) <= 1e-6);
        }
      }
    }
  }
}

TEST_CASE("capacity drops exactly the expected tokens when every token picks expert 0", "[moe]") {
  const int C = 6, F = 12, E = 4, N = 10;
  for (int k : {1, 2}) {
    INFO("k " << k);
    auto self = make_self_communicator("ep", 0);
    ParamStore store;
    MoeConfig cfg;
    cfg.experts = E;
    cfg.top_k = k;
    cfg.capacity_factor = 1.0;  // capacity ceil(10 k / 4): 3 (k = 1) or 5 (k = 2)
    MoeMlp moe(cfg, 0, C, F, *self, store);
    store.finalize();
    fill_params(store, 11);
    // Positive inputs and router row 0 = 1, the others 0: logit 0 = sum x > 0 = the rest, so
    // every token's first choice is expert 0 and (ties to the lower index) its second expert 1.
    auto wr = store.param(moe.router_param());
    std::fill(wr.begin(), wr.end(), 0.0f);
    std::fill(wr.begin(), wr.begin() + C, 1.0f);
    const auto x = random_floats(static_cast<size_t>(N) * C, 0.1, 1.0);
    std::vector<float> y(x.size(), NAN);
    moe.forward(0, N, x.data(), y.data(), false);
    const Routing& R = moe.last_routing();
    const int64_t cap = k == 1 ? 3 : 5;
    CHECK(R.capacity == cap);
    CHECK(R.dropped == (N - cap) * k);
    RefModel m = ref_of(store, moe, C, F);
    const RefOut ref = ref_moe(m, to_double(x), N, cap);
    for (int n = 0; n < N; ++n) {
      CHECK(R.expert[n * k] == 0);
      if (k == 2) CHECK(R.expert[n * k + 1] == 1);
      const bool kept = n < cap;  // token order: the first `cap` tokens fill the slots
      for (int j = 0; j < k; ++j) CHECK(R.kept(n, j) == kept);
      for (int c = 0; c < C; ++c) {
        if (!kept) CHECK(y[n * C + c] == 0.0f);  // dropped: exactly zero (the residual carries it)
        else CHECK(y[n * C + c] == Approx(ref.y[n * C + c]).epsilon(1e-5).margin(1e-6));
      }
    }
  }
}

TEST_CASE("MoE layer rejects misuse", "[moe]") {
  auto self = make_self_communicator("ep", 0);
  ParamStore store;
  MoeConfig cfg;
  cfg.experts = 2;
  MoeMlp moe(cfg, 5, 4, 8, *self, store);
  store.finalize();
  moe.init_params(1, 2);
  std::vector<float> x(8, 0.5f), y(8), dx(8);
  CHECK_THROWS_WITH(moe.forward(0, 0, x.data(), y.data(), true), Contains("0 tokens"));
  CHECK_THROWS_WITH(moe.forward(0, 2, nullptr, y.data(), true), Contains("null"));
  CHECK_THROWS_WITH(moe.backward(3, y.data(), dx.data()), Contains("slot 3"));
  moe.forward(0, 2, x.data(), y.data(), true);
  CHECK_THROWS_WITH(moe.forward(0, 2, x.data(), y.data(), true), Contains("already holds"));
  CHECK_THROWS_WITH(moe.backward(0, y.data(), dx.data(), NAN), Contains("dloss"));
  CHECK_THROWS_WITH(moe.backward(0, nullptr, dx.data()), Contains("null"));
  moe.backward(0, y.data(), dx.data());
  CHECK_THROWS_WITH(moe.backward(0, y.data(), dx.data()), Contains("no forward"));  // released
  moe.forward(1, 2, x.data(), y.data(), false);                                       // inference keeps nothing
  CHECK_THROWS_WITH(moe.backward(1, y.data(), dx.data()), Contains("no forward"));
  CHECK_THROWS_WITH(moe.set_chunks(0), Contains("chunks"));
  CHECK_THROWS_WITH(moe.init_params(1, 0), Contains("n_layer"));
  ParamStore s2;
  CHECK_THROWS_WITH(MoeMlp(cfg, 0, 0, 8, *self, s2), Contains("C = 0"));
  cfg.experts = 3;
  cfg.top_k = 2;
  cfg.chunks = -1;
  CHECK_THROWS_WITH(MoeMlp(cfg, 0, 4, 8, *self, s2), Contains("chunks"));
}

TEST_CASE("MoE grad-ready hook reports every parameter once, experts before the router", "[moe]") {
  for (const Kind& kind : {kGelu, kMixtral, kSwigluBias}) {
    INFO(kind.what);
    auto self = make_self_communicator("ep", 0);
    ParamStore store;
    MoeConfig cfg = with_kind(MoeConfig{}, kind);
    cfg.experts = 3;
    cfg.top_k = 2;
    cfg.chunks = 2;
    MoeMlp moe(cfg, 1, 4, 8, *self, store);
    store.finalize();
    fill_params(store, 3);
    std::vector<size_t> seen;
    moe.set_grad_ready_hook([&](size_t i) { seen.push_back(i); });
    const auto x = random_floats(20);
    std::vector<float> y(20), dx(20);
    moe.forward(0, 5, x.data(), y.data(), true);
    CHECK(seen.empty());
    moe.backward(0, x.data(), dx.data());
    REQUIRE(seen.size() == store.size());
    CHECK(seen.back() == moe.router_param());
    std::vector<size_t> sorted = seen;
    std::sort(sorted.begin(), sorted.end());
    CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
    // Slots: two micro-batches in flight, backward in any order; release drops one.
    moe.forward(4, 5, x.data(), y.data(), true);
    moe.forward(7, 5, x.data(), y.data(), true);
    moe.release(4);
    CHECK_THROWS_WITH(moe.backward(4, x.data(), dx.data()), Contains("no forward"));
    CHECK_NOTHROW(moe.backward(7, x.data(), dx.data()));
  }
}
