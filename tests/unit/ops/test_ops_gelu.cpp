// GELU (tanh form) and the residual add against direct formulas in double; gradients by finite
// differences in double, float against double.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "triax/core/error.h"
#include "triax/ops/gelu.h"
#include "triax/ops/residual.h"
#include "unit/ops_testing.h"

using namespace triax::ops;
using namespace triax::test;
using Catch::Matchers::Contains;

namespace {

std::vector<double> ref_gelu(const std::vector<double>& x) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    y[i] = 0.5 * x[i] * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
  return y;
}

}  // namespace

TEST_CASE("gelu forward matches the formula") {
  for (size_t n : {size_t{37}, size_t{100000}}) {  // the second runs in parallel
    auto x = random_vec(n, -6.0, 6.0);
    auto want = ref_gelu(x);
    auto xf = cast<float>(x);
    std::vector<float> y(n, std::numeric_limits<float>::quiet_NaN());
    gelu_forward<float>(y.data(), xf.data(), static_cast<int64_t>(n));
    require_close(y, want, 2e-6, 2e-6, "float");
    std::vector<double> yd(n);
    gelu_forward<double>(yd.data(), x.data(), static_cast<int64_t>(n));
    require_close(yd, want, 1e-15, 1e-15, "double");
    gelu_forward<float>(xf.data(), xf.data(), static_cast<int64_t>(n));  // in place
    require_close(xf, want, 2e-6, 2e-6, "float in place");
  }
}

TEST_CASE("gelu backward: finite differences in double, float against double") {
  const int n = 200;
  auto x = random_vec(n, -5.0, 5.0), dout = random_vec(n);
  std::vector<double> dx(n, std::numeric_limits<double>::quiet_NaN());
  gelu_backward<double>(dx.data(), x.data(), dout.data(), n);
  fd_check(x, dx, [&] { return dot(dout, ref_gelu(x)); }, "dinp");
  auto xf = cast<float>(x), doutf = cast<float>(dout);
  std::vector<float> dxf(n);
  gelu_backward<float>(dxf.data(), xf.data(), doutf.data(), n);
  require_close(dxf, dx, 2e-6, 2e-6, "float dinp");
  gelu_backward<float>(doutf.data(), xf.data(), doutf.data(), n);  // dinp aliasing dout
  require_close(doutf, dx, 2e-6, 2e-6, "float dinp in place");
}

TEST_CASE("gelu rejects bad arguments") {
  std::vector<float> v(4, 1.0f);
  CHECK_THROWS_WITH(gelu_forward<float>(v.data(), v.data(), -1), Contains("negative"));
  CHECK_THROWS_WITH(gelu_forward<float>(v.data(), nullptr, 4), Contains("inp is null"));
  CHECK_THROWS_WITH(gelu_backward<float>(v.data(), v.data(), nullptr, 4), Contains("dout is null"));
  CHECK_NOTHROW(gelu_forward<float>(nullptr, nullptr, 0));
}

TEST_CASE("residual add and its backward") {
  for (size_t n : {size_t{33}, size_t{70000}}) {
    auto a = random_vec(n), b = random_vec(n), dout = random_vec(n), da0 = random_vec(n), db0 = random_vec(n);
    auto af = cast<float>(a), bf = cast<float>(b), doutf = cast<float>(dout), daf = cast<float>(da0),
         dbf = cast<float>(db0);
    std::vector<double> sum(n), da(n), db(n);
    for (size_t i = 0; i < n; ++i) {
      sum[i] = static_cast<double>(af[i]) + static_cast<double>(bf[i]);
      da[i] = static_cast<double>(daf[i]) + static_cast<double>(doutf[i]);
      db[i] = static_cast<double>(dbf[i]) + static_cast<double>(doutf[i]);
    }
    std::vector<float> out(n);
    residual_forward<float>(out.data(), af.data(), bf.data(), static_cast<int64_t>(n));
    require_close(out, sum, 6e-8, 0, "out");  // one rounding
    residual_backward<float>(daf.data(), dbf.data(), doutf.data(), static_cast<int64_t>(n));
    require_close(daf, da, 6e-8, 0, "da");
    require_close(dbf, db, 6e-8, 0, "db");
    residual_forward<float>(af.data(), af.data(), bf.data(), static_cast<int64_t>(n));  // in place
    require_close(af, sum, 6e-8, 0, "out in place");
  }
  // Finite differences in double for completeness: the gradient of sum(w * (a + b)) is w for both.
  auto a = random_vec(10), b = random_vec(10), w = random_vec(10);
  std::vector<double> da(10, 0.0), db(10, 0.0), out(10);
  residual_backward<double>(da.data(), db.data(), w.data(), 10);
  auto loss = [&] {
    residual_forward<double>(out.data(), a.data(), b.data(), 10);
    return dot(w, out);
  };
  fd_check(a, da, loss, "da");
  fd_check(b, db, loss, "db");
}

TEST_CASE("residual rejects aliasing dout and null inputs") {
  std::vector<float> v(4, 1.0f), w(4, 1.0f);
  CHECK_THROWS_WITH(residual_backward<float>(v.data(), w.data(), v.data(), 4), Contains("da aliases dout"));
  CHECK_THROWS_WITH(residual_backward<float>(w.data(), v.data(), v.data(), 4), Contains("db aliases dout"));
  CHECK_THROWS_WITH(residual_forward<float>(v.data(), nullptr, v.data(), 4), Contains("a is null"));
  CHECK_THROWS_WITH(residual_backward<float>(v.data(), nullptr, nullptr, 4), Contains("dout is null"));
}
