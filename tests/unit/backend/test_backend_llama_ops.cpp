// The Llama block's Backend ops on the CPU (RMSNorm, SwiGLU, RoPE, grouped-query attention): the
// plain and the checking backend give the ops' own results bit for bit, in float32 and float64,
// and every op refuses a short buffer or a wrong dtype naming the op and the argument.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "triax/backend/backend.h"
#include "triax/ops/attention.h"
#include "triax/ops/rmsnorm.h"
#include "triax/ops/rope.h"
#include "triax/ops/swiglu.h"

using namespace triax;
using Catch::Matchers::Contains;

namespace {

constexpr int N = 6, C = 16, F = 10, B = 2, T = 3, NH = 4, NKV = 2, HD = C / NH, W = C + 2 * NKV * HD;

std::vector<double> rnd(size_t n, uint32_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = u(g);
  return v;
}

template <class R>
Tensor up(Backend& be, const std::vector<double>& v) {
  Tensor t = be.empty(Shape{static_cast<int64_t>(v.size())}, dtype_of<R>());
  std::vector<R> r(v.begin(), v.end());
  be.copy_from_host(t, r.data(), r.size() * sizeof(R));
  return t;
}

template <class R>
std::vector<R> down(Backend& be, const Tensor& t) {
  std::vector<R> r(static_cast<size_t>(t.numel()));
  be.copy_to_host(r.data(), t, r.size() * sizeof(R));
  return r;
}

// Every new op once through the backend, results in call order.
template <class R>
std::vector<std::vector<R>> run_backend(Backend& be) {
  std::vector<std::vector<R>> res;
  Tensor x = up<R>(be, rnd(N * C, 1)), w = up<R>(be, rnd(C, 2, 0.5, 1.5)), dy = up<R>(be, rnd(N * C, 3));
  Tensor y = be.empty(Shape{N * C}, dtype_of<R>()), rstd = be.empty(Shape{N}, dtype_of<R>());
  be.rmsnorm_forward(y, rstd, x, w, N, C, 1e-5);
  Tensor dx = up<R>(be, rnd(N * C, 4)), dw = be.zeros(Shape{C}, dtype_of<R>());
  be.rmsnorm_backward(dx, dw, dy, x, w, rstd, N, C, ops::GradMode::accumulate);
  for (const Tensor* t : {&y, &rstd, &dx, &dw}) res.push_back(down<R>(be, *t));
  Tensor h = up<R>(be, rnd(N * 2 * F, 5, -4, 4)), dout = up<R>(be, rnd(N * F, 6));
  Tensor o = be.empty(Shape{N * F}, dtype_of<R>()), dh = be.empty(Shape{N * 2 * F}, dtype_of<R>());
  be.swiglu_forward(o, h, N, F);
  be.swiglu_backward(dh, dout, h, N, F);
  for (const Tensor* t : {&o, &dh}) res.push_back(down<R>(be, *t));
  Tensor qkv = up<R>(be, rnd(B * T * W, 7)), cs = up<R>(be, rnd(T * HD / 2, 8)), sn = up<R>(be, rnd(T * HD / 2, 9));
  be.rope_forward(qkv, cs, sn, B, T, NH, NKV, HD);
  res.push_back(down<R>(be, qkv));
  Tensor att = be.empty(Shape{B * T * C}, dtype_of<R>()), lse = be.empty(Shape{B * NH * T}, dtype_of<R>());
  Tensor datt = up<R>(be, rnd(B * T * C, 10)), dqkv = be.empty(Shape{B * T * W}, dtype_of<R>());
  be.attention_forward(att, lse, qkv, B, T, C, NH, NKV);
  be.attention_backward(dqkv, datt, qkv, att, lse, B, T, C, NH, NKV);
  be.rope_backward(dqkv, cs, sn, B, T, NH, NKV, HD);
  for (const Tensor* t : {&att, &lse, &dqkv}) res.push_back(down<R>(be, *t));
  return res;
}

// The same sequence on the ops directly.
template <class R>
std::vector<std::vector<R>> run_ops() {
  auto v = [](const std::vector<double>& d) { return std::vector<R>(d.begin(), d.end()); };
  std::vector<std::vector<R>> res;
  auto x = v(rnd(N * C, 1)), w = v(rnd(C, 2, 0.5, 1.5)), dy = v(rnd(N * C, 3)), dx = v(rnd(N * C, 4));
  std::vector<R> y(N * C), rstd(N), dw(C, R(0));
  ops::rmsnorm_forward<R>(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5);
  ops::rmsnorm_backward<R>(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C,
                           ops::GradMode::accumulate);
  res.insert(res.end(), {y, rstd, dx, dw});
  auto h = v(rnd(N * 2 * F, 5, -4, 4)), dout = v(rnd(N * F, 6));
  std::vector<R> o(N * F), dh(N * 2 * F);
  ops::swiglu_forward<R>(o.data(), h.data(), N, F);
  ops::swiglu_backward<R>(dh.data(), dout.data(), h.data(), N, F);
  res.insert(res.end(), {o, dh});
  auto qkv = v(rnd(B * T * W, 7)), cs = v(rnd(T * HD / 2, 8)), sn = v(rnd(T * HD / 2, 9));
  ops::rope_forward<R>(qkv.data(), cs.data(), sn.data(), B, T, NH, NKV, HD);
  res.push_back(qkv);
  std::vector<R> att(B * T * C), lse(B * NH * T), dqkv(B * T * W);
  auto datt = v(rnd(B * T * C, 10));
  ops::attention_forward<R>(att.data(), lse.data(), qkv.data(), B, T, C, NH, NKV);
  ops::attention_backward<R>(dqkv.data(), datt.data(), qkv.data(), lse.data(), B, T, C, NH, NKV);
  ops::rope_backward<R>(dqkv.data(), cs.data(), sn.data(), B, T, NH, NKV, HD);
  res.insert(res.end(), {att, lse, dqkv});
  return res;
}

}  // namespace

TEST_CASE("the Llama ops through the cpu and checking backends are the ops, bit for bit", "[backend]") {
  const auto want32 = run_ops<float>();
  CHECK(run_backend<float>(*make_cpu_backend(DType::f32)) == want32);
  CHECK(run_backend<float>(*make_checked_cpu_backend(DType::f32)) == want32);
  const auto want64 = run_ops<double>();
  CHECK(run_backend<double>(*make_cpu_backend(DType::f64)) == want64);
  CHECK(run_backend<double>(*make_checked_cpu_backend(DType::f64)) == want64);
}

TEST_CASE("the Llama ops refuse short buffers and wrong dtypes, naming the op and the argument", "[backend]") {
  auto be = make_cpu_backend();
  auto f = [&](int64_t n) { return be->zeros(Shape{n}, DType::f32); };
  Tensor x = f(N * C), w = f(C), r = f(N), short_w = f(C - 1), d64 = be->zeros(Shape{N}, DType::f64);
  CHECK_THROWS_WITH(be->rmsnorm_forward(x, r, x, short_w, N, C, 1e-5),
                    Contains("rmsnorm_forward") && Contains("weight holds 15 elements, 16 needed"));
  CHECK_THROWS_WITH(be->rmsnorm_forward(x, d64, x, w, N, C, 1e-5),
                    Contains("rmsnorm_forward") && Contains("rstd is float64"));
  CHECK_THROWS_WITH(be->rmsnorm_backward(x, short_w, x, x, w, r, N, C),
                    Contains("rmsnorm_backward") && Contains("dweight holds 15"));
  CHECK_THROWS_WITH(be->rmsnorm_backward(x, w, x, x, w, f(N - 1), N, C), Contains("rstd holds 5 elements, 6 needed"));
  CHECK_THROWS_WITH(be->swiglu_forward(f(N * F), f(N * 2 * F - 1), N, F),
                    Contains("swiglu_forward") && Contains("h holds"));
  CHECK_THROWS_WITH(be->swiglu_backward(f(N * 2 * F), f(N * F - 1), f(N * 2 * F), N, F),
                    Contains("swiglu_backward") && Contains("dout holds"));
  // Grouped qkv holds B*T*(C + 2 NKV HD) elements: a 3C-wide buffer is too large to be refused,
  // one short of the grouped size is refused.
  CHECK_THROWS_WITH(be->rope_forward(f(B * T * W - 1), f(T * HD / 2), f(T * HD / 2), B, T, NH, NKV, HD),
                    Contains("rope_forward") && Contains("qkv holds"));
  CHECK_THROWS_WITH(be->rope_backward(f(B * T * W), f(T * HD / 2), f(T * HD / 2 - 1), B, T, NH, NKV, HD),
                    Contains("rope_backward") && Contains("sin holds"));
  CHECK_THROWS_WITH(be->attention_forward(f(B * T * C), f(B * NH * T), f(B * T * W - 1), B, T, C, NH, NKV),
                    Contains("attention_forward") && Contains("qkv holds"));
  CHECK_THROWS_WITH(be->attention_backward(f(B * T * W - 1), f(B * T * C), f(B * T * W), f(B * T * C), f(B * NH * T),
                                           B, T, C, NH, NKV),
                    Contains("attention_backward") && Contains("dqkv holds"));
  CHECK_THROWS_WITH(be->attention_forward(f(B * T * C), f(B * NH * T), f(B * T * 3 * C), B, T, C, NH, 3),
                    Contains("NKV=3") && Contains("NH=4"));
  CHECK_NOTHROW(be->attention_forward(f(B * T * C), f(B * NH * T), f(B * T * W), B, T, C, NH, NKV));
}
