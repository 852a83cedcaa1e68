// RMSNorm against a direct double formula; backward by finite differences in double, float
// against double, accumulate against overwrite, the same bits for any thread count, and argument
// checks naming the argument.
#include <catch2/catch.hpp>

#include <omp.h>

#include <cmath>
#include <limits>

#include "triax/core/error.h"
#include "triax/ops/rmsnorm.h"
#include "unit/ops_testing.h"

using namespace triax::ops;
using namespace triax::test;
using Catch::Matchers::Contains;

namespace {

// y = w * x / sqrt(mean(x^2) + eps) per row; rstd per row if asked.
std::vector<double> ref_rmsnorm(const std::vector<double>& x, const std::vector<double>& w, int N, int C, double eps,
                                std::vector<double>* rstd = nullptr) {
  std::vector<double> y(x.size());
  if (rstd) rstd->assign(N, 0.0);
  for (int n = 0; n < N; ++n) {
    double ms = 0;
    for (int c = 0; c < C; ++c) ms += x[n * C + c] * x[n * C + c];
    const double r = 1.0 / std::sqrt(ms / C + eps);
    for (int c = 0; c < C; ++c) y[n * C + c] = w[c] * x[n * C + c] * r;
    if (rstd) (*rstd)[n] = r;
  }
  return y;
}

}  // namespace

TEST_CASE("rmsnorm forward matches the formula, float and double") {
  for (auto [N, C] : {std::pair{7, 33}, std::pair{300, 130}}) {  // the second runs in parallel
    const double eps = 1e-5;
    auto x = random_vec(static_cast<size_t>(N) * C, -2.0, 2.0), w = random_vec(C, 0.5, 1.5);
    std::vector<double> want_r;
    auto want = ref_rmsnorm(x, w, N, C, eps, &want_r);
    std::vector<double> y(x.size()), r(N);
    rmsnorm_forward<double>(y.data(), r.data(), x.data(), w.data(), N, C, eps);
    require_close(y, want, 1e-14, 1e-14, "double out");
    require_close(r, want_r, 1e-14, 0, "double rstd");
    auto xf = cast<float>(x), wf = cast<float>(w);
    std::vector<float> yf(x.size(), std::numeric_limits<float>::quiet_NaN()), rf(N);
    rmsnorm_forward<float>(yf.data(), rf.data(), xf.data(), wf.data(), N, C, eps);
    // The reference from the float inputs: only the op's float rounding remains.
    auto want_f = ref_rmsnorm(cast<double>(xf), cast<double>(wf), N, C, eps, &want_r);
    require_close(yf, want_f, 4e-6, 1e-7, "float out");  // a float sum of C squares
    require_close(rf, want_r, 4e-6, 0, "float rstd");
  }
}

TEST_CASE("rmsnorm eps matters where the row is small") {
  const int N = 3, C = 16;
  auto x = random_vec(N * C, -3e-3, 3e-3), w = random_vec(C, 0.5, 1.5);  // |x| >= 1e-3 (random_vec)
  for (double eps : {1e-6, 1e-5, 1e-2}) {
    std::vector<double> y(x.size()), r(N);
    rmsnorm_forward<double>(y.data(), r.data(), x.data(), w.data(), N, C, eps);
    require_close(y, ref_rmsnorm(x, w, N, C, eps), 1e-13, 0, fmt::format("eps {}", eps));
  }
}

TEST_CASE("rmsnorm backward: finite differences in double, float against double") {
  const int N = 6, C = 20;
  const double eps = 1e-5;
  auto x = random_vec(N * C, -2.0, 2.0), w = random_vec(C, 0.5, 1.5), dout = random_vec(N * C);
  std::vector<double> y(x.size()), r(N), dx(x.size(), std::numeric_limits<double>::quiet_NaN()), dw(C, 0.0);
  rmsnorm_forward<double>(y.data(), r.data(), x.data(), w.data(), N, C, eps);
  rmsnorm_backward<double>(dx.data(), dw.data(), dout.data(), x.data(), w.data(), r.data(), N, C);
  fd_check(x, dx, [&] { return dot(dout, ref_rmsnorm(x, w, N, C, eps)); }, "dinp");
  fd_check(w, dw, [&] { return dot(dout, ref_rmsnorm(x, w, N, C, eps)); }, "dweight");

  auto xf = cast<float>(x), wf = cast<float>(w), doutf = cast<float>(dout);
  std::vector<float> yf(x.size()), rf(N), dxf(x.size()), dwf(C, 0.0f);
  rmsnorm_forward<float>(yf.data(), rf.data(), xf.data(), wf.data(), N, C, eps);
  rmsnorm_backward<float>(dxf.data(), dwf.data(), doutf.data(), xf.data(), wf.data(), rf.data(), N, C);
  require_close(dxf, dx, 1e-5, 1e-5 * max_abs(dx), "float dinp");
  require_close(dwf, dw, 1e-5, 1e-5 * max_abs(dw), "float dweight");
}

TEST_CASE("rmsnorm backward: accumulate adds to dinp, dweight always accumulates, dweight optional") {
  for (auto [N, C] : {std::pair{5, 24}, std::pair{260, 160}}) {
    auto x = cast<float>(random_vec(static_cast<size_t>(N) * C)), w = cast<float>(random_vec(C, 0.5, 1.5)),
         dout = cast<float>(random_vec(static_cast<size_t>(N) * C));
    std::vector<float> y(x.size()), r(N);
    rmsnorm_forward<float>(y.data(), r.data(), x.data(), w.data(), N, C, 1e-6);
    std::vector<float> over(x.size()), dw1(C, 0.0f);
    rmsnorm_backward<float>(over.data(), dw1.data(), dout.data(), x.data(), w.data(), r.data(), N, C);
    const auto prior = cast<float>(random_vec(x.size())), dw_prior = cast<float>(random_vec(C));
    auto acc = prior;
    auto dw2 = dw_prior;
    rmsnorm_backward<float>(acc.data(), dw2.data(), dout.data(), x.data(), w.data(), r.data(), N, C,
                            GradMode::accumulate);
    std::vector<double> want(x.size()), want_dw(C);
    for (size_t i = 0; i < x.size(); ++i) want[i] = static_cast<float>(prior[i] + over[i]);
    for (int c = 0; c < C; ++c) want_dw[c] = static_cast<float>(dw_prior[c] + dw1[c]);
    require_close(acc, want, 0, 0, "accumulated dinp = prior + overwritten dinp");
    require_close(dw2, want_dw, 0, 0, "dweight += (from a non-zero start)");
    std::vector<float> again(x.size());
    rmsnorm_backward<float>(again.data(), nullptr, dout.data(), x.data(), w.data(), r.data(), N, C);
    CHECK(again == over);
  }
}

TEST_CASE("rmsnorm gives the same bits with one thread and many") {
  const int N = 300, C = 200;
  auto x = cast<float>(random_vec(N * C)), w = cast<float>(random_vec(C, 0.5, 1.5)), dout = cast<float>(random_vec(N * C));
  auto run = [&](int threads) {
    const int keep = omp_get_max_threads();
    omp_set_num_threads(threads);
    std::vector<float> y(x.size()), r(N), dx(x.size()), dw(C, 0.0f);
    rmsnorm_forward<float>(y.data(), r.data(), x.data(), w.data(), N, C, 1e-5);
    rmsnorm_backward<float>(dx.data(), dw.data(), dout.data(), x.data(), w.data(), r.data(), N, C);
    omp_set_num_threads(keep);
    y.insert(y.end(), dx.begin(), dx.end());
    y.insert(y.end(), dw.begin(), dw.end());
    return y;
  };
  CHECK(run(1) == run(4));
}

TEST_CASE("rmsnorm rejects bad arguments naming them") {
  std::vector<float> v(8, 1.0f), r(2);
  CHECK_THROWS_WITH(rmsnorm_forward<float>(v.data(), r.data(), v.data(), v.data(), 0, 4, 1e-5),
                    Contains("rmsnorm_forward") && Contains("N must be positive"));
  CHECK_THROWS_WITH(rmsnorm_forward<float>(v.data(), r.data(), v.data(), v.data(), 2, -4, 1e-5),
                    Contains("C must be positive"));
  CHECK_THROWS_WITH(rmsnorm_forward<float>(v.data(), r.data(), v.data(), nullptr, 2, 4, 1e-5),
                    Contains("weight is null"));
  CHECK_THROWS_WITH(rmsnorm_forward<float>(v.data(), r.data(), v.data(), v.data(), 2, 4, -1.0), Contains("eps"));
  CHECK_THROWS_WITH(rmsnorm_backward<float>(v.data(), v.data(), v.data(), v.data(), v.data(), nullptr, 2, 4),
                    Contains("rmsnorm_backward") && Contains("rstd is null"));
  CHECK_THROWS_WITH(rmsnorm_backward<float>(nullptr, v.data(), v.data(), v.data(), v.data(), r.data(), 2, 4),
                    Contains("dinp is null"));
}
