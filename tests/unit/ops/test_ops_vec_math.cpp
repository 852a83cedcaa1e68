// The vectorisable float exp and tanh against libm in double, over the whole range the ops use.
#include <catch2/catch.hpp>

#include <cmath>
#include <fmt/format.h>

#include "triax/ops/vec_math.h"

using triax::ops::vexp;
using triax::ops::vtanh;

TEST_CASE("vexp is within 2 ulp of exp on [-87.3, 88]") {
  double worst = 0, worst_x = 0;
  for (int i = 0; i <= 2000000; ++i) {
    const float x = -87.3f + (87.3f + 88.0f) * static_cast<float>(i) / 2000000.0f;
    const double want = std::exp(static_cast<double>(x));
    const double got = vexp(x);
    const double ulp = std::nextafter(static_cast<float>(want), INFINITY) - static_cast<float>(want);
    const double err = std::abs(got - want) / ulp;
    if (err > worst) worst = err, worst_x = x;
  }
  INFO(fmt::format("worst {:.3f} ulp at x = {}", worst, worst_x));
  CHECK(worst <= 2.0);
}

TEST_CASE("vexp edge values") {
  CHECK(vexp(0.0f) == 1.0f);
  CHECK(vexp(-88.0f) == 0.0f);    // below the normal range: flushed to 0
  CHECK(vexp(-1e30f) == 0.0f);
  CHECK(vexp(-INFINITY) == 0.0f);  // exp(-inf - max) in softmax of masked columns
  CHECK(std::isfinite(vexp(1000.0f)));
  CHECK(vexp(1.0) == std::exp(1.0));  // the double overload is libm
}

TEST_CASE("vtanh has absolute error below 3e-7") {
  double worst = 0;
  for (int i = 0; i <= 400000; ++i) {
    const float x = -20.0f + 40.0f * static_cast<float>(i) / 400000.0f;
    worst = std::max(worst, std::abs(static_cast<double>(vtanh(x)) - std::tanh(static_cast<double>(x))));
  }
  INFO(worst);
  CHECK(worst < 3e-7);
  CHECK(vtanh(100.0f) == 1.0f);
  CHECK(vtanh(-100.0f) == -1.0f);
  CHECK(vtanh(0.0f) == 0.0f);
}
