// cuDNN fused attention (cuda/cudnn_attention.h) against the CPU op ops::attention (double, on the
// very values the GPU sees: half inputs rounded first) and, for bf16 and fp16, against the
// CUDA-core kernels of cuda/attention.h (fp16 held to twice its tolerance there: two rounded
// results): out, lse and each of dQ, dK, dV, odd T, every output poisoned with NaN before the call.
// lse is also fed across (cuDNN's to the kernels' backward and back), which holds only if cuDNN's
// Stats and our lse mean the same thing in the same layout.
// Each check prints "cudnn <what> <type> rel_err <e> tol <t> ok|FAIL", rel_err = max|got - ref| /
// max|ref| (NaN -> inf). Recorded tolerances: out and dqkv 1e-2 for bf16 and 2e-3 for fp16
// (cuDNN rounds P to the input type before P.V, as every flash attention does), lse 1e-4 (fp32
// statistics of exactly representable inputs). Built only with the cuDNN frontend; without a GPU
// only the [nogpu] checks run and the test reports "skipped" (tests/support/cuda_main.cpp).
#include <catch2/catch.hpp>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "support/cuda_buffer.h"
#include "support/gpu_check.h"
#include "triax/core/cuda_check.h"
#include "triax/cuda/attention.h"
#include "triax/cuda/cudnn_attention.h"
#include "triax/ops/attention.h"
#include "unit/ops_testing.h"
#include "support/scoped_env.h"

using namespace triax;
using triax::test::DeviceBuffer;
using Catch::Matchers::Contains;

const triax::test::gpu::CheckLine triax::test::gpu::kCheckLine{"cudnn", 58, 4};

namespace {

// support/gpu_check.h, all but its rel_err (random_data only qualified: glibc's stdlib.h has a
// struct of that name)
namespace gpu = test::gpu;
using test::gpu::fetch;
using test::gpu::poison;
using test::gpu::report;
using test::gpu::Stream;
using test::gpu::tname;
using test::gpu::tol;
using triax::testing::ScopedEnv;

constexpr double kLseTol = 1e-4;

// gpu_check.h's relative error, but inf wherever got is not finite, even where want is not either.
double rel_err(const std::vector<double>& got, const std::vector<double>& want) {
  const double err = test::gpu::rel_err(got, want);
  for (double g : got)
    if (!std::isfinite(g)) return std::numeric_limits<double>::infinity();
  return err;
}

// dQ, dK and dV of a (B, T, 3C) gradient, each checked on its own (a wrong dK would hide behind a
// large dQ in one norm).
void report_dqkv(const std::string& what, const char* type, const std::vector<double>& got,
                 const std::vector<double>& want, int BT, int C, double tolerance) {
  for (int part = 0; part < 3; ++part) {
    std::vector<double> g, w;
    for (size_t t = 0; t < static_cast<size_t>(BT); ++t)
      for (int c = 0; c < C; ++c) {
        const size_t i = t * 3 * C + static_cast<size_t>(part) * C + c;
        g.push_back(got[i]);
        w.push_back(want[i]);
      }
    report(fmt::format("{} d{}", what, "qkv"[part]), type, rel_err(g, w), tolerance);
  }
}

struct Shape {
  int B, T, C, NH;
};

}  // namespace

// ---------------------------------------------------------------- no GPU needed

TEST_CASE("cudnn attention refuses bad arguments before touching the device", "[cudnn][nogpu]") {
  void* p = reinterpret_cast<void*>(uintptr_t{256});
  float* f = reinterpret_cast<float*>(uintptr_t{256});
  CHECK(cuda::cudnn_attention_built());
  CHECK_THAT(cuda::cudnn_attention_version(), Contains("frontend 1."));
  CHECK_THROWS_WITH(cuda::cudnn_attention_forward(DType::f32, p, f, p, 1, 8, 128, 2, 0, nullptr), Contains("float32"));
  CHECK_THROWS_AS(cuda::cudnn_attention_forward(DType::bf16, p, f, p, 1, 8, 100, 3, 0, nullptr), ConfigError);
  CHECK_THROWS_AS(cuda::cudnn_attention_forward(DType::bf16, p, f, p, 0, 8, 128, 2, 0, nullptr), ConfigError);
  CHECK_THROWS_AS(cuda::cudnn_attention_forward(DType::bf16, nullptr, f, p, 1, 8, 128, 2, 0, nullptr), ConfigError);
  CHECK_THROWS_AS(cuda::cudnn_attention_backward(DType::f16, p, p, p, nullptr, f, 1, 8, 128, 2, 0, nullptr), ConfigError);
  CHECK_THROWS_WITH(cuda::cudnn_attention_backward(DType::f16, p, p, p, p, nullptr, 1, 8, 128, 2, 0, nullptr),
                    Contains("lse is null"));
  void* odd = reinterpret_cast<void*>(uintptr_t{256 + 2});  // bf16-aligned, not 16-byte aligned
  CHECK_THROWS_WITH(cuda::cudnn_attention_forward(DType::bf16, p, f, odd, 1, 8, 128, 2, 0, nullptr),
                    Contains("qkv") && Contains("16-byte aligned"));
  CHECK_THROWS_AS(cuda::cudnn_attention_backward(DType::bf16, odd, p, p, p, f, 1, 8, 128, 2, 0, nullptr), ConfigError);
  CHECK_THAT(cuda::cudnn_attention_unsupported_reason(DType::f32, 1, 8, 2, 64).value_or(""), Contains("float32"));
  CHECK(cuda::cudnn_attention_unsupported_reason(DType::bf16, 1, 0, 2, 64).has_value());
  ScopedEnv e("TRIAX_ATTENTION", "kernel");
  CHECK_FALSE(cuda::use_cudnn_attention(DType::bf16, 1, 8, 128, 2));
}

TEST_CASE("cudnn attention graphs pass the frontend's checks for sm_80 and sm_90, without a device", "[cudnn][nogpu]") {
  const Shape shapes[] = {{2, 200, 256, 4}, {1, 131, 384, 3}, {3, 77, 128, 4}, {8, 1024, 768, 12}};
  for (const int sm : {80, 90})
    for (const DType dt : {DType::bf16, DType::f16})
      for (const Shape sh : shapes) {
        const auto why = cuda::cudnn_attention_check_graphs(dt, sh.B, sh.T, sh.NH, sh.C / sh.NH, sm);
        INFO("sm_" << sm << " " << dtype_name(dt) << " B=" << sh.B << " T=" << sh.T << " C=" << sh.C << " NH=" << sh.NH
                   << ": " << why.value_or("ok"));
        CHECK_FALSE(why.has_value());
      }
  // What the frontend refuses up front: a head size that is not a multiple of 8, fp32.
  const auto odd = cuda::cudnn_attention_check_graphs(DType::bf16, 1, 16, 3, 12, 90);
  fmt::print("cudnn check_graphs HS=12: {}\n", odd.value_or("accepted"));
  CHECK(odd.has_value());
  CHECK(cuda::cudnn_attention_check_graphs(DType::f32, 1, 16, 2, 64, 90).has_value());
}

TEST_CASE("cudnn grouped-query attention graphs pass the frontend's checks; bad kv head counts are refused",
          "[cudnn][nogpu]") {
  struct Gqa {
    int B, T, NH, NKV, HS;
  };
  for (const int sm : {80, 90})
    for (const DType dt : {DType::bf16, DType::f16})
      for (const Gqa g : {Gqa{2, 200, 8, 2, 64}, Gqa{1, 131, 4, 1, 128}, Gqa{3, 77, 32, 8, 64}, Gqa{1, 64, 4, 4, 32}}) {
        const auto why = cuda::cudnn_attention_check_graphs(dt, g.B, g.T, g.NH, g.HS, sm, g.NKV);
        INFO("sm_" << sm << " " << dtype_name(dt) << " B=" << g.B << " T=" << g.T << " NH=" << g.NH << " NKV=" << g.NKV
                   << " HS=" << g.HS << ": " << why.value_or("ok"));
        CHECK_FALSE(why.has_value());
      }
  CHECK_THAT(cuda::cudnn_attention_check_graphs(DType::bf16, 1, 16, 4, 64, 90, 3).value_or(""), Contains("NKV=3"));
  CHECK_THAT(cuda::cudnn_attention_unsupported_reason(DType::bf16, 1, 16, 4, 64, 3).value_or(""), Contains("NKV=3"));
  void* p = reinterpret_cast<void*>(uintptr_t{256});
  float* f = reinterpret_cast<float*>(uintptr_t{256});
  CHECK_THROWS_WITH(cuda::cudnn_attention_forward(DType::bf16, p, f, p, 1, 8, 256, 4, 3, nullptr), Contains("NKV=3"));
  CHECK_THROWS_AS(cuda::cudnn_attention_backward(DType::bf16, p, p, p, p, f, 1, 8, 256, 4, -1, nullptr), ConfigError);
}

// ---------------------------------------------------------------- on the GPU

TEMPLATE_TEST_CASE("cudnn attention forward/backward match ops::attention", "[cuda][cudnn]", bf16, f16) {
  using T = TestType;
  Stream s;
  fmt::print("{}\n", cuda::cudnn_attention_version());
  for (const Shape sh : {Shape{2, 200, 256, 4}, Shape{1, 131, 384, 3}, Shape{3, 77, 128, 4}, Shape{1, 9, 64, 1}}) {
    const auto [B, Tn, C, NH] = sh;
    const std::string what = fmt::format("B={} T={} C={} NH={} hs={}", B, Tn, C, NH, C / NH);
    const auto why = cuda::cudnn_attention_unsupported_reason(dtype_of<T>(), B, Tn, NH, C / NH);
    INFO(what << ": " << why.value_or("supported"));
    REQUIRE_FALSE(why.has_value());
    const size_t n3 = static_cast<size_t>(B) * Tn * 3 * C, n1 = static_cast<size_t>(B) * Tn * C;
    const size_t nl = static_cast<size_t>(B) * NH * Tn;
    auto qkv = gpu::random_data<T>(n3, -2, 2), dout = gpu::random_data<T>(n1, -1, 1);
    DeviceBuffer<T> dqkv_in(qkv.dev), ddout(dout.dev), out(n1), dqkv(n3);
    DeviceBuffer<float> lse(nl);
    std::vector<double> rout(n1), rlse(nl), rdqkv(n3);
    ops::attention_forward(rout.data(), rlse.data(), qkv.ref.data(), B, Tn, C, NH);
    ops::attention_backward(rdqkv.data(), dout.ref.data(), qkv.ref.data(), rlse.data(), B, Tn, C, NH);
    poison(out);
    poison(lse);
    cuda::cudnn_attention_forward(dtype_of<T>(), out.data(), lse.data(), dqkv_in.data(), B, Tn, C, NH, 0, s);
    report("forward out " + what, tname<T>(), rel_err(fetch(out, s), rout), tol<T>());
    report("forward lse " + what, tname<T>(), rel_err(fetch(lse, s), rlse), kLseTol);
    poison(dqkv);
    cuda::cudnn_attention_backward(dtype_of<T>(), dqkv.data(), ddout.data(), dqkv_in.data(), out.data(), lse.data(), B,
                                   Tn, C, NH, 0, s);
    const auto got = fetch(dqkv, s);
    report_dqkv("backward " + what, tname<T>(), got, rdqkv, B * Tn, C, tol<T>());
    // A second run: the same bits where cuDNN runs its deterministic algorithm.
    cuda::cudnn_attention_backward(dtype_of<T>(), dqkv.data(), ddout.data(), dqkv_in.data(), out.data(), lse.data(), B,
                                   Tn, C, NH, 0, s);
    const auto again = fetch(dqkv, s);
    const bool det = cuda::cudnn_attention_backward_deterministic(dtype_of<T>(), B, Tn, NH, C / NH);
    const bool same = std::memcmp(again.data(), got.data(), got.size() * sizeof(double)) == 0;
    fmt::print("cudnn backward {} {}: deterministic algorithm {}, second run {}\n", what, tname<T>(),
               det ? "yes" : "no", same ? "bit-identical" : "differs");
    if (det) CHECK(same);
  }
}

TEMPLATE_TEST_CASE("cudnn attention and the CUDA kernels agree, and read each other's lse", "[cuda][cudnn]", bf16,
                   f16) {
  using T = TestType;
  // Two results each within tol<T>() of the reference: bf16's 1e-2 covers their difference, fp16's
  // 2e-3 is doubled.
  const double t = std::is_same_v<T, f16> ? 2 * tol<T>() : tol<T>();
  Stream s;
  for (const Shape sh : {Shape{2, 333, 768, 12}, Shape{1, 129, 256, 2}}) {
    const auto [B, Tn, C, NH] = sh;
    const std::string what = fmt::format("B={} T={} C={} NH={}", B, Tn, C, NH);
    REQUIRE(cuda::cudnn_attention_supported(dtype_of<T>(), B, Tn, NH, C / NH));
    const size_t n3 = static_cast<size_t>(B) * Tn * 3 * C, n1 = static_cast<size_t>(B) * Tn * C;
    const size_t nl = static_cast<size_t>(B) * NH * Tn;
    auto qkv = gpu::random_data<T>(n3, -2, 2), dout = gpu::random_data<T>(n1, -1, 1);
    DeviceBuffer<T> dq(qkv.dev), ddo(dout.dev), out_c(n1), out_k(n1), dqkv_c(n3), dqkv_k(n3);
    DeviceBuffer<float> lse_c(nl), lse_k(nl);
    poison(out_c);
    poison(lse_c);
    poison(out_k);
    poison(lse_k);
    cuda::cudnn_attention_forward(dtype_of<T>(), out_c.data(), lse_c.data(), dq.data(), B, Tn, C, NH, 0, s);
    cuda::attention_forward(out_k.data(), lse_k.data(), dq.data(), B, Tn, C, NH, 0, s);
    const auto ok = fetch(out_k, s), lk = fetch(lse_k, s);
    report("vs kernel: forward out " + what, tname<T>(), rel_err(fetch(out_c, s), ok), t);
    report("vs kernel: forward lse " + what, tname<T>(), rel_err(fetch(lse_c, s), lk), kLseTol);
    poison(dqkv_c);
    poison(dqkv_k);
    cuda::cudnn_attention_backward(dtype_of<T>(), dqkv_c.data(), ddo.data(), dq.data(), out_c.data(), lse_c.data(), B,
                                   Tn, C, NH, 0, s);
    cuda::attention_backward(dqkv_k.data(), ddo.data(), dq.data(), out_k.data(), lse_k.data(), B, Tn, C, NH, 0, s);
    const auto gk = fetch(dqkv_k, s);
    report_dqkv("vs kernel: backward " + what, tname<T>(), fetch(dqkv_c, s), gk, B * Tn, C, t);
    // Crossed: the kernels' backward on cuDNN's forward, and cuDNN's backward on the kernels'.
    poison(dqkv_c);
    cuda::attention_backward(dqkv_c.data(), ddo.data(), dq.data(), out_c.data(), lse_c.data(), B, Tn, C, NH, 0, s);
    report_dqkv("kernel backward on cudnn lse " + what, tname<T>(), fetch(dqkv_c, s), gk, B * Tn, C, t);
    poison(dqkv_c);
    cuda::cudnn_attention_backward(dtype_of<T>(), dqkv_c.data(), ddo.data(), dq.data(), out_k.data(), lse_k.data(), B,
                                   Tn, C, NH, 0, s);
    report_dqkv("cudnn backward on kernel lse " + what, tname<T>(), fetch(dqkv_c, s), gk, B * Tn, C, t);
  }
}

// Grouped-query attention: cuDNN (K/V with NKV heads, strided inside the packed row) against the
// CUDA kernels, whose GQA path tests/cuda/test_llama_kernels.cpp checks against a double reference.
TEMPLATE_TEST_CASE("cudnn grouped-query attention agrees with the CUDA kernels", "[cuda][cudnn]", bf16, f16) {
  using T = TestType;
  const double t = std::is_same_v<T, f16> ? 2 * tol<T>() : tol<T>();
  Stream s;
  struct Gqa {
    int B, T, NH, NKV, HS;
  };
  for (const Gqa g : {Gqa{2, 200, 8, 2, 64}, Gqa{1, 131, 4, 1, 128}}) {
    const int B = g.B, Tn = g.T, NH = g.NH, NKV = g.NKV, C = NH * g.HS;
    const std::string what = fmt::format("gqa B={} T={} NH={} NKV={} HS={}", B, Tn, NH, NKV, g.HS);
    const auto why = cuda::cudnn_attention_unsupported_reason(dtype_of<T>(), B, Tn, NH, g.HS, NKV);
    INFO(what << ": " << why.value_or("supported"));
    REQUIRE_FALSE(why.has_value());
    const size_t W = size_t(C) + 2 * size_t(NKV) * g.HS, rows = size_t(B) * Tn;
    const size_t nq = rows * W, n1 = rows * C, nl = size_t(B) * NH * Tn;
    auto qkv = gpu::random_data<T>(nq, -2, 2), dout = gpu::random_data<T>(n1, -1, 1);
    DeviceBuffer<T> dq(qkv.dev), ddo(dout.dev), out_c(n1), out_k(n1), dqkv_c(nq), dqkv_k(nq);
    DeviceBuffer<float> lse_c(nl), lse_k(nl);
    poison(out_c);
    poison(lse_c);
    cuda::cudnn_attention_forward(dtype_of<T>(), out_c.data(), lse_c.data(), dq.data(), B, Tn, C, NH, NKV, s);
    cuda::attention_forward(out_k.data(), lse_k.data(), dq.data(), B, Tn, C, NH, NKV, s);
    report("vs kernel: forward out " + what, tname<T>(), rel_err(fetch(out_c, s), fetch(out_k, s)), t);
    report("vs kernel: forward lse " + what, tname<T>(), rel_err(fetch(lse_c, s), fetch(lse_k, s)), kLseTol);
    poison(dqkv_c);
    cuda::cudnn_attention_backward(dtype_of<T>(), dqkv_c.data(), ddo.data(), dq.data(), out_c.data(), lse_c.data(), B,
                                   Tn, C, NH, NKV, s);
    cuda::attention_backward(dqkv_k.data(), ddo.data(), dq.data(), out_k.data(), lse_k.data(), B, Tn, C, NH, NKV, s);
    const auto gc = fetch(dqkv_c, s), gk = fetch(dqkv_k, s);
    const size_t bounds[4] = {0, size_t(C), size_t(C) + size_t(NKV) * g.HS, W};
    for (int p = 0; p < 3; ++p) {
      std::vector<double> a, b;
      for (size_t r = 0; r < rows; ++r)
        for (size_t c = bounds[p]; c < bounds[p + 1]; ++c) a.push_back(gc[r * W + c]), b.push_back(gk[r * W + c]);
      report(fmt::format("vs kernel: backward {} d{}", what, "qkv"[p]), tname<T>(), rel_err(a, b), t);
    }
  }
}

TEST_CASE("cudnn attention caches its graphs and workspace, and TRIAX_ATTENTION selects it", "[cuda][cudnn]") {
  Stream s;
  const int B = 2, Tn = 64, C = 128, NH = 2;
  REQUIRE(cuda::cudnn_attention_supported(DType::bf16, B, Tn, NH, C / NH));
  const size_t ws = cuda::cudnn_attention_workspace_bytes();
  DeviceBuffer<bf16> qkv(static_cast<size_t>(B) * Tn * 3 * C), out(static_cast<size_t>(B) * Tn * C);
  DeviceBuffer<float> lse(static_cast<size_t>(B) * NH * Tn);
  TRIAX_CHECK_CUDA(cudaMemset(qkv.data(), 0, qkv.size() * sizeof(bf16)));
  for (int i = 0; i < 3; ++i)
    cuda::cudnn_attention_forward(DType::bf16, out.data(), lse.data(), qkv.data(), B, Tn, C, NH, 0, s);
  s.sync();
  CHECK(cuda::cudnn_attention_workspace_bytes() == ws);  // no growth once the shape is built
  // All-zero q, k: uniform attention, lse = log(number of keys seen) exactly.
  const auto l = lse.download();
  CHECK(std::abs(l[0] - 0.0f) < 1e-6f);
  CHECK(std::abs(l[Tn - 1] - std::log(static_cast<float>(Tn))) < 1e-4f);
  {
    ScopedEnv e("TRIAX_ATTENTION", std::nullopt);
    CHECK(cuda::use_cudnn_attention(DType::bf16, B, Tn, C, NH));
    CHECK_FALSE(cuda::use_cudnn_attention(DType::f32, B, Tn, C, NH));
  }
  {
    ScopedEnv e("TRIAX_ATTENTION", "kernel");
    CHECK_FALSE(cuda::use_cudnn_attention(DType::bf16, B, Tn, C, NH));
  }
  {
    // Head size 12 (not a multiple of 8): cuDNN rejects it; auto falls back, cudnn refuses.
    CHECK_FALSE(cuda::cudnn_attention_supported(DType::bf16, 1, 16, 3, 12));
    ScopedEnv e("TRIAX_ATTENTION", "cudnn");
    CHECK_THROWS_AS(cuda::use_cudnn_attention(DType::bf16, 1, 16, 36, 3), ConfigError);
    DeviceBuffer<bf16> q2(16 * 3 * 36), o2(16 * 36);
    DeviceBuffer<float> l2(3 * 16);
    CHECK_THROWS_AS(cuda::cudnn_attention_forward(DType::bf16, o2.data(), l2.data(), q2.data(), 1, 16, 36, 3, 0, s),
                    DeviceError);
  }
}

TEST_CASE("cudnn attention vs the CUDA kernels: time at the GPT-2 124M shape", "[cuda][cudnn][timing]") {
  Stream s;
  const int B = 8, Tn = 1024, C = 768, NH = 12;
  REQUIRE(cuda::cudnn_attention_supported(DType::bf16, B, Tn, NH, C / NH));
  const size_t n3 = static_cast<size_t>(B) * Tn * 3 * C, n1 = static_cast<size_t>(B) * Tn * C;
  auto qkv = gpu::random_data<bf16>(n3, -2, 2), dout = gpu::random_data<bf16>(n1, -1, 1);
  DeviceBuffer<bf16> dq(qkv.dev), ddo(dout.dev), out(n1), dqkv(n3);
  DeviceBuffer<float> lse(static_cast<size_t>(B) * NH * Tn);
  auto time_ms = [&](auto&& f) {
    f();  // warm-up
    s.sync();
    const int reps = 10;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) f();
    s.sync();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
  };
  const double cf = time_ms([&] {
    cuda::cudnn_attention_forward(DType::bf16, out.data(), lse.data(), dq.data(), B, Tn, C, NH, 0, s);
  });
  const double cb = time_ms([&] {
    cuda::cudnn_attention_backward(DType::bf16, dqkv.data(), ddo.data(), dq.data(), out.data(), lse.data(), B, Tn, C,
                                   NH, 0, s);
  });
  const double kf = time_ms([&] { cuda::attention_forward(out.data(), lse.data(), dq.data(), B, Tn, C, NH, 0, s); });
  const double kb = time_ms([&] {
    cuda::attention_backward(dqkv.data(), ddo.data(), dq.data(), out.data(), lse.data(), B, Tn, C, NH, 0, s);
  });
  // Causal attention FLOPs: 2 GEMMs forward, 5 backward (incl. recomputing S), over half the scores.
  const double fwd_flop = 4.0 * B * NH * double(Tn) * Tn * (C / NH) / 2, bwd_flop = fwd_flop * 2.5;
  fmt::print("timing attention B={} T={} C={} NH={} bf16: cudnn fwd {:.3f} ms ({:.0f} TFLOP/s) bwd {:.3f} ms ({:.0f} "
             "TFLOP/s); kernels fwd {:.3f} ms bwd {:.3f} ms; speed-up fwd {:.1f}x bwd {:.1f}x\n",
             B, Tn, C, NH, cf, fwd_flop / cf * 1e-9, cb, bwd_flop / cb * 1e-9, kf, kb, kf / cf, kb / cb);
  CHECK(cf < kf);  // the fast path is faster, or it has no reason to exist
  CHECK(cb < kb);
}
