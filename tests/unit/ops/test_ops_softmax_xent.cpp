// Softmax + cross-entropy against a double log-softmax reference, with vocab padding excluded;
// gradient by finite differences (double); vocab-parallel shards with simulated all-reduces give
// the unsharded loss and gradient.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "triax/core/error.h"
#include "triax/ops/softmax_xent.h"
#include "unit/ops_testing.h"

using namespace triax::ops;
using namespace triax::test;
using Catch::Matchers::Contains;

namespace {

// Per-row -log softmax over the first `valid` of V columns; lse too.
std::vector<double> ref_xent(const std::vector<double>& logits, const std::vector<int32_t>& tgt, int N, int V, int valid,
                             std::vector<double>* lse = nullptr) {
  std::vector<double> loss(N);
  for (int i = 0; i < N; ++i) {
    double mx = -INFINITY;
    for (int j = 0; j < valid; ++j) mx = std::max(mx, logits[i * V + j]);
    double z = 0;
    for (int j = 0; j < valid; ++j) z += std::exp(logits[i * V + j] - mx);
    const double l = mx + std::log(z);
    loss[i] = l - logits[i * V + tgt[i]];
    if (lse) (*lse)[i] = l;
  }
  return loss;
}

// Padding columns hold huge values: if they leaked into the max or the sum the loss would show it.
std::vector<double> padded_logits(int N, int V, int valid, double lo, double hi) {
  auto x = random_vec(static_cast<size_t>(N) * V, lo, hi);
  for (int i = 0; i < N; ++i)
    for (int j = valid; j < V; ++j) x[i * V + j] = 1e4;
  return x;
}

}  // namespace

TEST_CASE("softmax cross-entropy forward matches the reference and ignores padding") {
  for (auto [N, V, valid] : {std::tuple{7, 13, 11}, std::tuple{64, 1024, 1000}, std::tuple{3, 5, 5}}) {
    auto x = padded_logits(N, V, valid, -4.0, 4.0);
    auto tgt = random_ints(N, 0, valid);
    std::vector<double> lse_want(N);
    auto want = ref_xent(x, tgt, N, V, valid, &lse_want);
    auto xf = cast<float>(x);
    std::vector<float> loss(N, std::numeric_limits<float>::quiet_NaN()), lse(N);
    softmax_xent_forward<float>(loss.data(), lse.data(), xf.data(), tgt.data(), N, V, valid);
    require_close(loss, want, 1e-6, 2e-6, "float loss");
    require_close(lse, lse_want, 1e-6, 2e-6, "float lse");
    std::vector<double> lossd(N), lsed(N);
    softmax_xent_forward<double>(lossd.data(), lsed.data(), x.data(), tgt.data(), N, V, valid);
    require_close(lossd, want, 1e-13, 1e-13, "double loss");
  }
}

TEST_CASE("softmax cross-entropy is stable for large logits") {
  const int N = 5, V = 50, valid = 47;
  auto x = padded_logits(N, V, valid, -1000.0, 1000.0);
  auto tgt = random_ints(N, 0, valid);
  auto want = ref_xent(x, tgt, N, V, valid);
  auto xf = cast<float>(x);
  std::vector<float> loss(N), lse(N), d(N * V);
  softmax_xent_forward<float>(loss.data(), lse.data(), xf.data(), tgt.data(), N, V, valid);
  require_close(loss, want, 1e-6, 1e-4, "loss");  // float logits near 1000 carry 6e-5 of rounding
  softmax_xent_backward<float>(d.data(), xf.data(), lse.data(), tgt.data(), 1.0f, N, V, valid);
  for (float g : d) REQUIRE(std::isfinite(g));
}

TEST_CASE("softmax cross-entropy backward: finite differences in double, float against double") {
  const int N = 6, V = 12, valid = 10;
  auto x = padded_logits(N, V, valid, -3.0, 3.0);
  auto tgt = random_ints(N, 0, valid);
  const double dloss = 0.37;
  std::vector<double> loss(N), lse(N), d(N * V, std::numeric_limits<double>::quiet_NaN());
  softmax_xent_forward<double>(loss.data(), lse.data(), x.data(), tgt.data(), N, V, valid);
  softmax_xent_backward<double>(d.data(), x.data(), lse.data(), tgt.data(), dloss, N, V, valid);
  fd_check(x, d, [&] {
    double s = 0;
    for (double l : ref_xent(x, tgt, N, V, valid)) s += dloss * l;
    return s;
  }, "dlogits");
  for (int i = 0; i < N; ++i)
    for (int j = valid; j < V; ++j) REQUIRE(d[i * V + j] == 0.0);  // padding gets exactly no gradient

  auto xf = cast<float>(x);
  auto lsef = cast<float>(lse);
  std::vector<float> df(N * V, std::numeric_limits<float>::quiet_NaN());
  softmax_xent_backward<float>(df.data(), xf.data(), lsef.data(), tgt.data(), static_cast<float>(dloss), N, V, valid);
  require_close(df, d, 1e-5, 1e-7, "float dlogits");
  softmax_xent_backward<float>(xf.data(), xf.data(), lsef.data(), tgt.data(), static_cast<float>(dloss), N, V, valid);
  require_close(xf, d, 1e-5, 1e-7, "float dlogits in place");
}

TEST_CASE("vocab-parallel blocks with simulated all-reduces equal the full computation") {
  const int N = 9, valid = 50, V = 56;  // vocab padded to 56; tp = 4 shards of 14, the last with 8 padding
  const int tp = 4, Vs = V / tp;
  auto x = padded_logits(N, V, valid, -5.0, 5.0);
  auto tgt = random_ints(N, 0, valid);
  tgt[0] = valid - 1;  // a target in the last shard, next to the padding
  tgt[1] = 0;
  std::vector<double> full_loss(N), full_lse(N), full_d(N * V);
  softmax_xent_forward<double>(full_loss.data(), full_lse.data(), x.data(), tgt.data(), N, V, valid);
  softmax_xent_backward<double>(full_d.data(), x.data(), full_lse.data(), tgt.data(), 0.5, N, V, valid);

  auto shard = [&](int r) {
    std::vector<double> s(static_cast<size_t>(N) * Vs);
    for (int i = 0; i < N; ++i)
      for (int j = 0; j < Vs; ++j) s[i * Vs + j] = x[i * V + r * Vs + j];
    return s;
  };
  std::vector<double> gmax(N, -INFINITY), gsum(N, 0.0), gtgt(N, 0.0);
  for (int r = 0; r < tp; ++r) {  // all-reduce MAX
    std::vector<double> m(N);
    xent_shard_max<double>(m.data(), shard(r).data(), N, Vs, r * Vs, valid);
    for (int i = 0; i < N; ++i) gmax[i] = std::max(gmax[i], m[i]);
  }
  for (int r = 0; r < tp; ++r) {  // all-reduce SUM of [sumexp | target_logit]
    std::vector<double> buf(2 * N);
    auto s = shard(r);
    xent_shard_sumexp<double>(buf.data(), s.data(), gmax.data(), N, Vs, r * Vs, valid);
    xent_shard_target_logit<double>(buf.data() + N, s.data(), tgt.data(), N, Vs, r * Vs, valid);
    for (int i = 0; i < N; ++i) gsum[i] += buf[i], gtgt[i] += buf[N + i];
  }
  std::vector<double> loss(N), lse(N);
  xent_loss_from_stats<double>(loss.data(), lse.data(), gmax.data(), gsum.data(), gtgt.data(), N);
  require_close(loss, full_loss, 1e-13, 1e-13, "loss");
  require_close(lse, full_lse, 1e-13, 1e-13, "lse");
  for (int r = 0; r < tp; ++r) {
    auto s = shard(r);
    std::vector<double> d(s.size(), std::numeric_limits<double>::quiet_NaN());
    xent_shard_backward<double>(d.data(), s.data(), lse.data(), tgt.data(), 0.5, N, Vs, r * Vs, valid);
    std::vector<double> want(s.size());
    for (int i = 0; i < N; ++i)
      for (int j = 0; j < Vs; ++j) want[i * Vs + j] = full_d[i * V + r * Vs + j];
    require_close(d, want, 1e-13, 1e-15, fmt::format("shard {} dlogits", r));
  }

  // A shard holding only padding: max -inf, sum 0, no target.
  std::vector<float> pad(N * 4, 1e4f), m(N), se(N), tl(N);
  std::vector<float> gm(N, 1.0f);
  xent_shard_max<float>(m.data(), pad.data(), N, 4, 52, valid);
  xent_shard_sumexp<float>(se.data(), pad.data(), gm.data(), N, 4, 52, valid);
  xent_shard_target_logit<float>(tl.data(), pad.data(), tgt.data(), N, 4, 52, valid);
  for (int i = 0; i < N; ++i) {
    CHECK(m[i] == -INFINITY);
    CHECK(se[i] == 0.0f);
    CHECK(tl[i] == 0.0f);
  }
}

TEST_CASE("softmax cross-entropy rejects bad targets and vocab sizes") {
  const int N = 3, V = 8;
  std::vector<float> x(N * V, 0.5f), loss(N), lse(N);
  std::vector<int32_t> tgt = {1, 7, 2};
  CHECK_THROWS_WITH(softmax_xent_forward<float>(loss.data(), lse.data(), x.data(), tgt.data(), N, V, 6),
                    Contains("target 7") && Contains("row 1") && Contains("[0, 6)"));
  tgt[1] = -1;
  CHECK_THROWS_WITH(softmax_xent_backward<float>(x.data(), x.data(), lse.data(), tgt.data(), 1.0f, N, V, V),
                    Contains("target -1"));
  CHECK_THROWS_WITH(xent_shard_target_logit<float>(loss.data(), x.data(), tgt.data(), N, V, 0, V), Contains("target -1"));
  tgt[1] = 3;
  CHECK_THROWS_WITH(softmax_xent_forward<float>(loss.data(), lse.data(), x.data(), tgt.data(), N, V, 9),
                    Contains("valid_vocab=9") && Contains("8 logit columns"));
  CHECK_THROWS_WITH(softmax_xent_backward<float>(x.data(), x.data(), lse.data(), tgt.data(), 1.0f, N, V, 9),
                    Contains("valid_vocab=9"));
  CHECK_THROWS_WITH(softmax_xent_forward<float>(loss.data(), lse.data(), x.data(), tgt.data(), N, V, 0),
                    Contains("valid_vocab must be positive"));
  CHECK_THROWS_WITH(xent_shard_max<float>(loss.data(), x.data(), N, V, -1, V), Contains("v0=-1"));
  CHECK_THROWS_WITH(xent_shard_sumexp<float>(loss.data(), x.data(), nullptr, N, V, 0, V), Contains("row_max is null"));
  CHECK_THROWS_WITH(xent_loss_from_stats<float>(loss.data(), lse.data(), x.data(), x.data(), nullptr, N),
                    Contains("target_logit is null"));
}
