// Grouped-query attention (NKV key/value heads shared by NH / NKV query heads each) against the
// multi-head path on an explicit repeat-kv expansion of the same qkv; its backward against the
// expansion's gradients summed over each group, and by finite differences in double; NKV = NH and
// NKV = 0 give the same bits; the same bits for any thread count; argument checks.
#include <catch2/catch.hpp>

#include <omp.h>

#include <cmath>
#include <limits>

#include "triax/core/error.h"
#include "triax/ops/attention.h"
#include "unit/ops_testing.h"

using namespace triax::ops;
using namespace triax::test;
using Catch::Matchers::Contains;

namespace {

// qkv (B*T rows of C + 2 NKV hs) -> (B*T rows of 3C): key/value head g copied to query heads
// g*group .. (g+1)*group - 1, as HF's repeat_kv.
template <class T>
std::vector<T> repeat_kv(const std::vector<T>& qkv, int rows, int NH, int NKV, int hs) {
  const int C = NH * hs, group = NH / NKV, w = C + 2 * NKV * hs;
  std::vector<T> out(static_cast<size_t>(rows) * 3 * C);
  for (int r = 0; r < rows; ++r) {
    const T* src = &qkv[static_cast<size_t>(r) * w];
    T* dst = &out[static_cast<size_t>(r) * 3 * C];
    for (int c = 0; c < C; ++c) dst[c] = src[c];
    for (int h = 0; h < NH; ++h)
      for (int c = 0; c < hs; ++c) {
        dst[C + h * hs + c] = src[C + (h / group) * hs + c];
        dst[2 * C + h * hs + c] = src[C + (NKV + h / group) * hs + c];
      }
  }
  return out;
}

// The transpose of repeat_kv: q gradients copied, each kv head's gradient summed over its group.
std::vector<double> sum_kv(const std::vector<double>& d3, int rows, int NH, int NKV, int hs) {
  const int C = NH * hs, group = NH / NKV, w = C + 2 * NKV * hs;
  std::vector<double> out(static_cast<size_t>(rows) * w, 0.0);
  for (int r = 0; r < rows; ++r) {
    const double* src = &d3[static_cast<size_t>(r) * 3 * C];
    double* dst = &out[static_cast<size_t>(r) * w];
    for (int c = 0; c < C; ++c) dst[c] = src[c];
    for (int h = 0; h < NH; ++h)
      for (int c = 0; c < hs; ++c) {
        dst[C + (h / group) * hs + c] += src[C + h * hs + c];
        dst[C + (NKV + h / group) * hs + c] += src[2 * C + h * hs + c];
      }
  }
  return out;
}

}  // namespace

TEST_CASE("grouped-query attention equals multi-head attention on repeated key/value heads") {
  struct Shape {
    int B, T, NH, NKV, hs;
  };
  // Group sizes 2, 4 and 8 (one kv head); T past one query block; the last runs in parallel.
  for (const Shape s : {Shape{2, 9, 4, 2, 8}, Shape{1, 70, 8, 2, 4}, Shape{2, 33, 8, 1, 6}, Shape{3, 130, 8, 4, 16}}) {
    INFO("B " << s.B << " T " << s.T << " NH " << s.NH << " NKV " << s.NKV << " hs " << s.hs);
    const int C = s.NH * s.hs, rows = s.B * s.T;
    auto qkv = random_vec(static_cast<size_t>(rows) * (C + 2 * s.NKV * s.hs), -2.0, 2.0);
    auto dout = random_vec(static_cast<size_t>(rows) * C);
    const auto qkv3 = repeat_kv(qkv, rows, s.NH, s.NKV, s.hs);
    // The multi-head path (NKV = NH, tested against its own naive reference) on the expansion.
    std::vector<double> out3(rows * C), lse3(s.B * s.NH * s.T), d3(qkv3.size());
    attention_forward<double>(out3.data(), lse3.data(), qkv3.data(), s.B, s.T, C, s.NH);
    attention_backward<double>(d3.data(), dout.data(), qkv3.data(), lse3.data(), s.B, s.T, C, s.NH);
    const auto want_d = sum_kv(d3, rows, s.NH, s.NKV, s.hs);

    std::vector<double> out(rows * C), lse(lse3.size()), dq(qkv.size(), std::numeric_limits<double>::quiet_NaN());
    attention_forward<double>(out.data(), lse.data(), qkv.data(), s.B, s.T, C, s.NH, s.NKV);
    attention_backward<double>(dq.data(), dout.data(), qkv.data(), lse.data(), s.B, s.T, C, s.NH, s.NKV);
    require_close(out, out3, 1e-13, 1e-13, "double out");
    require_close(lse, lse3, 1e-13, 1e-13, "double lse");
    require_close(dq, want_d, 1e-12, 1e-12 * max_abs(want_d), "double dqkv");

    auto qf = cast<float>(qkv), doutf = cast<float>(dout);
    std::vector<float> of(out.size()), lf(lse.size()), dqf(qkv.size(), std::numeric_limits<float>::quiet_NaN());
    attention_forward<float>(of.data(), lf.data(), qf.data(), s.B, s.T, C, s.NH, s.NKV);
    attention_backward<float>(dqf.data(), doutf.data(), qf.data(), lf.data(), s.B, s.T, C, s.NH, s.NKV);
    require_close(of, out, 2e-5, 2e-5, "float out");
    require_close(dqf, dq, 1e-4, 1e-4 * max_abs(dq), "float dqkv");
  }
}

TEST_CASE("grouped-query attention backward: finite differences in double") {
  const int B = 2, T = 5, NH = 4, NKV = 2, hs = 3, C = NH * hs;
  auto qkv = random_vec(static_cast<size_t>(B) * T * (C + 2 * NKV * hs)), dout = random_vec(B * T * C);
  std::vector<double> out(B * T * C), lse(B * NH * T), dq(qkv.size());
  attention_forward<double>(out.data(), lse.data(), qkv.data(), B, T, C, NH, NKV);
  attention_backward<double>(dq.data(), dout.data(), qkv.data(), lse.data(), B, T, C, NH, NKV);
  fd_check(qkv, dq,
           [&] {
             std::vector<double> o(B * T * C), l(B * NH * T);
             attention_forward<double>(o.data(), l.data(), qkv.data(), B, T, C, NH, NKV);
             return dot(dout, o);
           },
           "dqkv");
}

TEST_CASE("attention with NKV = NH or 0 is the multi-head op, bit for bit, for any thread count") {
  const int B = 2, T = 80, NH = 4, hs = 8, C = NH * hs;
  auto qkv = cast<float>(random_vec(static_cast<size_t>(B) * T * 3 * C)), dout = cast<float>(random_vec(B * T * C));
  auto run = [&](int nkv, int threads) {
    const int keep = omp_get_max_threads();
    omp_set_num_threads(threads);
    std::vector<float> o(B * T * C), l(B * NH * T), d(qkv.size());
    attention_forward<float>(o.data(), l.data(), qkv.data(), B, T, C, NH, nkv);
    attention_backward<float>(d.data(), dout.data(), qkv.data(), l.data(), B, T, C, NH, nkv);
    omp_set_num_threads(keep);
    o.insert(o.end(), l.begin(), l.end());
    o.insert(o.end(), d.begin(), d.end());
    return o;
  };
  const auto base = run(0, 4);
  CHECK(run(NH, 4) == base);
  CHECK(run(0, 1) == base);
  // Grouped: the same bits with one thread and several.
  const int NKV = 2, w = C + 2 * NKV * hs;
  std::vector<float> g(qkv.begin(), qkv.begin() + static_cast<size_t>(B) * T * w);
  auto grouped = [&](int threads) {
    const int keep = omp_get_max_threads();
    omp_set_num_threads(threads);
    std::vector<float> o(B * T * C), l(B * NH * T), d(g.size());
    attention_forward<float>(o.data(), l.data(), g.data(), B, T, C, NH, NKV);
    attention_backward<float>(d.data(), dout.data(), g.data(), l.data(), B, T, C, NH, NKV);
    omp_set_num_threads(keep);
    o.insert(o.end(), d.begin(), d.end());
    return o;
  };
  CHECK(grouped(1) == grouped(4));
}

TEST_CASE("grouped-query attention rejects a kv head count that does not divide the heads") {
  std::vector<float> v(2 * 24, 1.0f), o(2 * 12), l(2 * 6);
  CHECK_THROWS_WITH(attention_forward<float>(o.data(), l.data(), v.data(), 1, 2, 12, 6, 4),
                    Contains("attention_forward") && Contains("NKV=4") && Contains("NH=6"));
  CHECK_THROWS_WITH(attention_backward<float>(v.data(), o.data(), v.data(), l.data(), 1, 2, 12, 6, 12),
                    Contains("attention_backward") && Contains("NKV=12"));
  CHECK_THROWS_WITH(attention_forward<float>(o.data(), l.data(), v.data(), 1, 2, 12, 6, -2), Contains("NKV must be"));
}
