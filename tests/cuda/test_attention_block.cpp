// The context-parallel attention blocks of the CUDA backend (kernels/attention_block.cu) against
// the CPU reference: the zigzag decomposition over cp = 1, 2, 4 ranks (the harness of the CPU unit
// test, tests/unit/ops/attention_block_testing.h) run on a CudaBackend, in fp32 and bf16, equals
// the whole-sequence ops::attention_forward/backward in fp64 on the same (rounded) inputs; one line
// "cp_block <what> <type> rel_err <e> tol <t> ok|FAIL" per tensor (rel_err = max|gpu - ref| /
// max|ref|; fp32 1e-5, bf16 3e-2 as the emulated backend's CPU test), with K/V packed and read in
// place from qkv, multi-head and grouped-query, head sizes 32, 64 and 128. Then: the same bits on
// a second run (no atomics), rows that see no key keep their bits. Without a GPU only the [nogpu]
// argument checks of the launchers run and the test reports "skipped". The hidden [bench] case
// times the blocks one rank runs against the whole-sequence kernel (benchmarks/device/run_h200.sh).
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "support/gpu_check.h"
#include "triax/backend/backend.h"
#include "triax/core/error.h"
#include "triax/cuda/attention.h"
#include "triax/cuda/cuda_backend.h"
#include "unit/ops/attention_block_testing.h"

using namespace triax;
using namespace triax::test::cpblock;
using Catch::Matchers::Contains;

const triax::test::gpu::CheckLine triax::test::gpu::kCheckLine{"cp_block", 64, 5};

namespace {

const Case kGpuCases[] = {{1, 2, 64, 2, 0, 32}, {2, 2, 64, 4, 2, 32}, {4, 2, 96, 2, 0, 64},
                          {2, 1, 160, 4, 1, 64}, {4, 1, 128, 2, 1, 128}};

template <class R>
void check_case(const Case& c, bool packed, double tol, const char* type) {
  const auto qkv = rounded<R>(triax::test::random_vec(size_t(c.B) * c.T * c.W(), -2.0, 2.0));
  const auto dout = rounded<R>(triax::test::random_vec(size_t(c.B) * c.T * c.C()));
  const Whole want = whole(c, qkv, dout);
  auto gpu = cuda::make_cuda_backend({.device = 0, .compute = dtype_of<R>()});
  const Whole got = blocks<R, float>(*gpu, c, packed, qkv, dout);
  const std::string what = name(c, packed);
  triax::test::gpu::report(what + " out", type, triax::test::gpu::rel_err(got.out, want.out), tol);
  triax::test::gpu::report(what + " lse", type, triax::test::gpu::rel_err(got.lse, want.lse), tol);
  triax::test::gpu::report(what + " dqkv", type, triax::test::gpu::rel_err(got.dqkv, want.dqkv), tol);
}

}  // namespace

TEST_CASE("cuda attention blocks over the zigzag chunks equal whole-sequence attention", "[cuda][cp]") {
  for (const Case& c : kGpuCases)
    for (bool packed : {true, false}) {
      check_case<float>(c, packed, 1e-5, "fp32");
      check_case<bf16>(c, packed, 3e-2, "bf16");
    }
}

TEST_CASE("cuda attention blocks: the same bits twice, untouched rows keep theirs", "[cuda][cp]") {
  const Case c{2, 2, 128, 4, 2, 64};
  const auto qkv = rounded<float>(triax::test::random_vec(size_t(c.B) * c.T * c.W(), -2.0, 2.0));
  const auto dout = rounded<float>(triax::test::random_vec(size_t(c.B) * c.T * c.C()));
  auto gpu = cuda::make_cuda_backend({.device = 0, .compute = DType::f32});
  const Whole a = blocks<float, float>(*gpu, c, true, qkv, dout), b = blocks<float, float>(*gpu, c, true, qkv, dout);
  CHECK(a.out == b.out);
  CHECK(a.lse == b.lse);
  CHECK(a.dqkv == b.dqkv);
  // 64 queries at positions 100.. against 64 keys at 130..: queries 0..29 see none of them.
  const int n = 64, C = c.C(), W = c.W();
  const auto ov = triax::test::random_vec(size_t(c.B) * n * C), lv = triax::test::random_vec(size_t(c.B) * c.NH * n);
  Tensor q = up<float>(*gpu, std::vector<double>(qkv.begin(), qkv.begin() + size_t(c.B) * n * W));
  Tensor out = up<float>(*gpu, ov), lse = up<float>(*gpu, lv);
  gpu->attention_block_forward(out, lse, q, q, ops::AttentionBlock{c.B, C, c.NH, c.NKV, n, 0, n, n, 0, n, W, C, 100, 130});
  const auto o2 = down<float>(*gpu, out), l2 = down<float>(*gpu, lse);
  for (int bb = 0; bb < c.B; ++bb)
    for (int i = 0; i < n; ++i) {
      const size_t row = size_t(bb) * n + i;
      CHECK((std::equal(o2.begin() + row * C, o2.begin() + (row + 1) * C, ov.begin() + row * C) ? 1 : 0) ==
            (i < 30 ? 1 : 0));
      CHECK((l2[(size_t(bb) * c.NH) * n + i] == lv[(size_t(bb) * c.NH) * n + i]) == (i < 30));
    }
}

TEST_CASE("cuda attention block launchers reject bad arguments before touching the device", "[nogpu][cuda][cp]") {
  float* f = reinterpret_cast<float*>(uintptr_t{256});  // never dereferenced: the checks throw first
  cudaStream_t s = nullptr;
  const int NH = 2, hs = 32, C = NH * hs, T = 8;
  const ops::AttentionBlock ok{1, C, NH, 0, T, 0, T, T, 0, T, 3 * C, C, 0, 0};
  auto with = [&](auto edit) {
    ops::AttentionBlock a = ok;
    edit(a);
    return a;
  };
  CHECK_THROWS_WITH(cuda::attention_block_forward<float>(f, f, f, f, with([](auto& a) { a.B = 0; }), s),
                    Contains("B must be positive"));
  CHECK_THROWS_WITH(cuda::attention_block_forward<float>(f, f, f, f, with([](auto& a) { a.nk = T + 1; }), s),
                    Contains("key rows"));
  CHECK_THROWS_WITH(cuda::attention_block_forward<float>(f, f, f, f, with([](auto& a) { a.kv_col0 = 2 * C; }), s),
                    Contains("K/V columns"));
  CHECK_THROWS_WITH(cuda::attention_block_backward<float>(f, f, f, f, f, f, f, with([](auto& a) { a.NKV = 3; }), s),
                    Contains("NKV=3"));
  // Head size 16 is not compiled (C = 32 over 2 heads; the K/V columns still fit).
  CHECK_THROWS_WITH(cuda::attention_block_forward<float>(f, f, f, f, with([](auto& a) { a.C = 32; }), s),
                    Contains("head size 16"));
  CHECK_THROWS_WITH(cuda::attention_block_forward<float>(f, nullptr, f, f, ok, s), Contains("lse is null"));
  CHECK_THROWS_WITH(cuda::attention_block_backward<float>(f, nullptr, f, f, f, f, f, ok, s), Contains("dkv is null"));
}

namespace {

// The blocks rank 0 of cp runs (its queries against every rank's K/V), forward then backward, as
// one timed unit; K/V packed beforehand (the exchange is not timed).
double time_rank_blocks(Backend& be, const Case& c, const Tensor& q, const Tensor& kv, const Tensor& out,
                        const Tensor& lse, const Tensor& dq, const Tensor& dkv, const Tensor& dout) {
  be.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  be.fill(lse, -std::numeric_limits<double>::infinity());
  for (int s = 0; s < c.cp; ++s)
    for_blocks(c, 0, s, true, [&](const ops::AttentionBlock& a) { be.attention_block_forward(out, lse, q, kv, a); });
  for (int s = 0; s < c.cp; ++s)
    for_blocks(c, 0, s, true, [&](const ops::AttentionBlock& a) {
      be.attention_block_backward(dq, dkv, dout, q, kv, out, lse, a);
    });
  be.synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double time_whole(Backend& be, const Case& c, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                  const Tensor& dqkv, const Tensor& dout) {
  be.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  be.attention_forward(out, lse, qkv, c.B, c.T, c.C(), c.NH, c.NKV);
  be.attention_backward(dqkv, dout, qkv, out, lse, c.B, c.T, c.C(), c.NH, c.NKV);
  be.synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

// Hidden (run by name or tag): fp32, B 1, 16 query heads over 4 KV heads of 64, seq 4096..16384
// split over cp 2 and 4; whole-sequence forward+backward and rank 0's blocks alternate, 3 reps
// after a warm-up, medians. Ideal ratio: 1/cp (zigzag balances the causal work).
TEST_CASE("cuda attention blocks: timing of one rank's blocks vs the whole-sequence kernel", "[.][bench][cp]") {
  auto be = cuda::make_cuda_backend({.device = 0, .compute = DType::f32});
  for (int seq : {4096, 8192, 16384})
    for (int cp : {2, 4}) {
      const Case c{cp, 1, seq, 16, 4, 64};
      const int Tl = seq / cp, kvw = 2 * c.kv() * c.hs;
      auto buf = [&](int64_t n) { return be->zeros(Shape{n}, DType::f32); };
      Tensor qkv = up<float>(*be, triax::test::random_vec(size_t(seq) * c.W())), dq_whole = buf(int64_t{seq} * c.W());
      Tensor dout = up<float>(*be, triax::test::random_vec(size_t(seq) * c.C()));
      Tensor out = buf(int64_t{seq} * c.C()), lse = buf(int64_t{c.NH} * seq);
      Tensor q = qkv.slice(0, int64_t{Tl} * c.W()), kv = buf(int64_t{Tl} * kvw), dq = buf(int64_t{Tl} * c.W());
      Tensor dkv = buf(int64_t{Tl} * kvw), bout = buf(int64_t{Tl} * c.C()), blse = buf(int64_t{c.NH} * Tl);
      be->copy_columns(kv, q, Tl, kvw, 0, c.W(), c.C(), kvw);
      Tensor bdout = dout.slice(0, int64_t{Tl} * c.C());
      time_whole(*be, c, qkv, out, lse, dq_whole, dout);  // warm-up
      time_rank_blocks(*be, c, q, kv, bout, blse, dq, dkv, bdout);
      std::vector<double> tw, tb;
      for (int rep = 0; rep < 3; ++rep) {
        tw.push_back(time_whole(*be, c, qkv, out, lse, dq_whole, dout));
        tb.push_back(time_rank_blocks(*be, c, q, kv, bout, blse, dq, dkv, bdout));
      }
      const double w = median(tw), b = median(tb);
      fmt::print("cp_block_timing seq {} cp {} whole_ms {:.2f} rank0_blocks_ms {:.2f} ratio {:.3f} ideal {:.3f}\n", seq,
                 cp, w * 1e3, b * 1e3, b / w, 1.0 / cp);
      std::fflush(stdout);
      CHECK(b > 0);
    }
}
