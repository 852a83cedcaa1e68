// LayerNorm against a two-pass double reference; backward by finite differences (double) and
// float against double, in both input-gradient modes.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "triax/core/error.h"
#include "triax/ops/layernorm.h"
#include "unit/ops_testing.h"

using namespace triax::ops;
using namespace triax::test;
using Catch::Matchers::Contains;

namespace {

std::vector<double> ref_layernorm(const std::vector<double>& x, const std::vector<double>& w,
                                  const std::vector<double>& b, int N, int C, std::vector<double>* mean = nullptr,
                                  std::vector<double>* rstd = nullptr) {
  std::vector<double> out(x.size());
  for (int n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += x[n * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    v /= C;
    const double s = 1.0 / std::sqrt(v + 1e-5);
    for (int c = 0; c < C; ++c) out[n * C + c] = (x[n * C + c] - m) * s * w[c] + b[c];
    if (mean) (*mean)[n] = m;
    if (rstd) (*rstd)[n] = s;
  }
  return out;
}

}  // namespace

TEST_CASE("layernorm forward matches the reference") {
  for (auto [N, C] : {std::pair{5, 7}, std::pair{300, 200}, std::pair{64, 768}}) {
    // An offset and a scale in the input: the variance must not come from E[x^2] - m^2.
    auto x = random_vec(N * C, 2.0, 4.0), w = random_vec(C, 0.5, 1.5), b = random_vec(C);
    std::vector<double> m(N), s(N);
    auto want = ref_layernorm(x, w, b, N, C, &m, &s);
    auto xf = cast<float>(x), wf = cast<float>(w), bf = cast<float>(b);
    std::vector<float> out(N * C, std::numeric_limits<float>::quiet_NaN()), mf(N), sf(N);
    layernorm_forward<float>(out.data(), mf.data(), sf.data(), xf.data(), wf.data(), bf.data(), N, C);
    require_close(out, want, 1e-5, 1e-5, "float out");
    require_close(mf, m, 1e-6, 0, "float mean");
    require_close(sf, s, 1e-5, 0, "float rstd");
    std::vector<double> outd(N * C), md(N), sd(N);
    layernorm_forward<double>(outd.data(), md.data(), sd.data(), x.data(), w.data(), b.data(), N, C);
    require_close(outd, want, 1e-12, 1e-12, "double out");
  }
}

TEST_CASE("layernorm backward: finite differences in double, float against double") {
  for (auto [N, C] : {std::pair{4, 6}, std::pair{3, 70}}) {
    auto x = random_vec(N * C), w = random_vec(C, 0.5, 1.5), b = random_vec(C), dout = random_vec(N * C);
    std::vector<double> mean(N), rstd(N), out(N * C);
    layernorm_forward<double>(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    auto dw0 = random_vec(C), db0 = random_vec(C);
    std::vector<double> dx(N * C, std::numeric_limits<double>::quiet_NaN()), dw = dw0, db = db0;
    layernorm_backward<double>(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                               rstd.data(), N, C);
    std::vector<double> gw(C), gb(C);
    for (int c = 0; c < C; ++c) {
      gw[c] = dw[c] - dw0[c];
      gb[c] = db[c] - db0[c];
    }
    auto loss = [&] { return dot(dout, ref_layernorm(x, w, b, N, C)); };
    fd_check(x, dx, loss, "dinp");
    fd_check(w, gw, loss, "dweight");
    fd_check(b, gb, loss, "dbias");

    auto xf = cast<float>(x), wf = cast<float>(w), doutf = cast<float>(dout), mf = cast<float>(mean),
         sf = cast<float>(rstd);
    auto dx0 = random_vec(N * C);
    std::vector<float> dxf(N * C, std::numeric_limits<float>::quiet_NaN()), dxa = cast<float>(dx0),
        dwf = cast<float>(dw0), dbf = cast<float>(db0);
    layernorm_backward<float>(dxf.data(), dwf.data(), dbf.data(), doutf.data(), xf.data(), wf.data(), mf.data(),
                              sf.data(), N, C);
    layernorm_backward<float>(dxa.data(), nullptr, nullptr, doutf.data(), xf.data(), wf.data(), mf.data(), sf.data(), N,
                              C, GradMode::accumulate);
    const double scale = max_abs(dx);
    require_close(dxf, dx, 1e-5, 1e-5 * scale, "float dinp");
    require_close(dwf, dw, 1e-5, 1e-5, "float dweight");
    require_close(dbf, db, 1e-5, 1e-5, "float dbias");
    for (size_t i = 0; i < dx0.size(); ++i) dx0[i] += dx[i];
    require_close(dxa, dx0, 1e-5, 1e-5 * scale, "float dinp accumulated");
  }
}

TEST_CASE("layernorm backward on a large input (parallel rows and column blocks)") {
  const int N = 256, C = 200;
  auto x = random_vec(N * C), w = random_vec(C, 0.5, 1.5), b = random_vec(C), dout = random_vec(N * C);
  std::vector<double> mean(N), rstd(N), out(N * C), dx(N * C), dw(C, 0.0), db(C, 0.0);
  layernorm_forward<double>(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  layernorm_backward<double>(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(), rstd.data(),
                             N, C);
  // Reference weight/bias gradients: naive sums over rows.
  std::vector<double> want_w(C, 0.0), want_b(C, 0.0);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) {
      want_w[c] += dout[n * C + c] * (x[n * C + c] - mean[n]) * rstd[n];
      want_b[c] += dout[n * C + c];
    }
  require_close(dw, want_w, 1e-12, 1e-12, "dweight");
  require_close(db, want_b, 1e-12, 1e-12, "dbias");
  auto xf = cast<float>(x), wf = cast<float>(w), doutf = cast<float>(dout), mf = cast<float>(mean),
       sf = cast<float>(rstd);
  std::vector<float> dxf(N * C), dwf(C, 0.0f), dbf(C, 0.0f);
  layernorm_backward<float>(dxf.data(), dwf.data(), dbf.data(), doutf.data(), xf.data(), wf.data(), mf.data(), sf.data(),
                            N, C);
  require_close(dxf, dx, 1e-5, 1e-5 * max_abs(dx), "float dinp");
  require_close(dwf, dw, 1e-5, 1e-4, "float dweight");
  require_close(dbf, db, 1e-5, 1e-4, "float dbias");
}

TEST_CASE("layernorm rejects bad arguments") {
  std::vector<float> v(8, 1.0f);
  CHECK_THROWS_WITH(layernorm_forward<float>(v.data(), v.data(), v.data(), v.data(), v.data(), nullptr, 2, 4),
                    Contains("bias is null"));
  CHECK_THROWS_WITH(layernorm_forward<float>(v.data(), v.data(), v.data(), v.data(), v.data(), v.data(), 2, 0),
                    Contains("C must be positive"));
  CHECK_THROWS_WITH(layernorm_backward<float>(v.data(), v.data(), v.data(), v.data(), v.data(), v.data(), nullptr,
                                              v.data(), 2, 4),
                    Contains("mean is null"));
}
