// Every CUDA kernel and the cuBLASLt GEMM against the CPU ops of include/triax/ops (double
// instantiations, on the very values the GPU sees: bf16 inputs are rounded first), on fresh random
// inputs (seed printed; TRIAX_TEST_SEED replays), with every written output poisoned with NaN
// before the launch. Each check prints one line "kernel <name> <type> rel_err <e> tol <t> ok|FAIL",
// rel_err = max|gpu - ref| / max|ref| over the tensor (NaN -> inf). Tolerances follow the output
// type: fp32 1e-5, bf16 1e-2, fp16 2e-3 (plus the few documented exceptions: exact checks are tighter, the
// cuBLASLt GELU epilogue in fp32 looser). Parameter gradients are fp32 for bf16 activations too
// (docs/CUDA.md, "Gradient types"), so they are always held to 1e-5. Without a GPU only the [nogpu] argument checks run and
// the test reports "skipped" (exit 77, tests/support/cuda_main.cpp).
#include <catch2/catch.hpp>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "support/cuda_buffer.h"
#include "support/gpu_check.h"
#include "triax/core/cuda_check.h"
#include "triax/cuda/adamw.h"
#include "triax/ops/adamw.h"
#include "triax/cuda/allocator.h"
#include "triax/cuda/attention.h"
#include "triax/cuda/cast.h"
#include "triax/cuda/embedding.h"
#include "triax/cuda/gelu.h"
#include "triax/cuda/gemm.h"
#include "triax/cuda/grad_norm.h"
#include "triax/cuda/grad_scale.h"
#include "triax/cuda/layernorm.h"
#include "triax/cuda/linear.h"
#include "triax/cuda/residual.h"
#include "triax/cuda/softmax_xent.h"
#include "triax/ops/attention.h"
#include "triax/ops/embedding.h"
#include "triax/ops/gelu.h"
#include "triax/ops/gemm.h"
#include "triax/ops/layernorm.h"
#include "triax/ops/linear.h"
#include "triax/ops/residual.h"
#include "triax/ops/softmax_xent.h"
#include "triax/tensor/tensor.h"
#include "unit/ops_testing.h"

using namespace triax;
using triax::test::DeviceBuffer;
using ops::Trans;

const triax::test::gpu::CheckLine triax::test::gpu::kCheckLine{"kernel", 40, 5};

namespace kt {
using namespace test::gpu;  // the helpers: support/gpu_check.h
}  // namespace kt

// ---------------------------------------------------------------- element-wise

TEMPLATE_TEST_CASE("cuda gelu forward/backward match ops::gelu", "[cuda][gelu]", float, bf16, f16) {
  using T = TestType;
  kt::Stream s;
  const int64_t n = 100003;
  auto x = kt::random_data<T>(n, -4, 4), g = kt::random_data<T>(n);
  DeviceBuffer<T> dx(x.dev), dg(g.dev), out(n), dinp(n);
  std::vector<double> ref(n), dref(n);
  ops::gelu_forward(ref.data(), x.ref.data(), n);
  ops::gelu_backward(dref.data(), x.ref.data(), g.ref.data(), n);
  kt::poison(out);
  cuda::gelu_forward(out.data(), dx.data(), n, s);
  kt::check("gelu_forward", out, ref, s);
  kt::poison(dinp);
  cuda::gelu_backward(dinp.data(), dx.data(), dg.data(), n, s);
  kt::check("gelu_backward", dinp, dref, s);
  // In place (out aliases inp), as the header allows.
  cuda::gelu_forward(dx.data(), dx.data(), n, s);
  kt::check("gelu_forward in place", dx, ref, s);
}

TEMPLATE_TEST_CASE("cuda residual forward/backward match ops::residual", "[cuda][residual]", float, bf16, f16) {
  using T = TestType;
  kt::Stream s;
  const int64_t n = 70001;
  auto a = kt::random_data<T>(n), b = kt::random_data<T>(n), g = kt::random_data<T>(n);
  auto da0 = kt::random_data<T>(n), db0 = kt::random_data<T>(n);
  DeviceBuffer<T> da(a.dev), dbb(b.dev), dg(g.dev), out(n), ga(da0.dev), gb(db0.dev);
  std::vector<double> ref(n), ra = da0.ref, rb = db0.ref;
  ops::residual_forward(ref.data(), a.ref.data(), b.ref.data(), n);
  ops::residual_backward(ra.data(), rb.data(), g.ref.data(), n);
  kt::poison(out);
  cuda::residual_forward(out.data(), da.data(), dbb.data(), n, s);
  kt::check("residual_forward", out, ref, s);
  cuda::residual_backward(ga.data(), gb.data(), dg.data(), n, s);  // accumulates
  kt::check("residual_backward da", ga, ra, s);
  kt::check("residual_backward db", gb, rb, s);
}

TEST_CASE("cuda cast is bit-identical to the host bf16/f16 conversions", "[cuda][cast]") {
  kt::Stream s;
  // Magnitudes from 2^-30 to 2^20: fp16 subnormals, normals, overflow to inf, bf16 ties.
  std::vector<float> x;
  for (double v : test::random_vec(50000, -1, 1))
    x.push_back(static_cast<float>(v * std::ldexp(1.0, static_cast<int>(std::abs(v) * 50) - 30)));
  x.push_back(65519.0f);   // rounds to fp16 max
  x.push_back(65520.0f);   // rounds to fp16 inf
  x.push_back(1.0f + 1.0f / 256.0f);  // a bf16 tie: to even
  const size_t n = x.size();
  DeviceBuffer<float> dx(x), back(n);
  DeviceBuffer<bf16> b(n);
  DeviceBuffer<f16> h(n);
  kt::poison(b);
  kt::poison(h);
  cuda::cast(b.data(), dx.data(), static_cast<int64_t>(n), s);
  cuda::cast(h.data(), dx.data(), static_cast<int64_t>(n), s);
  s.sync();
  const auto gb = b.download();
  const auto gh = h.download();
  size_t bad_b = 0, bad_h = 0;
  for (size_t i = 0; i < n; ++i) {
    bad_b += gb[i].bits != bf16(x[i]).bits;
    bad_h += gh[i].bits != f16(x[i]).bits;
  }
  kt::report("cast fp32->bf16 (bits differing)", "bf16", static_cast<double>(bad_b), 0);
  kt::report("cast fp32->fp16 (bits differing)", "fp16", static_cast<double>(bad_h), 0);
  kt::poison(back);
  cuda::cast(back.data(), b.data(), static_cast<int64_t>(n), s);
  s.sync();
  auto fb = back.download();
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const float want = static_cast<float>(gb[i]);
    bad += std::memcmp(&fb[i], &want, 4) != 0;
  }
  kt::report("cast bf16->fp32 (bits differing)", "fp32", static_cast<double>(bad), 0);
  kt::poison(back);
  cuda::cast(back.data(), h.data(), static_cast<int64_t>(n), s);
  s.sync();
  fb = back.download();
  bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const float want = static_cast<float>(gh[i]);
    bad += !(fb[i] == want || (std::isnan(fb[i]) && std::isnan(want)));
  }
  kt::report("cast fp16->fp32 (values differing)", "fp32", static_cast<double>(bad), 0);
}

TEMPLATE_TEST_CASE("cuda scale_and_check scales exactly and flags inf/NaN", "[cuda][grad_scale]", float, bf16, f16) {
  using T = TestType;
  kt::Stream s;
  const int64_t n = 50001;
  auto x = kt::random_data<T>(n, -8, 8);
  DeviceBuffer<T> dx(x.dev);
  DeviceBuffer<int> flag(std::vector<int>{0});
  cuda::scale_and_check(dx.data(), n, 0.25f, flag.data(), s);  // a power of two: exact
  std::vector<double> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = x.ref[i] * 0.25;
  kt::report("scale_and_check values (exact)", kt::tname<T>(), kt::rel_err(kt::fetch(dx, s), want), 0);
  CHECK(flag.download()[0] == 0);
  // One inf anywhere sets the flag.
  auto y = x.dev;
  y[static_cast<size_t>(test::random_ints(1, 0, static_cast<int32_t>(n))[0])] =
      kt::from_d<T>(std::numeric_limits<double>::infinity());
  dx.upload(y);
  cuda::scale_and_check(dx.data(), n, 1.0f, flag.data(), s);
  s.sync();
  CHECK(flag.download()[0] == 1);
  // NaN too; and no flag pointer is fine.
  flag.upload({0});
  y = x.dev;
  y[7] = kt::from_d<T>(std::numeric_limits<double>::quiet_NaN());
  dx.upload(y);
  cuda::scale_and_check(dx.data(), n, 2.0f, nullptr, s);
  cuda::scale_and_check(dx.data(), n, 0.5f, flag.data(), s);
  s.sync();
  CHECK(flag.download()[0] == 1);
  if constexpr (std::is_same_v<T, f16>) {  // scaling up overflows fp16: flagged
    flag.upload({0});
    dx.upload(x.dev);
    cuda::scale_and_check(dx.data(), n, 65536.0f, flag.data(), s);
    s.sync();
    CHECK(flag.download()[0] == 1);
  }
}

TEMPLATE_TEST_CASE("cuda sumsq_accumulate adds the sum of squares in double, deterministically", "[cuda][grad_norm]",
                   float, bf16, f16) {
  using T = TestType;
  kt::Stream s;
  const int64_t n = 1000003;
  auto x = kt::random_data<T>(n);
  DeviceBuffer<T> dx(x.dev);
  DeviceBuffer<double> acc(std::vector<double>{1.5});
  cuda::sumsq_accumulate(acc.data(), dx.data(), n, s);
  double want = 0;
  for (double v : x.ref) want += v * v;
  want += 1.5;
  s.sync();
  const double first = acc.download()[0];
  kt::report("sumsq_accumulate (double)", kt::tname<T>(), std::abs(first - want) / want, 1e-12);
  acc.upload({1.5});
  cuda::sumsq_accumulate(acc.data(), dx.data(), n, s);
  s.sync();
  const double second = acc.download()[0];
  CHECK(std::memcmp(&first, &second, sizeof(double)) == 0);  // same bits on a rerun
  // Small sizes (one partial block) and propagation of inf / NaN.
  acc.upload({0.0});
  cuda::sumsq_accumulate(acc.data(), dx.data(), 3, s);
  s.sync();
  const double small = x.ref[0] * x.ref[0] + x.ref[1] * x.ref[1] + x.ref[2] * x.ref[2];
  CHECK(std::abs(acc.download()[0] - small) <= 1e-15 * small);  // a different order of 3 additions
  auto y = x.dev;
  y[n / 2] = kt::from_d<T>(std::numeric_limits<double>::infinity());
  dx.upload(y);
  acc.upload({0.0});
  cuda::sumsq_accumulate(acc.data(), dx.data(), n, s);
  s.sync();
  CHECK(std::isinf(acc.download()[0]));
  y[n / 3] = kt::from_d<T>(std::numeric_limits<double>::quiet_NaN());
  dx.upload(y);
  acc.upload({0.0});
  cuda::sumsq_accumulate(acc.data(), dx.data(), n, s);
  s.sync();
  CHECK(std::isnan(acc.download()[0]));
}

// ---------------------------------------------------------------- layer kernels

TEMPLATE_TEST_CASE("cuda layernorm forward/backward match ops::layernorm", "[cuda][layernorm]", float, bf16, f16) {
  using T = TestType;
  kt::Stream s;
  for (auto [N, C] : {std::pair{257, 768}, std::pair{33, 100}}) {
    const std::string shape = fmt::format(" N={} C={}", N, C);
    const size_t nc = static_cast<size_t>(N) * C;
    auto x = kt::random_data<T>(nc, -2, 2), w = kt::random_data<T>(C), b = kt::random_data<T>(C), g = kt::random_data<T>(nc);
    DeviceBuffer<T> dx(x.dev), dw(w.dev), db(b.dev), dg(g.dev), out(nc), dinp(nc);
    DeviceBuffer<float> mean(N), rstd(N);
    std::vector<double> ref(nc), rmean(N), rrstd(N);
    ops::layernorm_forward(ref.data(), rmean.data(), rrstd.data(), x.ref.data(), w.ref.data(), b.ref.data(), N, C);
    kt::poison(out);
    kt::poison(mean);
    kt::poison(rstd);
    cuda::layernorm_forward(out.data(), mean.data(), rstd.data(), dx.data(), dw.data(), db.data(), N, C, static_cast<float>(ops::kLayerNormEps), s);
    kt::check("layernorm_forward out" + shape, out, ref, s);
    kt::check("layernorm_forward mean" + shape, mean, rmean, s);  // fp32 statistics: fp32 tolerance
    kt::check("layernorm_forward rstd" + shape, rstd, rrstd, s);

    // Backward, overwrite then accumulate; weight and bias gradients (fp32 whatever T is)
    // accumulate onto old values, and are held to the fp32 threshold.
    auto gw0 = kt::random_data<float>(C), gb0 = kt::random_data<float>(C);
    auto dinp0 = kt::random_data<T>(nc);
    DeviceBuffer<float> gw(gw0.dev), gb(gb0.dev);
    std::vector<double> rdinp(nc), rgw = gw0.ref, rgb = gb0.ref;
    ops::layernorm_backward(rdinp.data(), rgw.data(), rgb.data(), g.ref.data(), x.ref.data(), w.ref.data(),
                            rmean.data(), rrstd.data(), N, C);
    kt::poison(dinp);
    cuda::layernorm_backward(dinp.data(), gw.data(), gb.data(), dg.data(), dx.data(), dw.data(), mean.data(),
                             rstd.data(), N, C, ops::GradMode::overwrite, s);
    kt::check("layernorm_backward dinp" + shape, dinp, rdinp, s);
    const std::string act = fmt::format(" act={}", kt::tname<T>());
    kt::check("layernorm_backward dweight" + shape + act, gw, rgw, s);
    kt::check("layernorm_backward dbias" + shape + act, gb, rgb, s);
    std::vector<double> racc = dinp0.ref;
    ops::layernorm_backward(racc.data(), static_cast<double*>(nullptr), static_cast<double*>(nullptr), g.ref.data(),
                            x.ref.data(), w.ref.data(), rmean.data(), rrstd.data(), N, C, ops::GradMode::accumulate);
    dinp.upload(dinp0.dev);
    cuda::layernorm_backward(dinp.data(), nullptr, nullptr, dg.data(), dx.data(), dw.data(), mean.data(), rstd.data(),
                             N, C, ops::GradMode::accumulate, s);
    kt::check("layernorm_backward dinp accumulate" + shape, dinp, racc, s);
  }
}

TEMPLATE_TEST_CASE("cuda embedding forward/backward match ops::embedding (vocab shards)", "[cuda][embedding]", float,
                   bf16, f16) {
  using T = TestType;
  kt::Stream s;
  const int B = 4, T_ = 64, C = 96, V = 500;
  for (auto [v0, v1] : {std::pair{0, V}, std::pair{100, 350}}) {
    for (int skew = 0; skew < 2; ++skew) {  // skew: most tokens equal (long runs in the sort)
      const std::string what = fmt::format(" shard [{}, {}){}", v0, v1, skew ? " skewed" : "");
      auto tokens = test::random_ints(static_cast<size_t>(B) * T_, 0, V);
      if (skew)
        for (size_t i = 0; i < tokens.size(); i += 1 + i % 3) tokens[i] = 200;
      const int rows = v1 - v0;
      auto wte = kt::random_data<T>(static_cast<size_t>(rows) * C), wpe = kt::random_data<T>(static_cast<size_t>(T_) * C);
      auto dout = kt::random_data<T>(static_cast<size_t>(B) * T_ * C);
      DeviceBuffer<int32_t> dtok(tokens);
      DeviceBuffer<T> dwte(wte.dev), dwpe(wpe.dev), ddout(dout.dev), out(dout.dev.size());
      std::vector<double> ref(out.size());
      ops::embedding_forward(ref.data(), tokens.data(), wte.ref.data(), wpe.ref.data(), B, T_, C, V, v0, v1);
      kt::poison(out);
      cuda::embedding_forward(out.data(), dtok.data(), dwte.data(), dwpe.data(), B, T_, C, V, v0, v1, s);
      kt::check("embedding_forward" + what, out, ref, s);
      ops::embedding_forward(ref.data(), tokens.data(), wte.ref.data(), static_cast<const double*>(nullptr), B, T_, C,
                             V, v0, v1);
      kt::poison(out);
      cuda::embedding_forward(out.data(), dtok.data(), dwte.data(), static_cast<const T*>(nullptr), B, T_, C, V, v0,
                              v1, s);
      kt::check("embedding_forward no wpe" + what, out, ref, s);

      // The gradient tables are fp32 whatever T is (parameter gradients keep their own type).
      auto gte0 = kt::random_data<float>(wte.dev.size()), gpe0 = kt::random_data<float>(wpe.dev.size());
      DeviceBuffer<float> gte(gte0.dev), gpe(gpe0.dev);
      std::vector<double> rte = gte0.ref, rpe = gpe0.ref;
      ops::embedding_backward(rte.data(), rpe.data(), dout.ref.data(), tokens.data(), B, T_, C, V, v0, v1);
      cuda::embedding_backward(gte.data(), gpe.data(), ddout.data(), dtok.data(), B, T_, C, V, v0, v1, s);
      const std::string act = fmt::format(" act={}", kt::tname<T>());
      kt::check("embedding_backward dwte" + what + act, gte, rte, s);
      kt::check("embedding_backward dwpe" + what + act, gpe, rpe, s);
      // The same additions in the same order as the CPU float op on dout widened to fp32: the
      // same bits, for bf16 activations too (no rounding to T on the way).
      std::vector<float> cte = gte0.dev, cpe = gpe0.dev, dout_f32(dout.ref.begin(), dout.ref.end());
      ops::embedding_backward(cte.data(), cpe.data(), dout_f32.data(), tokens.data(), B, T_, C, V, v0, v1);
      s.sync();
      const auto ge = gte.download();
      const auto gp = gpe.download();
      const auto differing = [](const std::vector<float>& a, const std::vector<float>& b) {
        size_t bad = 0;
        for (size_t i = 0; i < a.size(); ++i) bad += std::memcmp(&a[i], &b[i], 4) != 0;
        return static_cast<double>(bad);
      };
      kt::report("embedding_backward dwte == CPU float op (bits differing)" + what + act, "fp32",
                 differing(ge, cte), 0);
      kt::report("embedding_backward dwpe == CPU float op (bits differing)" + what + act, "fp32",
                 differing(gp, cpe), 0);
    }
  }
}

TEMPLATE_TEST_CASE("cuda linear forward/backward match ops::linear, fp32 parameter gradients", "[cuda][linear]", float,
                   bf16, f16) {
  using T = TestType;
  kt::Stream s;
  cuda::CublasLtGemm gemm;
  const std::string act = fmt::format(" act={}", kt::tname<T>());
  // 257 rows: 9 chunks in the bias column sum (the last one partial); 33 rows: two chunks.
  for (auto [N, IC, OC] : {std::tuple{257, 64, 192}, std::tuple{33, 40, 24}}) {
    const std::string shape = fmt::format(" N={} IC={} OC={}", N, IC, OC);
    auto x = kt::random_data<T>(static_cast<size_t>(N) * IC), w = kt::random_data<T>(static_cast<size_t>(OC) * IC);
    auto b = kt::random_data<T>(OC), g = kt::random_data<T>(static_cast<size_t>(N) * OC);
    DeviceBuffer<T> dx(x.dev), dw(w.dev), dbias_in(b.dev), dg(g.dev), out(g.dev.size()), dinp(x.dev.size());
    std::vector<double> ref(g.dev.size());
    ops::linear_forward(ref.data(), x.ref.data(), w.ref.data(), b.ref.data(), N, IC, OC);
    kt::poison(out);
    cuda::linear_forward(out.data(), dx.data(), dw.data(), dbias_in.data(), N, IC, OC, gemm, s);
    kt::check("linear_forward" + shape, out, ref, s);
    ops::linear_forward(ref.data(), x.ref.data(), w.ref.data(), static_cast<const double*>(nullptr), N, IC, OC);
    kt::poison(out);
    cuda::linear_forward(out.data(), dx.data(), dw.data(), static_cast<const T*>(nullptr), N, IC, OC, gemm, s);
    kt::check("linear_forward no bias" + shape, out, ref, s);

    // Backward: dinp overwritten in T; dweight and dbias accumulate onto old fp32 values and are
    // held to the fp32 threshold whatever T is.
    auto gw0 = kt::random_data<float>(w.dev.size()), gb0 = kt::random_data<float>(OC);
    DeviceBuffer<float> gw(gw0.dev), gb(gb0.dev);
    std::vector<double> rdinp(x.dev.size()), rgw = gw0.ref, rgb = gb0.ref;
    ops::linear_backward(rdinp.data(), rgw.data(), rgb.data(), g.ref.data(), x.ref.data(), w.ref.data(), N, IC, OC);
    kt::poison(dinp);
    cuda::linear_backward(dinp.data(), gw.data(), gb.data(), dg.data(), dx.data(), dw.data(), N, IC, OC,
                          ops::GradMode::overwrite, gemm, s);
    kt::check("linear_backward dinp" + shape, dinp, rdinp, s);
    kt::check("linear_backward dweight" + shape + act, gw, rgw, s);
    kt::check("linear_backward dbias" + shape + act, gb, rgb, s);

    // dinp accumulates with GradMode::accumulate; null dweight/dbias are skipped (left alone).
    auto dinp0 = kt::random_data<T>(x.dev.size());
    std::vector<double> racc = dinp0.ref;
    ops::linear_backward(racc.data(), static_cast<double*>(nullptr), static_cast<double*>(nullptr), g.ref.data(),
                         x.ref.data(), w.ref.data(), N, IC, OC, ops::GradMode::accumulate);
    dinp.upload(dinp0.dev);
    cuda::linear_backward(dinp.data(), nullptr, nullptr, dg.data(), dx.data(), dw.data(), N, IC, OC,
                          ops::GradMode::accumulate, gemm, s);
    kt::check("linear_backward dinp accumulate" + shape, dinp, racc, s);

    // The bias gradient alone, twice from the same start: the same bits (fixed summation order).
    DeviceBuffer<float> gb2(gb0.dev), gb3(gb0.dev);
    cuda::linear_bias_backward(gb2.data(), dg.data(), N, OC, s);
    cuda::linear_bias_backward(gb3.data(), dg.data(), N, OC, s);
    std::vector<double> rgb2 = gb0.ref;
    ops::linear_backward(static_cast<double*>(nullptr), static_cast<double*>(nullptr), rgb2.data(), g.ref.data(),
                         x.ref.data(), w.ref.data(), N, IC, OC);
    kt::check("linear_bias_backward" + shape + act, gb2, rgb2, s);
    const auto b2 = gb2.download(), b3 = gb3.download();
    CHECK(std::memcmp(b2.data(), b3.data(), b2.size() * sizeof(float)) == 0);
  }
}

TEMPLATE_TEST_CASE("cuda softmax_xent (full and vocab-parallel) matches ops::softmax_xent", "[cuda][xent]", float,
                   bf16, f16) {
  using T = TestType;
  kt::Stream s;
  const int N = 67, nshards = 3, Vs = 334, V = nshards * Vs, valid = 990;  // padding in the last shard
  auto logits = kt::random_data<T>(static_cast<size_t>(N) * V, -5, 5);
  const auto targets = test::random_ints(N, 0, valid);
  const double dloss = 1.0 / N;
  DeviceBuffer<T> dl(logits.dev), dgrad(logits.dev.size());
  DeviceBuffer<int32_t> dt(targets);
  DeviceBuffer<float> losses(N), lse(N);
  std::vector<double> rloss(N), rlse(N), rgrad(logits.ref.size());
  ops::softmax_xent_forward(rloss.data(), rlse.data(), logits.ref.data(), targets.data(), N, V, valid);
  ops::softmax_xent_backward(rgrad.data(), logits.ref.data(), rlse.data(), targets.data(), dloss, N, V, valid);
  kt::poison(losses);
  kt::poison(lse);
  cuda::softmax_xent_forward(losses.data(), lse.data(), dl.data(), dt.data(), N, V, valid, s);
  kt::check("softmax_xent_forward losses", losses, rloss, s);
  kt::check("softmax_xent_forward lse", lse, rlse, s);
  kt::poison(dgrad);
  cuda::softmax_xent_backward(dgrad.data(), dl.data(), lse.data(), dt.data(), static_cast<float>(dloss), N, V, valid,
                              s);
  kt::check("softmax_xent_backward", dgrad, rgrad, s);
  {  // in place: dlogits aliases logits
    DeviceBuffer<T> inplace(logits.dev);
    cuda::softmax_xent_backward(inplace.data(), inplace.data(), lse.data(), dt.data(), static_cast<float>(dloss), N, V,
                                valid, s);
    kt::check("softmax_xent_backward in place", inplace, rgrad, s);
  }

  // Vocab-parallel: each shard's pieces, the "all-reduces" done on the host in double.
  std::vector<double> gmax(N, -INFINITY), gsum(N, 0.0), gtl(N, 0.0);
  std::vector<std::vector<T>> shard_dev(nshards);
  std::vector<std::vector<double>> shard_ref(nshards);
  for (int k = 0; k < nshards; ++k) {
    for (int i = 0; i < N; ++i)
      for (int c = 0; c < Vs; ++c) {
        const size_t src = static_cast<size_t>(i) * V + static_cast<size_t>(k) * Vs + c;
        shard_dev[k].push_back(logits.dev[src]);
        shard_ref[k].push_back(logits.ref[src]);
      }
  }
  for (int k = 0; k < nshards; ++k) {
    const std::string sh = fmt::format(" shard {}", k);
    DeviceBuffer<T> d(shard_dev[k]);
    DeviceBuffer<float> mx(N);
    std::vector<double> rmx(N);
    ops::xent_shard_max(rmx.data(), shard_ref[k].data(), N, Vs, k * Vs, valid);
    kt::poison(mx);
    cuda::xent_shard_max(mx.data(), d.data(), N, Vs, k * Vs, valid, s);
    kt::check("xent_shard_max" + sh, mx, rmx, s);
    for (int i = 0; i < N; ++i) gmax[i] = std::max(gmax[i], rmx[i]);
  }
  std::vector<float> gmax_f(gmax.begin(), gmax.end());
  DeviceBuffer<float> dgmax(gmax_f);
  const std::vector<double> gmax_used(gmax_f.begin(), gmax_f.end());
  for (int k = 0; k < nshards; ++k) {
    const std::string sh = fmt::format(" shard {}", k);
    DeviceBuffer<T> d(shard_dev[k]);
    DeviceBuffer<float> se(N), tl(N);
    std::vector<double> rse(N), rtl(N);
    ops::xent_shard_sumexp(rse.data(), shard_ref[k].data(), gmax_used.data(), N, Vs, k * Vs, valid);
    ops::xent_shard_target_logit(rtl.data(), shard_ref[k].data(), targets.data(), N, Vs, k * Vs, valid);
    kt::poison(se);
    kt::poison(tl);
    cuda::xent_shard_sumexp(se.data(), d.data(), dgmax.data(), N, Vs, k * Vs, valid, s);
    cuda::xent_shard_target_logit(tl.data(), d.data(), dt.data(), N, Vs, k * Vs, valid, s);
    kt::check("xent_shard_sumexp" + sh, se, rse, s);
    kt::check("xent_shard_target_logit" + sh, tl, rtl, s);
    for (int i = 0; i < N; ++i) {
      gsum[i] += rse[i];
      gtl[i] += rtl[i];
    }
  }
  std::vector<float> gsum_f(gsum.begin(), gsum.end()), gtl_f(gtl.begin(), gtl.end());
  DeviceBuffer<float> dgsum(gsum_f), dgtl(gtl_f), sl(N), slse(N);
  kt::poison(sl);
  kt::poison(slse);
  cuda::xent_loss_from_stats(sl.data(), slse.data(), dgmax.data(), dgsum.data(), dgtl.data(), N, s);
  kt::check("xent_loss_from_stats losses (= full)", sl, rloss, s);
  kt::check("xent_loss_from_stats lse (= full)", slse, rlse, s);
  for (int k = 0; k < nshards; ++k) {
    DeviceBuffer<T> d(shard_dev[k]), dd(shard_dev[k].size());
    std::vector<double> want;
    for (int i = 0; i < N; ++i)
      for (int c = 0; c < Vs; ++c) want.push_back(rgrad[static_cast<size_t>(i) * V + static_cast<size_t>(k) * Vs + c]);
    kt::poison(dd);
    cuda::xent_shard_backward(dd.data(), d.data(), slse.data(), dt.data(), static_cast<float>(dloss), N, Vs, k * Vs,
                              valid, s);
    kt::check(fmt::format("xent_shard_backward shard {} (= full columns)", k), dd, want, s);
  }

  // A target outside the vocabulary: that row's loss is NaN, the others are untouched.
  auto bad = targets;
  bad[5] = valid;
  dt.upload(bad);
  cuda::softmax_xent_forward(losses.data(), lse.data(), dl.data(), dt.data(), N, V, valid, s);
  const auto lb = kt::fetch(losses, s);
  CHECK(std::isnan(lb[5]));
  CHECK(std::isfinite(lb[4]));
}

TEMPLATE_TEST_CASE("cuda attention forward/backward match ops::attention", "[cuda][attention]", float, bf16, f16) {
  using T = TestType;
  kt::Stream s;
  struct Shape {
    int B, T, C, NH;
  };
  for (const Shape sh : {Shape{2, 200, 256, 4}, Shape{1, 130, 96, 3}, Shape{1, 70, 256, 2}}) {
    const auto [B, Tn, C, NH] = sh;
    const std::string what = fmt::format(" B={} T={} C={} NH={} hs={}", B, Tn, C, NH, C / NH);
    const size_t n3 = static_cast<size_t>(B) * Tn * 3 * C, n1 = static_cast<size_t>(B) * Tn * C;
    const size_t nl = static_cast<size_t>(B) * NH * Tn;
    auto qkv = kt::random_data<T>(n3, -2, 2), dout = kt::random_data<T>(n1);
    DeviceBuffer<T> dqkv_in(qkv.dev), ddout(dout.dev), out(n1), dqkv(n3);
    DeviceBuffer<float> lse(nl);
    std::vector<double> rout(n1), rlse(nl), rdqkv(n3);
    ops::attention_forward(rout.data(), rlse.data(), qkv.ref.data(), B, Tn, C, NH);
    kt::poison(out);
    kt::poison(lse);
    cuda::attention_forward(out.data(), lse.data(), dqkv_in.data(), B, Tn, C, NH, 0, s);
    kt::check("attention_forward out" + what, out, rout, s);
    kt::check("attention_forward lse" + what, lse, rlse, s);
    ops::attention_backward(rdqkv.data(), dout.ref.data(), qkv.ref.data(), rlse.data(), B, Tn, C, NH);
    kt::poison(dqkv);
    cuda::attention_backward(dqkv.data(), ddout.data(), dqkv_in.data(), out.data(), lse.data(), B, Tn, C, NH, 0, s);
    // Each part separately: a wrong dK would hide behind a large dQ in one norm.
    const auto got = kt::fetch(dqkv, s);
    for (int part = 0; part < 3; ++part) {
      std::vector<double> g, w;
      for (size_t t = 0; t < static_cast<size_t>(B) * Tn; ++t)
        for (int c = 0; c < C; ++c) {
          const size_t i = t * 3 * C + static_cast<size_t>(part) * C + c;
          g.push_back(got[i]);
          w.push_back(rdqkv[i]);
        }
      kt::report(fmt::format("attention_backward d{}{}", "qkv"[part], what), kt::tname<T>(), kt::rel_err(g, w), kt::tol<T>());
    }
    // Deterministic: a second run gives the same bits.
    cuda::attention_backward(dqkv.data(), ddout.data(), dqkv_in.data(), out.data(), lse.data(), B, Tn, C, NH, 0, s);
    s.sync();
    const auto again = kt::to_double(dqkv.download());
    CHECK(std::memcmp(again.data(), got.data(), got.size() * sizeof(double)) == 0);
  }
}

// ---------------------------------------------------------------- optimizer

TEMPLATE_TEST_CASE("cuda adamw_update matches the CPU adamw_update in float64 (fp32 master, low-precision copy)", "[cuda][adamw]",
                   float, bf16, f16) {
  using G = TestType;
  using Copy = std::conditional_t<std::is_same_v<G, f16>, f16, bf16>;
  kt::Stream s;
  const int64_t n = 10007;
  AdamWConfig cfg;  // beta1 0.9, beta2 0.95, eps 1e-8, weight decay 0.1 (floats)
  const float wd = 0.1f;
  AdamWStep st;
  st.lr = 0.1f;  // large, so the update is large against the rounding of the weights
  st.grad_scale = 0.5f;
  // The CPU reference in double (triax::adamw_update's float64 overload), with the very float
  // hyper-parameters the GPU uses.
  auto p0 = kt::random_data<float>(n);
  std::vector<double> rp = p0.ref, rm(n, 0.0), rv(n, 0.0);
  DeviceBuffer<float> master(p0.dev), m(std::vector<float>(n, 0.0f)), v(std::vector<float>(n, 0.0f));
  DeviceBuffer<Copy> copy(n);
  for (int64_t t = 1; t <= 3; ++t) {
    auto g = kt::random_data<G>(n);
    DeviceBuffer<G> dg(g.dev);
    st.t = t;
    adamw_update(std::span<double>(rp), std::span<const double>(g.ref), std::span<double>(rm), std::span<double>(rv), cfg,
                 wd, st);
    kt::poison(copy);
    cuda::adamw_update(master.data(), copy.data(), dg.data(), m.data(), v.data(), n, cfg, wd, st, s);
  }
  const auto gp = kt::fetch(master, s);
  std::vector<double> got_delta(n), want_delta(n);
  for (int64_t i = 0; i < n; ++i) {
    got_delta[i] = gp[i] - p0.ref[i];
    want_delta[i] = rp[i] - p0.ref[i];
  }
  kt::report(fmt::format("adamw_update 3 steps: param change (grad {})", kt::tname<G>()), "fp32", kt::rel_err(got_delta, want_delta),
         1e-5);
  kt::check(fmt::format("adamw_update m (grad {})", kt::tname<G>()), m, rm, s);
  kt::check(fmt::format("adamw_update v (grad {})", kt::tname<G>()), v, rv, s);
  // The copy is the master rounded to nearest even: bit-exact.
  const auto gm = master.download();
  const auto gc = copy.download();
  size_t bad = 0;
  for (int64_t i = 0; i < n; ++i) bad += gc[i].bits != Copy(gm[i]).bits;
  kt::report(fmt::format("adamw_update copy == round(master) (bits differing)"), kt::tname<Copy>(), static_cast<double>(bad),
         0);
  // The copy-less overload updates the same way.
  DeviceBuffer<float> master2(p0.dev), m2(std::vector<float>(n, 0.0f)), v2(std::vector<float>(n, 0.0f));
  auto g = kt::random_data<G>(n);
  DeviceBuffer<G> dg(g.dev);
  st.t = 1;
  cuda::adamw_update(master2.data(), dg.data(), m2.data(), v2.data(), n, cfg, wd, st, s);
  std::vector<double> rp2 = p0.ref, rm2(n, 0.0), rv2(n, 0.0);
  adamw_update(std::span<double>(rp2), std::span<const double>(g.ref), std::span<double>(rm2), std::span<double>(rv2),
               cfg, wd, st);
  kt::check(fmt::format("adamw_update no copy m (grad {})", kt::tname<G>()), m2, rm2, s);
}

// ---------------------------------------------------------------- GEMM

namespace kt {

template <class In, class Out>
void gemm_case(cuda::CublasLtGemm& gemm, const kt::Stream& s, Trans ta, Trans tb, cuda::Epilogue e, int M, int N, int K) {
  const bool at = ta == Trans::yes, bt = tb == Trans::yes;
  const int lda = (at ? M : K) + 8, ldb = (bt ? K : N) + 8, ldc = N + 8, ldaux = N + 16;  // padded rows
  const size_t na = static_cast<size_t>(at ? K : M) * lda, nb = static_cast<size_t>(bt ? N : K) * ldb;
  const size_t nc = static_cast<size_t>(M) * ldc, naux = static_cast<size_t>(M) * ldaux;
  auto A = kt::random_data<In>(na), B = kt::random_data<In>(nb);
  auto C0 = kt::random_data<Out>(nc), bias = kt::random_data<Out>(N), aux_in = kt::random_data<Out>(naux, -3, 3);
  const float alpha = 0.75f, beta = e == cuda::Epilogue::none ? 0.5f : 0.0f;
  // pre = alpha op(A) op(B) + beta C (+ bias), in double.
  std::vector<double> pre = C0.ref;
  ops::gemm<double>(ta, tb, M, N, K, alpha, A.ref.data(), lda, B.ref.data(), ldb, beta, pre.data(), ldc);
  const bool with_bias = e == cuda::Epilogue::bias || e == cuda::Epilogue::gelu_bias || e == cuda::Epilogue::gelu_aux_bias;
  if (with_bias)
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) pre[static_cast<size_t>(i) * ldc + j] += bias.ref[j];
  const bool gelu = e == cuda::Epilogue::gelu || e == cuda::Epilogue::gelu_bias || e == cuda::Epilogue::gelu_aux ||
                    e == cuda::Epilogue::gelu_aux_bias;
  std::vector<double> g_in, g_out;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) g_in.push_back(pre[static_cast<size_t>(i) * ldc + j]);
  g_out.resize(g_in.size());
  if (gelu) ops::gelu_forward(g_out.data(), g_in.data(), static_cast<int64_t>(g_in.size()));
  if (e == cuda::Epilogue::dgelu) {  // pre * gelu'(aux)
    std::vector<double> a;
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) a.push_back(aux_in.ref[static_cast<size_t>(i) * ldaux + j]);
    ops::gelu_backward(g_out.data(), a.data(), g_in.data(), static_cast<int64_t>(g_in.size()));
  }
  // Compare only the (M, N) block (the padding is not the GEMM's).
  std::vector<double> want_mn = g_in;
  if (gelu || e == cuda::Epilogue::dgelu) want_mn = g_out;

  DeviceBuffer<In> dA(A.dev), dB(B.dev);
  DeviceBuffer<Out> dC(C0.dev), dbias(bias.dev), daux(e == cuda::Epilogue::dgelu ? aux_in.dev : std::vector<Out>(naux));
  if (e != cuda::Epilogue::none) kt::poison(dC);
  const bool aux_out = e == cuda::Epilogue::gelu_aux || e == cuda::Epilogue::gelu_aux_bias;
  if (aux_out) kt::poison(daux);
  cuda::EpilogueArgs<Out> epi;
  epi.kind = e;
  if (with_bias) epi.bias = dbias.data();
  if (aux_out || e == cuda::Epilogue::dgelu) {
    epi.aux = daux.data();
    epi.ld_aux = ldaux;
  }
  gemm.matmul<In, Out>(ta, tb, M, N, K, alpha, dA.data(), lda, dB.data(), ldb, beta, dC.data(), ldc, epi, s);
  const auto got = kt::fetch(dC, s);
  std::vector<double> got_mn;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) got_mn.push_back(got[static_cast<size_t>(i) * ldc + j]);
  const std::string name = fmt::format("gemm {}{} {} in={} M={} N={} K={}", at ? "T" : "N", bt ? "T" : "N",
                                       cuda::epilogue_name(e), kt::tname<In>(), M, N, K);
  // cuBLASLt's GELU is its own implementation: in fp32 it is held to 2e-3 (printed, so a GPU run
  // shows how close it really is), in fp16 to that plus fp16's own 2e-3; everything else (bf16's
  // 1e-2 covers both) to the output type's threshold.
  const bool own_gelu = gelu || e == cuda::Epilogue::dgelu;
  const double t = !own_gelu                      ? kt::tol<Out>()
                   : std::is_same_v<Out, float> ? 2e-3
                   : std::is_same_v<Out, f16>   ? 2e-3 + kt::tol<Out>()
                                                : kt::tol<Out>();
  kt::report(name, kt::tname<Out>(), kt::rel_err(got_mn, want_mn), t);
  if (aux_out) {
    const auto ga = kt::fetch(daux, s);
    std::vector<double> ga_mn;
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) ga_mn.push_back(ga[static_cast<size_t>(i) * ldaux + j]);
    kt::report(name + " aux (pre-activation)", kt::tname<Out>(), kt::rel_err(ga_mn, g_in), kt::tol<Out>());
  }
}

// One case; a DeviceError (cuBLASLt has no algorithm for it) is a failed check that names the
// problem, and the remaining cases still run.
template <class In, class Out>
void gemm_try(cuda::CublasLtGemm& gemm, const kt::Stream& s, Trans ta, Trans tb, cuda::Epilogue e, int M, int N, int K) {
  try {
    kt::gemm_case<In, Out>(gemm, s, ta, tb, e, M, N, K);
  } catch (const DeviceError& err) {
    fmt::print("kernel gemm {} in={} out={} FAIL: {}\n", cuda::epilogue_name(e), kt::tname<In>(), kt::tname<Out>(),
               err.what());
    FAIL_CHECK(err.what());
  }
}

template <class In, class Out>
void gemm_all(cuda::CublasLtGemm& gemm, const kt::Stream& s) {
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes}) kt::gemm_try<In, Out>(gemm, s, ta, tb, cuda::Epilogue::none, 128, 72, 200);
  for (auto e : {cuda::Epilogue::bias, cuda::Epilogue::gelu, cuda::Epilogue::gelu_bias, cuda::Epilogue::gelu_aux,
                 cuda::Epilogue::gelu_aux_bias, cuda::Epilogue::dgelu})
    kt::gemm_try<In, Out>(gemm, s, Trans::no, Trans::yes, e, 96, 136, 64);  // the linear layer's layout
}

}  // namespace kt

TEST_CASE("cuda CublasLtGemm matches ops::gemm for every type pair, transpose and epilogue", "[cuda][gemm]") {
  kt::Stream s;
  cuda::CublasLtGemm gemm;
  kt::gemm_all<float, float>(gemm, s);
  kt::gemm_all<bf16, float>(gemm, s);
  kt::gemm_all<bf16, bf16>(gemm, s);
  kt::gemm_all<f16, float>(gemm, s);
  kt::gemm_all<f16, f16>(gemm, s);
  // Plans are cached per problem: running one again plans nothing new.
  const size_t plans = gemm.plan_count();
  CHECK(plans > 0);
  kt::gemm_case<bf16, bf16>(gemm, s, Trans::no, Trans::yes, cuda::Epilogue::bias, 96, 136, 64);
  CHECK(gemm.plan_count() == plans);
}

// Leading dimensions that are not multiples of 8 (rows of 2-byte elements not 16-byte aligned)
// rule out the fastest kernels: the heuristic must still find one. Apart from the test above, so a
// DeviceError ("no algorithm") here does not hide the main results.
TEST_CASE("cuda CublasLtGemm handles odd shapes and leading dimensions", "[cuda][gemm]") {
  kt::Stream s;
  cuda::CublasLtGemm gemm;
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes}) {
      kt::gemm_try<float, float>(gemm, s, ta, tb, cuda::Epilogue::none, 129, 71, 67);
      kt::gemm_try<bf16, float>(gemm, s, ta, tb, cuda::Epilogue::none, 129, 71, 67);
      kt::gemm_try<bf16, bf16>(gemm, s, ta, tb, cuda::Epilogue::none, 129, 71, 67);
      kt::gemm_try<f16, float>(gemm, s, ta, tb, cuda::Epilogue::none, 129, 71, 67);
      kt::gemm_try<f16, f16>(gemm, s, ta, tb, cuda::Epilogue::none, 129, 71, 67);
    }
}

// ---------------------------------------------------------------- allocator

TEST_CASE("cuda allocator backs Tensor::empty on a GPU and restores the current device", "[cuda][allocator]") {
  cuda::install_cuda_allocator();
  int before = -1;
  TRIAX_CHECK_CUDA(cudaGetDevice(&before));
  Tensor t = Tensor::empty({1000, 3}, DType::f32, Device::cuda(0));
  int after = -1;
  TRIAX_CHECK_CUDA(cudaGetDevice(&after));
  CHECK(before == after);
  CHECK(t.device() == Device::cuda(0));
  cudaPointerAttributes attr{};
  TRIAX_CHECK_CUDA(cudaPointerGetAttributes(&attr, t.data<float>()));
  CHECK(attr.type == cudaMemoryTypeDevice);
  CHECK(attr.device == 0);
  std::vector<float> host(3000), back(3000);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i) * 0.5f + 1.0f;
  TRIAX_CHECK_CUDA(cudaMemcpy(t.data<float>(), host.data(), 3000 * 4, cudaMemcpyHostToDevice));
  TRIAX_CHECK_CUDA(cudaMemcpy(back.data(), t.data<float>(), 3000 * 4, cudaMemcpyDeviceToHost));
  CHECK(back == host);
  CHECK_THROWS_AS((Tensor::empty({size_t{1} << 62 >> 2}, DType::f32, Device::cuda(0))), DeviceError);  // 4 EiB
}

// ---------------------------------------------------------------- argument checks (no GPU needed)

TEST_CASE("cuda launchers reject bad arguments before touching the device", "[nogpu][cuda]") {
  float* f = reinterpret_cast<float*>(uintptr_t{256});  // never dereferenced: the checks throw first
  bf16* b = reinterpret_cast<bf16*>(uintptr_t{256});
  int32_t* tok = reinterpret_cast<int32_t*>(uintptr_t{256});
  cudaStream_t s = nullptr;
  CHECK_THROWS_AS((cuda::gelu_forward<float>(nullptr, f, 10, s)), ConfigError);
  CHECK_THROWS_AS((cuda::gelu_forward<float>(f, f, -1, s)), ConfigError);
  CHECK_NOTHROW((cuda::gelu_forward<float>(nullptr, nullptr, 0, s)));  // nothing to do
  CHECK_THROWS_AS((cuda::gelu_backward<bf16>(b, nullptr, b, 10, s)), ConfigError);
  CHECK_THROWS_AS((cuda::residual_forward<float>(f, nullptr, f, 10, s)), ConfigError);
  CHECK_THROWS_AS((cuda::residual_backward<float>(f, nullptr, f, 10, s)), ConfigError);  // da aliases dout
  CHECK_THROWS_AS((cuda::cast<bf16, float>(nullptr, f, 5, s)), ConfigError);
  CHECK_THROWS_AS((cuda::scale_and_check<float>(nullptr, 5, 1.0f, nullptr, s)), ConfigError);
  CHECK_THROWS_AS((cuda::sumsq_accumulate<float>(nullptr, f, 5, s)), ConfigError);
  CHECK_THROWS_AS((cuda::layernorm_forward<float>(f, f, f, f, f, f, 0, 8, 1e-5f, s)), ConfigError);
  CHECK_THROWS_AS((cuda::layernorm_forward<float>(f, f, f, f, nullptr, f, 4, 8, 1e-5f, s)), ConfigError);
  CHECK_THROWS_AS(cuda::layernorm_backward<float>(f, f, f, f, f, f, nullptr, f, 4, 8, ops::GradMode::overwrite, s),
                  ConfigError);
  // bf16 activations, fp32 parameter gradients (the signature is the check: b for Real, f for grads).
  CHECK_THROWS_AS(cuda::layernorm_backward<bf16>(b, f, f, b, b, b, f, f, 0, 8, ops::GradMode::overwrite, s),
                  ConfigError);
  CHECK_THROWS_AS((cuda::embedding_forward<float>(f, tok, f, f, 2, 3, 4, 10, 5, 5, s)), ConfigError);  // empty shard
  CHECK_THROWS_AS((cuda::embedding_forward<float>(f, tok, f, f, 2, 3, 4, 10, 0, 11, s)), ConfigError);  // past V
  CHECK_THROWS_AS((cuda::embedding_backward<float>(f, f, f, nullptr, 2, 3, 4, 10, 0, 10, s)), ConfigError);
  CHECK_THROWS_AS((cuda::embedding_backward<bf16>(f, f, b, nullptr, 2, 3, 4, 10, 0, 10, s)), ConfigError);
  CHECK_THROWS_AS((cuda::linear_bias_backward<bf16>(nullptr, b, 4, 8, s)), ConfigError);
  CHECK_THROWS_AS((cuda::linear_bias_backward<float>(f, f, 4, 0, s)), ConfigError);
  {
    cuda::CublasLtGemm g;  // no CUDA call: every case below is rejected first
    const auto bad_bwd = [&](bf16* dinp, float* dw, const bf16* inp, const bf16* w, const bf16* dout, int N) {
      cuda::linear_backward<bf16>(dinp, dw, f, dout, inp, w, N, 8, 16, ops::GradMode::overwrite, g, s);
    };
    CHECK_THROWS_AS(bad_bwd(b, f, b, b, nullptr, 4), ConfigError);  // no dout
    CHECK_THROWS_AS(bad_bwd(b, f, b, nullptr, b, 4), ConfigError);  // dinp without weight
    CHECK_THROWS_AS(bad_bwd(nullptr, f, nullptr, b, b, 4), ConfigError);  // dweight without inp
    CHECK_THROWS_AS(bad_bwd(b, f, b, b, b, 0), ConfigError);
    CHECK_THROWS_AS((cuda::linear_forward<float>(f, f, nullptr, f, 4, 8, 16, g, s)), ConfigError);
    CHECK_THROWS_AS((cuda::linear_forward<bf16>(b, b, b, b, 4, -1, 16, g, s)), ConfigError);
    CHECK(g.plan_count() == 0);
  }
  CHECK_THROWS_AS((cuda::softmax_xent_forward<float>(f, f, f, tok, 4, 10, 11, s)), ConfigError);  // valid > V
  CHECK_THROWS_AS((cuda::softmax_xent_forward<float>(f, f, f, nullptr, 4, 10, 10, s)), ConfigError);
  CHECK_THROWS_AS((cuda::xent_shard_max<float>(f, f, 4, 10, -1, 10, s)), ConfigError);
  CHECK_THROWS_AS((cuda::xent_shard_backward<bf16>(b, b, f, tok, 1.0f, 4, 10, 0, 0, s)), ConfigError);
  CHECK_THROWS_AS(cuda::xent_loss_from_stats(f, f, f, nullptr, f, 4, s), ConfigError);
  CHECK_THROWS_AS((cuda::attention_forward<float>(f, f, f, 1, 8, 100, 3, 0, s)), ConfigError);  // 3 does not divide 100
  CHECK_THROWS_AS((cuda::attention_forward<float>(f, f, f, 1, 8, 96, 6, 0, s)), ConfigError);   // hs 16: not compiled
  CHECK_THROWS_AS((cuda::attention_backward<float>(f, f, f, nullptr, f, 1, 8, 128, 2, 0, s)), ConfigError);  // no out
  CHECK(cuda::attention_supports_head_size(64));
  CHECK_FALSE(cuda::attention_supports_head_size(48));
  AdamWConfig bad;
  bad.beta1 = 1.0f;
  AdamWStep st;
  CHECK_THROWS_AS((cuda::adamw_update<float>(f, f, f, f, 4, bad, 0.0f, st, s)), ConfigError);
  st.t = 0;
  CHECK_THROWS_AS((cuda::adamw_update<float>(f, f, f, f, 4, AdamWConfig{}, 0.0f, st, s)), ConfigError);
  st.t = 1;
  CHECK_THROWS_AS((cuda::adamw_update<float>(f, nullptr, f, f, 4, AdamWConfig{}, 0.0f, st, s)), ConfigError);
}

TEST_CASE("cuda CublasLtGemm rejects bad problems before touching the device", "[nogpu][cuda]") {
  cuda::CublasLtGemm g;  // no CUDA call until the first valid matmul
  float* f = reinterpret_cast<float*>(uintptr_t{256});
  bf16* b = reinterpret_cast<bf16*>(uintptr_t{256});
  cudaStream_t s = nullptr;
  CHECK_THROWS_AS((g.matmul<float, float>(Trans::no, Trans::no, 0, 4, 4, 1, f, 4, f, 4, 0, f, 4, s)), ConfigError);
  CHECK_THROWS_AS((g.matmul<float, float>(Trans::no, Trans::no, 4, 4, 8, 1, f, 7, f, 4, 0, f, 4, s)), ConfigError);  // lda < K
  CHECK_THROWS_AS((g.matmul<float, float>(Trans::yes, Trans::no, 4, 4, 8, 1, f, 3, f, 4, 0, f, 4, s)), ConfigError);  // lda < M
  CHECK_THROWS_AS((g.matmul<float, float>(Trans::no, Trans::yes, 4, 6, 8, 1, f, 8, f, 7, 0, f, 6, s)), ConfigError);  // ldb < K
  CHECK_THROWS_AS((g.matmul<float, float>(Trans::no, Trans::no, 4, 6, 8, 1, f, 8, f, 6, 0, f, 5, s)), ConfigError);  // ldc < N
  CHECK_THROWS_AS((g.matmul<bf16, bf16>(Trans::no, Trans::no, 4, 4, 4, 1, b, 4, nullptr, 4, 0, b, 4, s)), ConfigError);
  cuda::EpilogueArgs<float> e;
  e.kind = cuda::Epilogue::bias;  // but no bias
  CHECK_THROWS_AS((g.matmul<float, float>(Trans::no, Trans::no, 4, 8, 4, 1, f, 4, f, 8, 0, f, 8, e, s)), ConfigError);
  e.bias = f;
  CHECK_THROWS_AS((g.matmul<float, float>(Trans::no, Trans::no, 4, 8, 4, 1, f, 4, f, 8, 1, f, 8, e, s)), ConfigError);  // beta
  e.kind = cuda::Epilogue::none;  // a bias the epilogue would ignore
  CHECK_THROWS_AS((g.matmul<float, float>(Trans::no, Trans::no, 4, 8, 4, 1, f, 4, f, 8, 0, f, 8, e, s)), ConfigError);
  e = {};
  e.kind = cuda::Epilogue::gelu_aux;
  e.aux = f;
  e.ld_aux = 12;  // not a multiple of 8
  CHECK_THROWS_AS((g.matmul<float, float>(Trans::no, Trans::no, 4, 8, 4, 1, f, 4, f, 8, 0, f, 8, e, s)), ConfigError);
  e.ld_aux = 0;  // < N
  CHECK_THROWS_AS((g.matmul<float, float>(Trans::no, Trans::no, 4, 8, 4, 1, f, 4, f, 8, 0, f, 8, e, s)), ConfigError);
  e.kind = cuda::Epilogue::dgelu;
  e.aux = nullptr;
  CHECK_THROWS_AS((g.matmul<float, float>(Trans::no, Trans::no, 4, 8, 4, 1, f, 4, f, 8, 0, f, 8, e, s)), ConfigError);
  CHECK(g.plan_count() == 0);
  CHECK(g.workspace_bytes() == cuda::CublasLtGemm::kDefaultWorkspace);
  CHECK(std::string(cuda::epilogue_name(cuda::Epilogue::gelu_aux_bias)) == "gelu_aux_bias");
}

TEST_CASE("cuda allocator: zero bytes, bad ordinals", "[nogpu][cuda]") {
  cuda::install_cuda_allocator();
  CHECK(&allocator_for(DeviceKind::cuda) == &cuda::cuda_allocator());
  CHECK(cuda::cuda_allocator().name() == "cuda");
  CHECK(cuda::cuda_allocator().allocate(0, 0) == nullptr);  // no CUDA call
  CHECK_THROWS_AS(cuda::cuda_allocator().allocate(16, -1), ConfigError);
  try {
    (void)Tensor::empty({4}, DType::f32, Device::cuda(999));
    FAIL("no error");
  } catch (const DeviceError& e) {
    CHECK_THAT(e.what(), Catch::Contains("cuda:999"));
  }
}
