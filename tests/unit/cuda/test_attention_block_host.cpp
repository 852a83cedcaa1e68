// The context-parallel attention block kernels (kernels/attention_block.cuh, launched by
// kernels/attention_block.cu) run on the host, in every build and without a GPU: one std::thread
// per CUDA thread of a block, a std::barrier for __syncthreads, shared memory as the kernel's
// static arrays, blocks one after the other, the grids the launchers use. Against the CPU ops
// (ops::attention_block_forward/backward, fp32): out, lse, dq and dkv within 2e-5 of the largest
// value, on blocks with a tail tile, offset rows and positions, grouped-query heads, packed and
// in-place K/V, from running (out, lse) with some rows at lse = -inf; and the rows no query/key of
// which takes part keep their bits (what the kernels must not write). What this cannot see: the
// device's own behaviour (memory model, bf16/f16 storage, the launch itself): that is
// tests/cuda/test_attention_block.cpp, on a GPU.
#include <catch2/catch.hpp>

#include <barrier>
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "triax/ops/attention.h"
#include "unit/ops_testing.h"

// ---- the CUDA built-ins the kernels use, for one block at a time
namespace emu {
struct Dim3 {
  unsigned x = 0, y = 0, z = 0;
};
inline std::barrier<>* block_barrier = nullptr;
}  // namespace emu
thread_local emu::Dim3 threadIdx, blockIdx;
inline emu::Dim3 blockDim;
inline void __syncthreads() { emu::block_barrier->arrive_and_wait(); }  // NOLINT: the CUDA name
using std::max;
using std::min;
#define __global__
#define __device__
#define __shared__ static
#define __launch_bounds__(n)
namespace triax::cuda::detail {  // common.cuh's helpers the kernels use, for float
inline float to_f32(float x) { return x; }
template <class D>
D from_f32(float x) {
  return x;
}
inline constexpr int kThreads = 1;  // the delta kernel: one "thread" striding over every row
inline int64_t global_index() { return 0; }
inline int64_t global_stride() { return 1; }
}  // namespace triax::cuda::detail
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunknown-pragmas"  // #pragma unroll
#include "../../../kernels/attention_block.cuh"
#pragma GCC diagnostic pop

namespace {

namespace k = triax::cuda;

// Runs f as grid x threads CUDA threads.
template <class F>
void launch(emu::Dim3 grid, unsigned threads, F f) {
  blockDim = {threads, 1, 1};
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        std::barrier<> bar(threads);
        emu::block_barrier = &bar;
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < threads; ++t)
          ts.emplace_back([&, t] {
            threadIdx = {t, 0, 0};
            blockIdx = {x, y, z};
            f();
          });
        for (auto& t : ts) t.join();
      }
}

struct Shape {
  int B, NH, NKV, q_T, q_row0, nq, kv_T, kv_row0, nk;
  int64_t q_pos0, k_pos0;
  bool packed;
};

std::vector<float> rnd(size_t n) {
  const auto v = triax::test::random_vec(n, -2.0, 2.0);
  return {v.begin(), v.end()};
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b, double* scale) {
  double d = 0, s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(b[i])) {
      d = std::max(d, a[i] == b[i] ? 0.0 : INFINITY);
      continue;
    }
    d = std::max(d, double(std::abs(a[i] - b[i])));
    s = std::max(s, double(std::abs(b[i])));
  }
  *scale = s;
  return d;
}

void require_near(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  double scale = 0;
  const double d = max_abs_diff(got, want, &scale);
  INFO(what << ": max |emulated - cpu| " << d << ", largest " << scale);
  CHECK(d <= 2e-5 * scale);
}

// Whether row i of q (query rows) or row j of kv (key rows) of the block takes part: a query that
// sees a key, a key that a query sees.
bool query_sees(const triax::ops::AttentionBlock& a, int row) {
  const int i = row - a.q_row0;
  return i >= 0 && i < a.nq && a.nk > 0 && a.q_pos0 + i >= a.k_pos0;
}
bool key_seen(const triax::ops::AttentionBlock& a, int row) {
  const int j = row - a.kv_row0;
  return j >= 0 && j < a.nk && a.nq > 0 && a.k_pos0 + j <= a.q_pos0 + a.nq - 1;
}

// Rows outside the block's part (per row width w) keep the initial bits.
template <class Pred>
void require_rows_kept(const std::vector<float>& got, const std::vector<float>& init, int B, int T, int w, Pred part,
                       const char* what) {
  size_t changed = 0;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      if (!part(t))
        for (int c = 0; c < w; ++c) {
          const size_t e = (size_t(b) * T + t) * w + c;
          changed += !(got[e] == init[e] || (std::isnan(got[e]) && std::isnan(init[e])));
        }
  INFO(what);
  CHECK(changed == 0);
}

}  // namespace

TEST_CASE("attention block kernels, emulated on the host, match the cpu ops") {
  constexpr int HS = 32;
  const Shape shapes[] = {
      {2, 2, 1, 80, 5, 70, 60, 10, 45, 100, 90, true},   // tail tiles, offsets, GQA, diagonal band
      {1, 4, 2, 40, 0, 40, 40, 0, 40, 0, 0, false},      // the diagonal block of a chunk, K/V in qkv
      {1, 2, 2, 100, 3, 90, 100, 7, 80, 30, 60, true},   // queries 0..29 see no key
      {2, 2, 1, 70, 0, 70, 70, 0, 70, 200, 40, false},   // every query sees every key
      {1, 2, 1, 33, 0, 33, 33, 0, 33, 10, 30, true},     // queries 0..19 see no key, keys 13.. no query
  };
  for (const Shape& s : shapes) {
    INFO("q rows " << s.q_row0 << "+" << s.nq << " at " << s.q_pos0 << ", k rows " << s.kv_row0 << "+" << s.nk
                   << " at " << s.k_pos0 << (s.packed ? " packed" : " in qkv"));
    const int C = s.NH * HS, qw = C + 2 * s.NKV * HS, kvw = s.packed ? 2 * s.NKV * HS : qw;
    const triax::ops::AttentionBlock a{s.B,       s.NH * HS, s.NH, s.NKV, s.q_T, s.q_row0,         s.nq,
                                       s.kv_T,    s.kv_row0, s.nk, kvw,   s.packed ? 0 : C, s.q_pos0, s.k_pos0};
    const auto q = rnd(size_t(s.B) * s.q_T * qw), kv = rnd(size_t(s.B) * s.kv_T * kvw);
    const auto dout = rnd(size_t(s.B) * s.q_T * C), out0 = rnd(size_t(s.B) * s.q_T * C);
    auto lse0 = rnd(size_t(s.B) * s.NH * s.q_T);
    for (size_t i = 0; i < lse0.size(); i += 3) lse0[i] = -std::numeric_limits<float>::infinity();  // no block yet
    const auto dq0 = rnd(q.size()), dkv0 = rnd(kv.size());
    auto out_c = out0, lse_c = lse0, dq_c = dq0, dkv_c = dkv0;
    triax::ops::attention_block_forward<float>(out_c.data(), lse_c.data(), q.data(), kv.data(), a);
    triax::ops::attention_block_backward<float>(dq_c.data(), dkv_c.data(), dout.data(), q.data(), kv.data(),
                                                out_c.data(), lse_c.data(), a);
    auto out_e = out0, lse_e = lse0, dq_e = dq0, dkv_e = dkv0;
    const k::Geo g{C,   s.NH,   s.NKV,     s.NH / s.NKV, qw,   s.q_T,           s.q_row0, s.nq,
                   s.kv_T, s.kv_row0, s.nk, kvw,          s.packed ? 0 : C, s.q_pos0,        s.k_pos0};
    const float scale = 1.0f / std::sqrt(float(HS));
    const auto NH = unsigned(s.NH), B = unsigned(s.B), T = unsigned(k::kBlock);
    const emu::Dim3 gq{unsigned(s.nq + k::kBlock - 1) / T, NH, B}, gk{unsigned(s.nk + k::kBlock - 1) / T, unsigned(s.NKV), B};
    launch(gq, T, [&] { k::block_forward_kernel<float, HS>(out_e.data(), lse_e.data(), q.data(), kv.data(), g, scale); });
    std::vector<float> delta(size_t(s.B) * s.NH * s.nq);
    launch({1, 1, 1}, 1, [&] { k::block_delta_kernel<float>(delta.data(), dout.data(), out_e.data(), s.B, g, HS); });
    launch(gq, T, [&] {
      k::block_dq_kernel<float, HS>(dq_e.data(), dout.data(), q.data(), kv.data(), lse_e.data(), delta.data(), g, scale);
    });
    launch(gk, T, [&] {
      k::block_dkv_kernel<float, HS>(dkv_e.data(), dout.data(), q.data(), kv.data(), lse_e.data(), delta.data(), g,
                                     scale);
    });
    require_near(out_e, out_c, "out");
    require_near(lse_e, lse_c, "lse");
    require_near(dq_e, dq_c, "dq");
    require_near(dkv_e, dkv_c, "dkv");
    const auto sees = [&](int t) { return query_sees(a, t); };
    const auto seen = [&](int t) { return key_seen(a, t); };
    require_rows_kept(out_e, out0, s.B, s.q_T, C, sees, "out rows that see no key");
    require_rows_kept(dq_e, dq0, s.B, s.q_T, qw, sees, "dq rows that see no key");
    require_rows_kept(dkv_e, dkv0, s.B, s.kv_T, kvw, seen, "dkv rows no query sees");
    for (int bh = 0; bh < s.B * s.NH; ++bh)
      require_rows_kept(std::vector<float>(lse_e.begin() + bh * s.q_T, lse_e.begin() + (bh + 1) * s.q_T),
                        std::vector<float>(lse0.begin() + bh * s.q_T, lse0.begin() + (bh + 1) * s.q_T), 1, s.q_T, 1,
                        sees, "lse rows that see no key");
  }
}
