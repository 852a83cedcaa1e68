// SwiGLU against silu(g) * up in double; backward by finite differences in double, float against
// double, finite and correct for gates far beyond exp's range, and argument checks.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "triax/core/error.h"
#include "triax/ops/swiglu.h"
#include "unit/ops_testing.h"

using namespace triax::ops;
using namespace triax::test;
using Catch::Matchers::Contains;

namespace {

// silu(g) = g * sigmoid(g), sigmoid written per sign so the reference itself never overflows.
double ref_sigmoid(double g) { return g >= 0 ? 1.0 / (1.0 + std::exp(-g)) : std::exp(g) / (1.0 + std::exp(g)); }

std::vector<double> ref_swiglu(const std::vector<double>& h, int N, int F) {
  std::vector<double> out(static_cast<size_t>(N) * F);
  for (int n = 0; n < N; ++n)
    for (int i = 0; i < F; ++i) {
      const double g = h[n * 2 * F + i], u = h[n * 2 * F + F + i];
      out[n * F + i] = g * ref_sigmoid(g) * u;
    }
  return out;
}

}  // namespace

TEST_CASE("swiglu forward matches silu(gate) * up, float and double") {
  for (auto [N, F] : {std::pair{3, 37}, std::pair{200, 300}}) {  // the second runs in parallel
    auto h = random_vec(static_cast<size_t>(N) * 2 * F, -8.0, 8.0);
    std::vector<double> out(static_cast<size_t>(N) * F, std::numeric_limits<double>::quiet_NaN());
    swiglu_forward<double>(out.data(), h.data(), N, F);
    require_close(out, ref_swiglu(h, N, F), 1e-15, 1e-15, "double");
    auto hf = cast<float>(h);
    std::vector<float> outf(out.size(), std::numeric_limits<float>::quiet_NaN());
    swiglu_forward<float>(outf.data(), hf.data(), N, F);
    require_close(outf, ref_swiglu(cast<double>(hf), N, F), 2e-6, 1e-7, "float");
  }
}

TEST_CASE("swiglu backward: finite differences in double, float against double") {
  const int N = 4, F = 25;
  auto h = random_vec(N * 2 * F, -6.0, 6.0), dout = random_vec(N * F);
  std::vector<double> dh(h.size(), std::numeric_limits<double>::quiet_NaN());
  swiglu_backward<double>(dh.data(), dout.data(), h.data(), N, F);
  fd_check(h, dh, [&] { return dot(dout, ref_swiglu(h, N, F)); }, "dh");
  auto hf = cast<float>(h), doutf = cast<float>(dout);
  std::vector<float> dhf(h.size());
  swiglu_backward<float>(dhf.data(), doutf.data(), hf.data(), N, F);
  require_close(dhf, dh, 1e-5, 1e-6, "float dh");
}

TEST_CASE("swiglu stays finite and right for gates far outside exp's range") {
  const int N = 1, F = 8;
  const double gates[F] = {-1000, -200, -89, -30, 30, 89, 200, 1000};
  std::vector<double> h(2 * F), dout(F, 1.0);
  for (int i = 0; i < F; ++i) {
    h[i] = gates[i];
    h[F + i] = 0.5 + 0.25 * i;
  }
  // d/dg: up * s (1 + g (1 - s)); d/dup: g s, with s the per-sign sigmoid.
  std::vector<double> want_out = ref_swiglu(h, N, F), want_dh(2 * F);
  for (int i = 0; i < F; ++i) {
    const double g = h[i], s = ref_sigmoid(g);
    want_dh[i] = h[F + i] * s * (1 + g * (1 - s));
    want_dh[F + i] = g * s;
  }
  auto hf = cast<float>(h), doutf = cast<float>(dout);
  std::vector<float> out(F), dh(2 * F);
  swiglu_forward<float>(out.data(), hf.data(), N, F);
  swiglu_backward<float>(dh.data(), doutf.data(), hf.data(), N, F);
  for (float v : out) CHECK(std::isfinite(v));
  for (float v : dh) CHECK(std::isfinite(v));
  require_close(out, want_out, 1e-6, 1e-30, "float out");
  require_close(dh, want_dh, 1e-6, 1e-30, "float dh");
  std::vector<double> outd(F), dhd(2 * F);
  swiglu_forward<double>(outd.data(), h.data(), N, F);
  swiglu_backward<double>(dhd.data(), dout.data(), h.data(), N, F);
  require_close(outd, want_out, 1e-15, 1e-300, "double out");
  require_close(dhd, want_dh, 1e-15, 1e-300, "double dh");
}

TEST_CASE("swiglu rejects bad arguments naming them") {
  std::vector<float> v(16, 1.0f);
  CHECK_THROWS_WITH(swiglu_forward<float>(v.data(), v.data(), 0, 4), Contains("swiglu_forward") &&
                                                                            Contains("N must be positive"));
  CHECK_THROWS_WITH(swiglu_forward<float>(v.data(), v.data(), 2, 0), Contains("F must be positive"));
  CHECK_THROWS_WITH(swiglu_forward<float>(v.data(), nullptr, 2, 4), Contains("h is null"));
  CHECK_THROWS_WITH(swiglu_backward<float>(v.data(), nullptr, v.data(), 2, 4), Contains("swiglu_backward") &&
                                                                                    Contains("dout is null"));
  CHECK_THROWS_WITH(swiglu_backward<float>(v.data(), v.data(), v.data(), 2, 4), Contains("dh may not alias h"));
}
