// Shared by the test_ops_* tests: fresh random inputs (never zeros), float/double conversion,
// element-wise closeness with the worst element reported, and a central finite-difference
// gradient check in double precision.
#pragma once
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "triax/core/env.h"

namespace triax::test {

// A fresh seed per run, printed; TRIAX_TEST_SEED=<n> replays one.
inline std::mt19937_64& rng() {
  static std::mt19937_64 g([] {
    const auto given = env_int_opt("TRIAX_TEST_SEED", 0, std::numeric_limits<int64_t>::max());
    const uint64_t s = given ? static_cast<uint64_t>(*given) : std::random_device{}();
    fmt::print("test seed {}\n", s);
    return s;
  }());
  return g;
}

// Uniform in [lo, hi), resampled away from a small band around 0 so no element is (almost) zero.
inline std::vector<double> random_vec(size_t n, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) {
    do x = u(rng());
    while (std::abs(x) < 1e-3);
  }
  return v;
}

inline std::vector<int32_t> random_ints(size_t n, int32_t lo, int32_t hi_exclusive) {
  std::uniform_int_distribution<int32_t> u(lo, hi_exclusive - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = u(rng());
  return v;
}

template <class To, class From>
std::vector<To> cast(const std::vector<From>& v) {
  return std::vector<To>(v.begin(), v.end());
}

// Every |got - want| <= atol + rtol * |want|; on failure names the worst element.
template <class T>
void require_close(const std::vector<T>& got, const std::vector<double>& want, double rtol, double atol,
                   const std::string& what) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  size_t worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]);
    const double err = std::abs(g - want[i]);
    const double excess = err - (atol + rtol * std::abs(want[i]));
    if (!(excess <= 0) && (!(worst_excess > 0) || excess > worst_excess || std::isnan(g))) {
      worst = i;
      worst_excess = std::isnan(g) ? INFINITY : excess;
    }
  }
  if (worst_excess > 0) {
    FAIL(fmt::format("{}: element {} is {:.9g}, expected {:.9g} (|err| {:.3g} > {:.3g} + {:.3g} * |want|)", what, worst,
                     static_cast<double>(got[worst]), want[worst],
                     std::abs(static_cast<double>(got[worst]) - want[worst]), atol, rtol));
  }
}

// Largest |x| of a vector: the scale against which absolute tolerances are set.
template <class T>
double max_abs(const std::vector<T>& v) {
  double m = 0;
  for (auto x : v) m = std::max(m, std::abs(static_cast<double>(x)));
  return m;
}

// Central finite differences of a scalar loss with respect to every element of x (or `samples`
// evenly spaced ones when x is large), compared with `analytic`. The tolerance is relative to the
// largest gradient: |fd - an| <= tol * max(1, max|an|).
inline void fd_check(std::vector<double>& x, const std::vector<double>& analytic, const std::function<double()>& loss,
                     const std::string& what, double tol = 1e-7, double h = 1e-5, size_t samples = 400) {
  INFO(what);
  REQUIRE(x.size() == analytic.size());
  const double scale = std::max(1.0, max_abs(analytic));
  const size_t step = std::max<size_t>(1, x.size() / samples);
  for (size_t i = 0; i < x.size(); i += step) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = loss();
    x[i] = keep - h;
    const double down = loss();
    x[i] = keep;
    const double fd = (up - down) / (2 * h);
    if (std::abs(fd - analytic[i]) > tol * scale)
      FAIL(fmt::format("{}: d loss / d x[{}] is {:.12g} by finite differences, {:.12g} by backward", what, i, fd,
                       analytic[i]));
  }
}

// sum_i w_i * y_i: the loss whose gradient with respect to y is w.
inline double dot(const std::vector<double>& w, const std::vector<double>& y) {
  double s = 0;
  for (size_t i = 0; i < w.size(); ++i) s += w[i] * y[i];
  return s;
}

}  // namespace triax::test
