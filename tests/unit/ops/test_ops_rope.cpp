// RoPE against HF's formula x * cos + rotate_half(x) * sin written directly in double, with
// tables from GptConfig::rope_inv_freq (llama3 scaling on); backward by finite differences in
// double and as the exact inverse; float against double; argument checks. And rope_inv_freq
// itself against the llama3 formula (HF's _compute_llama3_parameters) computed here by hand, one
// frequency of each band.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "triax/core/error.h"
#include "triax/model/config.h"
#include "triax/ops/rope.h"
#include "unit/ops_testing.h"

using namespace triax;
using namespace triax::ops;
using namespace triax::test;
using Catch::Matchers::Contains;

namespace {

struct Tables {
  std::vector<double> cos, sin;  // (T, HD/2)
};

Tables tables_from(const std::vector<double>& inv_freq, int T) {
  const size_t H2 = inv_freq.size();
  Tables t{std::vector<double>(T * H2), std::vector<double>(T * H2)};
  for (int p = 0; p < T; ++p)
    for (size_t i = 0; i < H2; ++i) {
      t.cos[p * H2 + i] = std::cos(p * inv_freq[i]);
      t.sin[p * H2 + i] = std::sin(p * inv_freq[i]);
    }
  return t;
}

// HF: cos and sin repeated twice along HD (emb = cat(freqs, freqs)), rotate_half(x) = cat(-x2, x1),
// x_rot = x * cos + rotate_half(x) * sin, on the NH q and NKV k heads; v heads copied.
std::vector<double> ref_rope(const std::vector<double>& qkv, const Tables& tb, int B, int T, int NH, int NKV, int HD) {
  const int H2 = HD / 2, width = (NH + 2 * NKV) * HD;
  std::vector<double> out = qkv;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int hd = 0; hd < NH + NKV; ++hd) {
        const double* x = &qkv[(static_cast<size_t>(b) * T + t) * width + hd * HD];
        double* y = &out[(static_cast<size_t>(b) * T + t) * width + hd * HD];
        for (int d = 0; d < HD; ++d) {
          const double c = tb.cos[t * H2 + d % H2], s = tb.sin[t * H2 + d % H2];
          const double rot = d < H2 ? -x[d + H2] : x[d - H2];
          y[d] = x[d] * c + rot * s;
        }
      }
  return out;
}

GptConfig scaled_tiny() {
  GptConfig c = GptConfig::preset("llama-tiny");
  c.rope_theta = 500000.0;
  // A short original context, so that this head size has frequencies in all three bands.
  c.rope_scaling = RopeScaling{true, 8.0, 1.0, 4.0, 64};
  return c;
}

}  // namespace

TEST_CASE("rope forward matches HF's rotate-half formula (llama3-scaled table), float and double") {
  const GptConfig cfg = scaled_tiny();
  const int HD = cfg.head_dim(), NH = cfg.n_head, NKV = cfg.kv_heads();
  for (int B : {1, 8}) {
    const int T = B == 1 ? 5 : 64;  // the second runs in parallel
    const Tables tb = tables_from(cfg.rope_inv_freq(), T);
    auto qkv = random_vec(static_cast<size_t>(B) * T * (NH + 2 * NKV) * HD, -2.0, 2.0);
    const auto want = ref_rope(qkv, tb, B, T, NH, NKV, HD);
    auto got = qkv;
    rope_forward<double>(got.data(), tb.cos.data(), tb.sin.data(), B, T, NH, NKV, HD);
    require_close(got, want, 1e-15, 1e-15, "double");
    // The value heads are untouched, bit for bit.
    const int width = (NH + 2 * NKV) * HD;
    for (int r = 0; r < B * T; ++r)
      for (int c = (NH + NKV) * HD; c < width; ++c) REQUIRE(got[r * width + c] == qkv[r * width + c]);
    auto gf = cast<float>(qkv), cf = cast<float>(tb.cos), sf = cast<float>(tb.sin);
    rope_forward<float>(gf.data(), cf.data(), sf.data(), B, T, NH, NKV, HD);
    const Tables tbf{cast<double>(cf), cast<double>(sf)};
    require_close(gf, ref_rope(cast<double>(cast<float>(qkv)), tbf, B, T, NH, NKV, HD), 1e-6, 1e-6, "float");
  }
}

TEST_CASE("rope with NKV = 0 means NH heads of keys") {
  const int B = 2, T = 7, NH = 3, HD = 6;
  std::vector<double> inv{1.0, 0.1, 0.01};
  const Tables tb = tables_from(inv, T);
  auto qkv = random_vec(static_cast<size_t>(B) * T * 3 * NH * HD);
  auto a = qkv, b = qkv;
  rope_forward<double>(a.data(), tb.cos.data(), tb.sin.data(), B, T, NH, 0, HD);
  rope_forward<double>(b.data(), tb.cos.data(), tb.sin.data(), B, T, NH, NH, HD);
  CHECK(a == b);
  require_close(a, ref_rope(qkv, tb, B, T, NH, NH, HD), 1e-15, 1e-15, "NKV=0");
}

TEST_CASE("rope backward: finite differences in double, the inverse rotation, float against double") {
  const GptConfig cfg = scaled_tiny();
  const int B = 2, T = 6, HD = cfg.head_dim(), NH = cfg.n_head, NKV = cfg.kv_heads();
  const Tables tb = tables_from(cfg.rope_inv_freq(), T);
  auto x = random_vec(static_cast<size_t>(B) * T * (NH + 2 * NKV) * HD), dout = random_vec(x.size());
  auto dx = dout;
  rope_backward<double>(dx.data(), tb.cos.data(), tb.sin.data(), B, T, NH, NKV, HD);
  fd_check(x, dx, [&] { return dot(dout, ref_rope(x, tb, B, T, NH, NKV, HD)); }, "dqkv");
  // A rotation's inverse: backward after forward gives the input back.
  auto y = x;
  rope_forward<double>(y.data(), tb.cos.data(), tb.sin.data(), B, T, NH, NKV, HD);
  rope_backward<double>(y.data(), tb.cos.data(), tb.sin.data(), B, T, NH, NKV, HD);
  require_close(y, x, 1e-14, 1e-14, "backward(forward(x)) = x");
  auto df = cast<float>(dout), cf = cast<float>(tb.cos), sf = cast<float>(tb.sin);
  rope_backward<float>(df.data(), cf.data(), sf.data(), B, T, NH, NKV, HD);
  require_close(df, dx, 1e-6, 1e-6, "float dqkv");
}

TEST_CASE("rope rejects bad arguments naming them") {
  std::vector<float> v(64, 1.0f), c(16, 1.0f);
  CHECK_THROWS_WITH(rope_forward<float>(v.data(), c.data(), c.data(), 1, 2, 2, 1, 5),
                    Contains("rope_forward") && Contains("HD must be even"));
  CHECK_THROWS_WITH(rope_forward<float>(v.data(), nullptr, c.data(), 1, 2, 2, 1, 4), Contains("cos is null"));
  CHECK_THROWS_WITH(rope_backward<float>(v.data(), c.data(), nullptr, 1, 2, 2, 1, 4),
                    Contains("rope_backward") && Contains("sin is null"));
  CHECK_THROWS_WITH(rope_backward<float>(nullptr, c.data(), c.data(), 1, 2, 2, 1, 4), Contains("dqkv is null"));
  CHECK_THROWS_WITH(rope_forward<float>(v.data(), c.data(), c.data(), 1, 0, 2, 1, 4), Contains("T must be positive"));
  CHECK_THROWS_WITH(rope_forward<float>(v.data(), c.data(), c.data(), 1, 2, 2, -1, 4), Contains("NKV"));
}

// HF's llama3 rule, by hand: with wavelength w = 2 pi / f of the unscaled frequency f,
//   w > L / low   -> f / factor            (low frequencies: interpolated)
//   w < L / high  -> f                     (high frequencies: kept)
//   otherwise     -> f ((1 - a) / factor + a), a = (L / w - low) / (high - low)   (smoothed)
TEST_CASE("rope_inv_freq applies llama3 scaling per band, as HF's _compute_llama3_parameters") {
  GptConfig c;
  c.n_embd = 128;
  c.n_head = 1;  // head size 128, as Llama 3
  c.rope_theta = 500000.0;
  const double pi = std::acos(-1.0);
  const auto plain = c.rope_inv_freq();
  REQUIRE(plain.size() == 64);
  for (int i = 0; i < 64; ++i) CHECK(plain[i] == Approx(std::exp(-std::log(500000.0) * i / 64.0)).epsilon(1e-14));

  c.rope_scaling = RopeScaling{true, 8.0, 1.0, 4.0, 8192};
  const auto scaled = c.rope_inv_freq();
  REQUIRE(scaled.size() == 64);
  int low = 0, mid = 0, high = 0;
  for (int i = 0; i < 64; ++i) {
    const double f = plain[i], w = 2 * pi / f;
    double want;
    if (w > 8192.0 / 1.0) {
      want = f / 8.0;
      ++low;
    } else if (w < 8192.0 / 4.0) {
      want = f;
      ++high;
    } else {
      const double a = (8192.0 / w - 1.0) / (4.0 - 1.0);
      REQUIRE(a >= 0.0);
      REQUIRE(a <= 1.0);
      want = f * ((1.0 - a) / 8.0 + a);
      ++mid;
    }
    INFO("frequency " << i << " wavelength " << w);
    CHECK(scaled[i] == Approx(want).epsilon(1e-13));
  }
  // Theta 500000, head size 128, L = 8192: the bands hold i < 29, 29..34 and i > 34.
  CHECK(high == 29);
  CHECK(mid == 6);
  CHECK(low == 29);
  CHECK(scaled[0] == plain[0]);                                  // high: kept
  CHECK(scaled[63] == Approx(plain[63] / 8.0).epsilon(1e-15));  // low: divided by the factor
  const double w31 = 2 * pi / plain[31], a31 = (8192.0 / w31 - 1.0) / 3.0;
  CHECK(scaled[31] == Approx(plain[31] * ((1.0 - a31) / 8.0 + a31)).epsilon(1e-13));
  CHECK(scaled[31] < plain[31]);
  CHECK(scaled[31] > plain[31] / 8.0);
}
