// The vector paths of the element-wise, LayerNorm, softmax and AdamW kernels against the CPU ops, on the
// sizes and pointers that choose between them: sizes around multiples of the vector width (8 bf16
// or 4 fp32 per load, then a scalar tail), and pointers one element past an aligned address
// (everything scalar). Outputs are poisoned (all bits set: NaN) first, and the element after each
// output is checked untouched. Without a GPU the test reports "skipped" (tests/support/cuda_main.cpp).
#include <catch2/catch.hpp>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "support/cuda_buffer.h"
#include "triax/core/cuda_check.h"
#include "triax/cuda/adamw.h"
#include "triax/cuda/gelu.h"
#include "triax/cuda/layernorm.h"
#include "triax/cuda/residual.h"
#include "triax/cuda/softmax_xent.h"
#include "triax/ops/adamw.h"
#include "triax/ops/gelu.h"
#include "triax/ops/layernorm.h"
#include "triax/ops/residual.h"
#include "triax/ops/softmax_xent.h"
#include "unit/ops_testing.h"

using namespace triax;
using triax::test::DeviceBuffer;

namespace {

template <class T>
double to_d(T x) {
  if constexpr (std::is_same_v<T, bf16>) return static_cast<float>(x);
  else return static_cast<double>(x);
}
template <class T>
T from_d(double x) {
  if constexpr (std::is_same_v<T, bf16>) return T(static_cast<float>(x));
  else return static_cast<T>(x);
}
template <class T>
constexpr double tol() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-2;
}

// n + 2 random values representable in T (one spare element before and after), and their doubles.
template <class T>
struct Padded {
  std::vector<T> dev;
  std::vector<double> ref;  // the n values at offset `off`
};
template <class T>
Padded<T> padded(size_t n, size_t off, double lo = -2.0, double hi = 2.0) {
  const auto v = test::random_vec(n + 2, lo, hi);
  Padded<T> p;
  for (double x : v) p.dev.push_back(from_d<T>(x));
  for (size_t i = 0; i < n; ++i) p.ref.push_back(to_d(p.dev[off + i]));
  return p;
}

void poison(void* p, size_t bytes) {
  TRIAX_CHECK_CUDA(cudaMemset(p, 0xff, bytes));
  TRIAX_CHECK_CUDA(cudaDeviceSynchronize());
}

// The n outputs at offset off match want; the spare element after them is still poison.
template <class T>
void check(const std::string& what, const DeviceBuffer<T>& buf, size_t off, const std::vector<double>& want) {
  TRIAX_CHECK_CUDA(cudaDeviceSynchronize());
  const auto host = buf.download();
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double got = to_d(host[off + i]);
    num = std::isfinite(got) ? std::max(num, std::abs(got - want[i])) : INFINITY;
    den = std::max(den, std::abs(want[i]));
  }
  const double err = den > 0 ? num / den : num;
  fmt::print("kernel {:<48} rel_err {:.3e} tol {:.0e}\n", what, err, tol<T>());
  INFO(what << ": relative error " << err);
  CHECK(err <= tol<T>());
  INFO(what << ": the element after the output was written");
  CHECK(std::isnan(to_d(host[off + want.size()])));
}

}  // namespace

TEMPLATE_TEST_CASE("cuda gelu and residual: vector body, scalar tail, unaligned pointers", "[cuda][vector]", float,
                   bf16) {
  using T = TestType;
  for (size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{17}, size_t{4099}}) {
    for (size_t off : {size_t{0}, size_t{1}}) {  // off 1: 2 or 4 bytes past a 256-byte aligned allocation
      const std::string tag = fmt::format(" n={} off={}", n, off);
      auto x = padded<T>(n, off), b = padded<T>(n, off), g = padded<T>(n, off);
      DeviceBuffer<T> dx(x.dev), db(b.dev), dg(g.dev), out(n + 2);
      std::vector<double> ref(n), dref(n), rref(n);
      ops::gelu_forward(ref.data(), x.ref.data(), static_cast<int64_t>(n));
      ops::gelu_backward(dref.data(), x.ref.data(), g.ref.data(), static_cast<int64_t>(n));
      ops::residual_forward(rref.data(), x.ref.data(), b.ref.data(), static_cast<int64_t>(n));
      poison(out.data(), out.size() * sizeof(T));
      cuda::gelu_forward(out.data() + off, dx.data() + off, static_cast<int64_t>(n), nullptr);
      check("gelu_forward" + tag, out, off, ref);
      poison(out.data(), out.size() * sizeof(T));
      cuda::gelu_backward(out.data() + off, dx.data() + off, dg.data() + off, static_cast<int64_t>(n), nullptr);
      check("gelu_backward" + tag, out, off, dref);
      poison(out.data(), out.size() * sizeof(T));
      cuda::residual_forward(out.data() + off, dx.data() + off, db.data() + off, static_cast<int64_t>(n), nullptr);
      check("residual_forward" + tag, out, off, rref);
    }
  }
}

TEMPLATE_TEST_CASE("cuda layernorm: vector rows, odd widths, unaligned rows", "[cuda][vector]", float, bf16) {
  using T = TestType;
  const int N = 5;
  for (int C : {8, 12, 13, 64, 771}) {
    for (size_t off : {size_t{0}, size_t{1}}) {
      const std::string tag = fmt::format(" C={} off={}", C, off);
      const size_t nc = size_t(N) * C;
      auto x = padded<T>(nc, off), w = padded<T>(size_t(C), off), bias = padded<T>(size_t(C), off),
           g = padded<T>(nc, off);
      DeviceBuffer<T> dx(x.dev), dw(w.dev), dbias(bias.dev), dg(g.dev), out(nc + 2), dinp(nc + 2);
      DeviceBuffer<float> mean(N), rstd(N);
      std::vector<double> ref(nc), rmean(N), rrstd(N), rdinp(nc);
      ops::layernorm_forward(ref.data(), rmean.data(), rrstd.data(), x.ref.data(), w.ref.data(), bias.ref.data(), N,
                             C);
      ops::layernorm_backward(rdinp.data(), static_cast<double*>(nullptr), static_cast<double*>(nullptr), g.ref.data(),
                              x.ref.data(), w.ref.data(), rmean.data(), rrstd.data(), N, C);
      poison(out.data(), out.size() * sizeof(T));
      cuda::layernorm_forward(out.data() + off, mean.data(), rstd.data(), dx.data() + off, dw.data() + off,
                              dbias.data() + off, N, C, static_cast<float>(ops::kLayerNormEps), nullptr);
      check("layernorm_forward" + tag, out, off, ref);
      poison(dinp.data(), dinp.size() * sizeof(T));
      cuda::layernorm_backward(dinp.data() + off, nullptr, nullptr, dg.data() + off, dx.data() + off,
                               dw.data() + off, mean.data(), rstd.data(), N, C, ops::GradMode::overwrite, nullptr);
      check("layernorm_backward dinp" + tag, dinp, off, rdinp);
    }
  }
}

TEMPLATE_TEST_CASE("cuda softmax_xent: vector rows, a tail of real columns, unaligned rows", "[cuda][vector]", float,
                   bf16) {
  using T = TestType;
  const int N = 6;
  for (auto [V, valid] : {std::pair{1024, 1024}, std::pair{1024, 1001}, std::pair{1024, 997}, std::pair{1000, 999}}) {
    for (size_t off : {size_t{0}, size_t{1}}) {
      const std::string tag = fmt::format(" V={} valid={} off={}", V, valid, off);
      const size_t nv = size_t(N) * V;
      auto x = padded<T>(nv, off, -6.0, 6.0);
      std::vector<int32_t> targets(N);
      for (int i = 0; i < N; ++i) targets[i] = (i * 173 + 11) % valid;
      DeviceBuffer<T> dx(x.dev), dgrad(nv + 2);
      DeviceBuffer<int32_t> dt(targets);
      DeviceBuffer<float> losses(N + 1), lse(N);
      std::vector<double> rloss(N), rlse(N), rgrad(nv);
      ops::softmax_xent_forward(rloss.data(), rlse.data(), x.ref.data(), targets.data(), N, V, valid);
      const double dloss = 1.0 / N;
      ops::softmax_xent_backward(rgrad.data(), x.ref.data(), rlse.data(), targets.data(), dloss, N, V, valid);
      poison(losses.data(), losses.size() * sizeof(float));
      cuda::softmax_xent_forward(losses.data(), lse.data(), dx.data() + off, dt.data(), N, V, valid, nullptr);
      check("softmax_xent_forward loss" + tag, losses, 0, rloss);
      poison(dgrad.data(), dgrad.size() * sizeof(T));
      cuda::softmax_xent_backward(dgrad.data() + off, dx.data() + off, lse.data(), dt.data(),
                                  static_cast<float>(dloss), N, V, valid, nullptr);
      check("softmax_xent_backward" + tag, dgrad, off, rgrad);
    }
  }
}

TEMPLATE_TEST_CASE("cuda adamw_update: vector body, scalar tail, unaligned arrays", "[cuda][vector]", float, bf16) {
  using G = TestType;
  const AdamWConfig cfg;
  AdamWStep st;
  st.lr = 0.1f;
  st.grad_scale = 0.5f;
  st.t = 2;
  for (size_t n : {size_t{1}, size_t{5}, size_t{4099}}) {
    for (size_t off : {size_t{0}, size_t{1}}) {
      const std::string tag = fmt::format(" n={} off={} grad {}", n, off, std::is_same_v<G, float> ? "fp32" : "bf16");
      auto p = padded<float>(n, off), m0 = padded<float>(n, off, 0.0, 0.1), v0 = padded<float>(n, off, 0.0, 0.1);
      auto g = padded<G>(n, off);
      std::vector<double> rp = p.ref, rm = m0.ref, rv = v0.ref;
      adamw_update(std::span<double>(rp), std::span<const double>(g.ref), std::span<double>(rm), std::span<double>(rv),
                   cfg, 0.1f, st);
      DeviceBuffer<float> dp(p.dev), dm(m0.dev), dv(v0.dev);
      DeviceBuffer<G> dg(g.dev);
      DeviceBuffer<bf16> copy(n + 2);
      poison(copy.data(), copy.size() * sizeof(bf16));
      cuda::adamw_update(dp.data() + off, copy.data() + off, dg.data() + off, dm.data() + off, dv.data() + off,
                         static_cast<int64_t>(n), cfg, 0.1f, st, nullptr);
      TRIAX_CHECK_CUDA(cudaDeviceSynchronize());
      const auto gp = dp.download();
      const auto gc = copy.download();
      std::vector<double> got(n), want(n), copy_got(n), copy_want(n);
      for (size_t i = 0; i < n; ++i) {
        got[i] = gp[off + i] - p.ref[i];
        want[i] = rp[i] - p.ref[i];
        copy_got[i] = static_cast<float>(gc[off + i]);
        copy_want[i] = static_cast<float>(bf16(gp[off + i]));
      }
      double num = 0, den = 0;
      for (size_t i = 0; i < n; ++i) {
        num = std::isfinite(got[i]) ? std::max(num, std::abs(got[i] - want[i])) : INFINITY;
        den = std::max(den, std::abs(want[i]));
      }
      fmt::print("kernel {:<48} rel_err {:.3e} tol 1e-05\n", "adamw_update param change" + tag, num / den);
      INFO("adamw_update" << tag);
      CHECK(num / den <= 1e-5);
      CHECK(copy_got == copy_want);  // the copy is the master rounded to nearest even
      CHECK(std::isnan(static_cast<float>(gc[off + n])));  // nothing written past the end
      CHECK(gp[off + n] == p.dev[off + n]);
    }
  }
}
