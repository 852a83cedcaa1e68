// AdamW against a direct double transcription of the torch.optim.AdamW update (weight decay
// applied as p *= 1 - lr*wd before the Adam step), over several steps.
#include <catch2/catch.hpp>

#include <cmath>

#include "triax/core/error.h"
#include "triax/ops/adamw.h"
#include "unit/ops_testing.h"

using namespace triax::ops;
using namespace triax::test;
using Catch::Matchers::Contains;

namespace {

void ref_adamw(std::vector<double>& p, std::vector<double>& m, std::vector<double>& v, const std::vector<double>& g,
               const AdamWConfig& c, int step, double scale) {
  for (size_t i = 0; i < p.size(); ++i) {
    p[i] *= 1.0 - c.lr * c.weight_decay;
    const double gi = g[i] * scale;
    m[i] = c.beta1 * m[i] + (1 - c.beta1) * gi;
    v[i] = c.beta2 * v[i] + (1 - c.beta2) * gi * gi;
    const double mhat = m[i] / (1 - std::pow(c.beta1, step));
    const double vhat = v[i] / (1 - std::pow(c.beta2, step));
    p[i] -= c.lr * mhat / (std::sqrt(vhat) + c.eps);
  }
}

}  // namespace

TEST_CASE("adamw matches the reference over several steps") {
  const AdamWConfig cfg{.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  for (size_t n : {size_t{19}, size_t{100003}}) {  // the second runs in parallel
    auto p = random_vec(n), m = std::vector<double>(n, 0.0), v = std::vector<double>(n, 0.0);
    auto pf = cast<float>(p), mf = cast<float>(m), vf = cast<float>(v);
    p = cast<double>(pf);  // all three start from the same float-representable values
    auto pd = p, md = m, vd = v;
    for (int step = 1; step <= 5; ++step) {
      auto g = random_vec(n, -0.1, 0.1);
      const double scale = step == 3 ? 0.5 : 1.0;  // one clipped step
      auto gf = cast<float>(g);
      auto gd = cast<double>(gf);
      ref_adamw(p, m, v, gd, cfg, step, scale);
      adamw_step<float>(pf.data(), mf.data(), vf.data(), gf.data(), static_cast<int64_t>(n), cfg, step,
                        static_cast<float>(scale));
      adamw_step<double>(pd.data(), md.data(), vd.data(), gd.data(),
                         static_cast<int64_t>(n), cfg, step, scale);
    }
    require_close(pf, p, 1e-6, 1e-6, "float params");
    require_close(mf, m, 1e-5, 1e-8, "float m");
    require_close(vf, v, 1e-5, 1e-10, "float v");
    require_close(pd, p, 1e-13, 1e-13, "double params");
    require_close(md, m, 1e-13, 1e-16, "double m");
  }
}

TEST_CASE("adamw first step moves every parameter by about lr against its gradient sign") {
  // With zero moments, step 1 gives mhat/sqrt(vhat) = sign(g): an exactly predictable update.
  const AdamWConfig cfg{.lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-12, .weight_decay = 0.0};
  std::vector<float> p = {1.0f, -2.0f, 0.5f}, m(3, 0.0f), v(3, 0.0f), g = {0.3f, -4.0f, 1e-3f};
  adamw_step<float>(p.data(), m.data(), v.data(), g.data(), 3, cfg, 1);
  CHECK(p[0] == Approx(0.99f).epsilon(1e-6));
  CHECK(p[1] == Approx(-1.99f).epsilon(1e-6));
  CHECK(p[2] == Approx(0.49f).epsilon(1e-6));
}

TEST_CASE("adamw rejects bad hyper-parameters") {
  std::vector<float> x(4, 1.0f);
  auto run = [&](AdamWConfig c, int64_t step) { adamw_step<float>(x.data(), x.data(), x.data(), x.data(), 4, c, step); };
  CHECK_THROWS_WITH(run({}, 0), Contains("step counts from 1"));
  CHECK_THROWS_WITH(run({.lr = -1}, 1), Contains("learning rate -1"));
  CHECK_THROWS_WITH(run({.beta1 = 1.0}, 1), Contains("beta1 1"));
  CHECK_THROWS_WITH(run({.beta2 = -0.1}, 1), Contains("beta2 -0.1"));
  CHECK_THROWS_WITH(run({.eps = 0}, 1), Contains("eps 0"));
  CHECK_THROWS_WITH(run({.weight_decay = -0.5}, 1), Contains("weight_decay -0.5"));
  CHECK_THROWS_WITH(adamw_step<float>(x.data(), nullptr, x.data(), x.data(), 4, {}, 1), Contains("m is null"));
  CHECK_THROWS_WITH(adamw_step<float>(x.data(), x.data(), x.data(), x.data(), -4, {}, 1), Contains("negative"));
}
