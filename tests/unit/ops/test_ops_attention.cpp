// Causal self-attention against a naive double reference that materialises every score row;
// backward by finite differences of that reference (double), float against double; a TP shard
// of heads computes exactly its channels of the full output.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "triax/core/error.h"
#include "triax/ops/attention.h"
#include "unit/ops_testing.h"

using namespace triax::ops;
using namespace triax::test;
using Catch::Matchers::Contains;

namespace {

// out (B, T, C) from qkv (B, T, 3C); lse (B, NH, T) if given.
std::vector<double> ref_attention(const std::vector<double>& qkv, int B, int T, int C, int NH,
                                  std::vector<double>* lse = nullptr) {
  const int hs = C / NH;
  std::vector<double> out(static_cast<size_t>(B) * T * C, 0.0);
  std::vector<double> s(T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int i = 0; i < T; ++i) {
        const double* q = &qkv[(b * T + i) * 3 * C + h * hs];
        double mx = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          const double* k = &qkv[(b * T + j) * 3 * C + C + h * hs];
          double d = 0;
          for (int c = 0; c < hs; ++c) d += q[c] * k[c];
          s[j] = d / std::sqrt(static_cast<double>(hs));
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (int j = 0; j <= i; ++j) z += std::exp(s[j] - mx);
        for (int j = 0; j <= i; ++j) {
          const double p = std::exp(s[j] - mx) / z;
          const double* v = &qkv[(b * T + j) * 3 * C + 2 * C + h * hs];
          for (int c = 0; c < hs; ++c) out[(b * T + i) * C + h * hs + c] += p * v[c];
        }
        if (lse) (*lse)[(b * NH + h) * T + i] = mx + std::log(z);
      }
  return out;
}

}  // namespace

TEST_CASE("attention forward matches the naive reference") {
  // Shapes below, at and across the 64-row query block; one head, several heads.
  for (auto [B, T, C, NH] : {std::tuple{2, 5, 8, 2}, std::tuple{1, 64, 16, 1}, std::tuple{2, 130, 48, 3},
                             std::tuple{3, 200, 64, 4}}) {
    auto qkv = random_vec(static_cast<size_t>(B) * T * 3 * C, -2.0, 2.0);
    std::vector<double> lse_want(B * NH * T);
    auto want = ref_attention(qkv, B, T, C, NH, &lse_want);
    auto qf = cast<float>(qkv);
    std::vector<float> out(B * T * C, std::numeric_limits<float>::quiet_NaN()), lse(B * NH * T);
    attention_forward<float>(out.data(), lse.data(), qf.data(), B, T, C, NH);
    require_close(out, want, 2e-5, 2e-5, fmt::format("float out B={} T={} C={} NH={}", B, T, C, NH));
    require_close(lse, lse_want, 2e-6, 2e-6, "float lse");
    std::vector<double> outd(B * T * C), lsed(B * NH * T);
    attention_forward<double>(outd.data(), lsed.data(), qkv.data(), B, T, C, NH);
    require_close(outd, want, 1e-12, 1e-12, "double out");
    require_close(lsed, lse_want, 1e-12, 1e-12, "double lse");
  }
}

TEST_CASE("attention softmax is stable for large scores") {
  const int B = 1, T = 70, C = 8, NH = 2;
  auto qkv = random_vec(static_cast<size_t>(B) * T * 3 * C, -30.0, 30.0);  // scores up to ~1800
  std::vector<double> lse_want(B * NH * T);
  auto want = ref_attention(qkv, B, T, C, NH, &lse_want);
  auto qf = cast<float>(qkv);
  std::vector<float> out(B * T * C), lse(B * NH * T);
  attention_forward<float>(out.data(), lse.data(), qf.data(), B, T, C, NH);
  // Near-one-hot rows: float rounding of the huge scores moves the result by a few 1e-5 of 30.
  require_close(out, want, 1e-4, 1e-3, "float out");
  require_close(lse, lse_want, 1e-5, 1e-3, "float lse");
}

TEST_CASE("attention backward: finite differences in double, float against double") {
  const int B = 2, T = 67, C = 8, NH = 2;  // two query blocks, the second one partial
  auto qkv = random_vec(static_cast<size_t>(B) * T * 3 * C), dout = random_vec(static_cast<size_t>(B) * T * C);
  std::vector<double> out(B * T * C), lse(B * NH * T);
  attention_forward<double>(out.data(), lse.data(), qkv.data(), B, T, C, NH);
  std::vector<double> dqkv(qkv.size(), std::numeric_limits<double>::quiet_NaN());
  attention_backward<double>(dqkv.data(), dout.data(), qkv.data(), lse.data(), B, T, C, NH);
  fd_check(qkv, dqkv, [&] { return dot(dout, ref_attention(qkv, B, T, C, NH)); }, "dqkv", 1e-7, 1e-5, 1000);

  auto qf = cast<float>(qkv), doutf = cast<float>(dout), lsef = cast<float>(lse);
  std::vector<float> dqf(qkv.size(), std::numeric_limits<float>::quiet_NaN());
  attention_backward<float>(dqf.data(), doutf.data(), qf.data(), lsef.data(), B, T, C, NH);
  require_close(dqf, dqkv, 1e-4, 1e-5 * max_abs(dqkv), "float dqkv");
}

TEST_CASE("attention backward, float against double, at a larger size") {
  const int B = 2, T = 200, C = 64, NH = 4;
  auto qkv = random_vec(static_cast<size_t>(B) * T * 3 * C), dout = random_vec(static_cast<size_t>(B) * T * C);
  std::vector<double> out(B * T * C), lse(B * NH * T), dqkv(qkv.size());
  attention_forward<double>(out.data(), lse.data(), qkv.data(), B, T, C, NH);
  attention_backward<double>(dqkv.data(), dout.data(), qkv.data(), lse.data(), B, T, C, NH);
  auto qf = cast<float>(qkv), doutf = cast<float>(dout);
  std::vector<float> outf(B * T * C), lsef(B * NH * T), dqf(qkv.size(), std::numeric_limits<float>::quiet_NaN());
  attention_forward<float>(outf.data(), lsef.data(), qf.data(), B, T, C, NH);
  attention_backward<float>(dqf.data(), doutf.data(), qf.data(), lsef.data(), B, T, C, NH);
  require_close(dqf, dqkv, 1e-4, 1e-5 * max_abs(dqkv), "float dqkv");
}

TEST_CASE("a shard of heads computes its channels of the full attention") {
  const int B = 2, T = 90, NH = 6, hs = 8, C = NH * hs, tp = 3, nh = NH / tp, c = C / tp;
  auto qkv = random_vec(static_cast<size_t>(B) * T * 3 * C), dout = random_vec(static_cast<size_t>(B) * T * C);
  auto qf = cast<float>(qkv), doutf = cast<float>(dout);
  std::vector<float> out(B * T * C), lse(B * NH * T), dqkv(qkv.size());
  attention_forward<float>(out.data(), lse.data(), qf.data(), B, T, C, NH);
  attention_backward<float>(dqkv.data(), doutf.data(), qf.data(), lse.data(), B, T, C, NH);
  for (int r = 0; r < tp; ++r) {
    // The shard's qkv: its heads' columns of each of q, k and v; its dout columns.
    std::vector<float> sq(B * T * 3 * c), sd(B * T * c);
    for (int bt = 0; bt < B * T; ++bt) {
      for (int part = 0; part < 3; ++part)
        for (int j = 0; j < c; ++j) sq[bt * 3 * c + part * c + j] = qf[bt * 3 * C + part * C + r * c + j];
      for (int j = 0; j < c; ++j) sd[bt * c + j] = doutf[bt * C + r * c + j];
    }
    std::vector<float> so(B * T * c), sl(B * nh * T), sdq(sq.size());
    attention_forward<float>(so.data(), sl.data(), sq.data(), B, T, c, nh);
    attention_backward<float>(sdq.data(), sd.data(), sq.data(), sl.data(), B, T, c, nh);
    std::vector<double> want_o(so.size()), want_dq(sdq.size());
    for (int bt = 0; bt < B * T; ++bt) {
      for (int j = 0; j < c; ++j) want_o[bt * c + j] = out[bt * C + r * c + j];
      for (int part = 0; part < 3; ++part)
        for (int j = 0; j < c; ++j) want_dq[bt * 3 * c + part * c + j] = dqkv[bt * 3 * C + part * C + r * c + j];
    }
    require_close(so, want_o, 1e-6, 1e-7, fmt::format("shard {} out", r));
    require_close(sdq, want_dq, 1e-6, 1e-7, fmt::format("shard {} dqkv", r));
  }
}

TEST_CASE("attention rejects bad arguments") {
  std::vector<float> v(3 * 2 * 12, 1.0f), o(2 * 12), l(2 * 5);
  CHECK_THROWS_WITH(attention_forward<float>(o.data(), l.data(), v.data(), 1, 2, 12, 5), Contains("5 heads") &&
                                                                                             Contains("C=12"));
  CHECK_THROWS_WITH(attention_forward<float>(o.data(), nullptr, v.data(), 1, 2, 12, 3), Contains("lse is null"));
  CHECK_THROWS_WITH(attention_backward<float>(v.data(), o.data(), v.data(), l.data(), 1, 2, 12, 0),
                    Contains("NH must be positive"));
  CHECK_THROWS_WITH(attention_backward<float>(v.data(), nullptr, v.data(), l.data(), 1, 2, 12, 3),
                    Contains("dout is null"));
}
