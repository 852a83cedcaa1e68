// Expert-parallel MoE equals the serial block: world = ep ranks, each a data-parallel replica with
// its own tokens (a different count on each rank). The reference runs every rank's tokens through
// one ep = 1 block in-process (one micro-batch slot per rank: capacity is per source rank), and
// each rank compares its outputs, input gradients and aux loss, the DP-summed router gradient and
// the gradients of the experts it owns, for k = 1, 2, drop and no-drop, chunks 1, 2, 4; for GPT-2
// experts (GELU, biases) and Mixtral's (SwiGLU, no biases, HF names).
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <random>

#include "support/multirank.h"
#include "triax/distributed/grid.h"
#include "triax/distributed/comm/self_comm.h"
#include "triax/model/moe.h"
#include "triax/model/param_shards.h"

using namespace triax;

namespace {

constexpr int kC = 16, kF = 24, kE = 8;

int tokens_of(int rank) { return 20 + 3 * rank; }

std::vector<float> data_of(int rank, size_t n, uint32_t stream) {
  std::mt19937 gen(1000u * stream + static_cast<uint32_t>(rank));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(gen);
  return v;
}

// Same values for a parameter on every rank and every ep (a function of its name).
void fill_params(ParamStore& store, uint64_t seed) {
  for (size_t i = 0; i < store.size(); ++i) {
    const auto& name = store.info(i).spec.name;
    const float std = name.find("router") != std::string::npos ? 1.0f : 0.5f;
    const auto v = init_normal(seed, name, store.info(i).numel, std);
    std::copy(v.begin(), v.end(), store.param(i).begin());
  }
}

double rel_err(std::span<const float> a, std::span<const float> b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

struct Serial {
  std::vector<std::vector<float>> y, dx;  // per rank
  std::vector<float> aux;
  std::vector<int64_t> dropped;
  std::map<std::string, std::vector<float>> grads;
};

Serial run_serial(const MoeConfig& cfg, int P, uint64_t seed, const std::function<void(ParamStore&, MoeMlp&)>& setup) {
  auto self = make_self_communicator("serial", test::world().rank());
  ParamStore store;
  MoeMlp moe(cfg, 2, kC, kF, *self, store);
  store.finalize();
  fill_params(store, seed);
  if (setup) setup(store, moe);
  Serial s;
  for (int r = 0; r < P; ++r) {
    const int N = tokens_of(r);
    const auto x = data_of(r, static_cast<size_t>(N) * kC, 1);
    s.y.emplace_back(x.size());
    s.aux.push_back(moe.forward(r, N, x.data(), s.y.back().data(), true));
    s.dropped.push_back(moe.forward_stats().dropped);
  }
  for (int r = P; r-- > 0;) {
    const int N = tokens_of(r);
    const auto dy = data_of(r, static_cast<size_t>(N) * kC, 2);
    s.dx.emplace_back(dy.size());
    moe.backward(r, dy.data(), s.dx.back().data(), 0.5f);
  }
  std::reverse(s.dx.begin(), s.dx.end());
  for (size_t i = 0; i < store.size(); ++i) {
    const auto g = store.grad(i);
    s.grads[store.info(i).spec.name].assign(g.begin(), g.end());
  }
  return s;
}

// The expert variant of a config: GPT-2's (GELU, biases, triax names) or Mixtral's.
MoeConfig experts_of(bool mixtral) {
  MoeConfig cfg;
  cfg.swiglu = mixtral;
  cfg.bias = !mixtral;
  cfg.hf_names = mixtral;
  return cfg;
}

// seed: of the parameters; one whose routing sends tokens to every expert at np 1 (20 tokens over
// 8 experts), which the check of each expert's gradient requires.
void check_ep_matches_serial(bool mixtral, uint64_t seed) {
  INFO((mixtral ? "SwiGLU experts, no bias, HF names" : "GELU experts with biases"));
  auto& world = test::world();
  const int P = world.size();
  ProcessGrid grid(test::world_ptr(), {1, 1, P, P, "tp-dp-pp"});
  Communicator& ep = grid.ep();
  REQUIRE(ep.size() == P);
  const int me = ep.rank();
  for (int k : {1, 2})
    for (bool drop : {true, false}) {
      MoeConfig cfg = experts_of(mixtral);
      cfg.experts = kE;
      cfg.top_k = k;
      cfg.drop_tokens = drop;
      cfg.capacity_factor = 1.0;
      cfg.aux_loss_coef = 0.1f;
      const Serial ref = run_serial(cfg, P, seed, nullptr);
      int64_t ref_drops = 0;
      for (auto d : ref.dropped) ref_drops += d;
      if (drop) REQUIRE(ref_drops > 0);  // the drop path really runs
      for (int chunks : {1, 2, 4}) {
        INFO("ep " << P << " rank " << me << " k " << k << " drop " << drop << " chunks " << chunks);
        cfg.chunks = chunks;
        ParamStore store;
        MoeMlp moe(cfg, 2, kC, kF, ep, store);
        store.finalize();
        REQUIRE(moe.local_experts() == kE / P);
        REQUIRE(moe.first_expert() == me * (kE / P));
        fill_params(store, seed);
        const int N = tokens_of(me);
        const auto x = data_of(me, static_cast<size_t>(N) * kC, 1);
        const auto dy = data_of(me, static_cast<size_t>(N) * kC, 2);
        std::vector<float> y(x.size()), dx(x.size());
        const float aux = moe.forward(0, N, x.data(), y.data(), true);
        CHECK(moe.forward_stats().dropped == ref.dropped[me]);
        moe.backward(0, dy.data(), dx.data(), 0.5f);
        CHECK(std::abs(aux - ref.aux[me]) <= 1e-6f * std::abs(ref.aux[me]));
        CHECK(rel_err(y, ref.y[me]) <= 1e-5);
        CHECK(rel_err(dx, ref.dx[me]) <= 1e-5);
        // Router: replicated, each rank's gradient is its own tokens'; the sum over DP is the serial one.
        const size_t ri = moe.router_param();
        std::vector<float> rg(store.grad(ri).begin(), store.grad(ri).end());
        ep.all_reduce(std::span<float>(rg), ReduceOp::sum).wait();
        CHECK(rel_err(rg, ref.grads.at(store.info(ri).spec.name)) <= 1e-5);
        // Experts: the owner's gradient already holds every rank's tokens.
        for (size_t i = 0; i < store.size(); ++i) {
          if (!store.info(i).spec.expert) continue;
          INFO(store.info(i).spec.name);
          const auto& want = ref.grads.at(store.info(i).spec.name);
          double norm = 0;
          for (float v : want) norm += double(v) * v;
          REQUIRE(norm > 0);  // every expert gets tokens: the comparison can fail
          CHECK(rel_err(store.grad(i), want) <= 1e-5);
        }
      }
    }
}
}  // namespace

TEST_CASE("expert-parallel MoE matches the serial block", "[moe][ep]") { check_ep_matches_serial(false, 4242); }

TEST_CASE("expert-parallel MoE with SwiGLU experts (Mixtral) matches the serial block", "[moe][ep]") {
  check_ep_matches_serial(true, 4244);
}

TEST_CASE("expert-parallel init gives every ep the same parameters", "[moe][ep]") {
  for (bool mixtral : {false, true}) {
    INFO("mixtral " << mixtral);
    auto& world = test::world();
    const int P = world.size();
    ProcessGrid grid(test::world_ptr(), {1, 1, P, P, "tp-dp-pp"});
    MoeConfig cfg = experts_of(mixtral);
    cfg.experts = kE;
    ParamStore dist_store, ref_store;
    MoeMlp dist(cfg, 0, kC, kF, grid.ep(), dist_store);
    auto self = make_self_communicator("serial", world.rank());
    MoeMlp ref(cfg, 0, kC, kF, *self, ref_store);
    dist_store.finalize();
    ref_store.finalize();
    dist.init_params(9, 4);
    ref.init_params(9, 4);
    REQUIRE(dist_store.size() == 1 + (mixtral ? 3 : 4) * static_cast<size_t>(kE / P));
    for (size_t i = 0; i < dist_store.size(); ++i) {
      const auto& name = dist_store.info(i).spec.name;
      INFO(name);
      const auto a = dist_store.param(i), b = ref_store.param(ref_store.find(name));
      REQUIRE(a.size() == b.size());
      CHECK(std::equal(a.begin(), a.end(), b.begin()));
    }
  }
}

TEST_CASE("expert-parallel capacity: every token to expert 0 keeps each rank's first tokens", "[moe][ep]") {
  auto& world = test::world();
  const int P = world.size();
  ProcessGrid grid(test::world_ptr(), {1, 1, P, P, "tp-dp-pp"});
  Communicator& ep = grid.ep();
  const int me = ep.rank();
  // Positive tokens; router row 0 all ones, the rest zero: first choice expert 0 (on ep rank 0),
  // second choice expert 1 (ties go to the lower index).
  auto force = [](ParamStore& store, MoeMlp& moe) {
    auto wr = store.param(moe.router_param());
    std::fill(wr.begin(), wr.end(), 0.0f);
    std::fill(wr.begin(), wr.begin() + kC, 1.0f);
  };
  for (int k : {1, 2}) {
    INFO("ep " << P << " rank " << me << " k " << k);
    MoeConfig cfg;
    cfg.experts = kE;
    cfg.top_k = k;
    cfg.capacity_factor = 2.0;
    cfg.chunks = 2;
    ParamStore store;
    MoeMlp moe(cfg, 0, kC, kF, ep, store);
    store.finalize();
    fill_params(store, 5);
    force(store, moe);
    const int N = tokens_of(me);
    auto x = data_of(me, static_cast<size_t>(N) * kC, 1);
    for (auto& v : x) v = std::abs(v) + 0.05f;
    std::vector<float> y(x.size());
    moe.forward(0, N, x.data(), y.data(), false);
    const int64_t cap = expert_capacity(N, kE, k, 2.0);
    REQUIRE(cap < N);
    CHECK(moe.forward_stats().capacity == cap);
    CHECK(moe.forward_stats().dropped == (N - cap) * k);
    // Rows received: expert 0 (rank 0) gets cap rows from every rank; expert 1 likewise for k = 2.
    int64_t want_recv = 0;
    for (int r = 0; r < P; ++r) {
      const int64_t c = expert_capacity(tokens_of(r), kE, k, 2.0);
      if (me == 0) want_recv += c;                          // expert 0
      if (k == 2 && me == 1 / (kE / P)) want_recv += c;     // expert 1's owner
    }
    CHECK(moe.forward_stats().recv_rows == want_recv);
    for (int n = 0; n < N; ++n)
      for (int c = 0; c < kC; ++c)
        if (n >= cap) CHECK(y[static_cast<size_t>(n) * kC + c] == 0.0f);
    // Kept rows equal the serial block's.
    auto self = make_self_communicator("serial", world.rank());
    ParamStore rs;
    MoeMlp ref(cfg, 0, kC, kF, *self, rs);
    rs.finalize();
    fill_params(rs, 5);
    force(rs, ref);
    std::vector<float> ry(x.size());
    ref.forward(0, N, x.data(), ry.data(), false);
    CHECK(rel_err(y, ry) <= 1e-5);
    double kept_norm = 0;
    for (int i = 0; i < cap * kC; ++i) kept_norm += double(ry[i]) * ry[i];
    CHECK(kept_norm > 0);
  }
}
