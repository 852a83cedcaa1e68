// The CUDA backend against the CPU reference backend, op by op through the Backend seam: the same
// random inputs (rounded to the GPU buffer's type first, so both see the same values) on odd sizes
// (N=37, C=67, V=101; attention with T=37, not a multiple of the tile), every overwritten output
// poisoned with NaN before the op (accumulated outputs start from random values), one line per
// check "op <name> <dtype> rel_err <e> tol <t> ok|FAIL", rel_err = max|gpu - cpu| / max|cpu|
// (NaN -> inf), each op from the same inputs on both sides. Tolerances by the type the GPU stores:
// float32 1e-5 (no TF32), bfloat16 1e-2, float16 2e-3 (10 mantissa bits to bfloat16's 7). Every
// layer op runs for all three compute types.
// Then the determinism of scatter_add_rows, events, synchronize, memory accounting, the scratch
// arena and the argument errors. This table is step 1 of the device run. Without a GPU only the
// [nogpu] checks run and the test reports "skipped" (exit 77, tests/support/cuda_main.cpp).
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "support/gpu_check.h"
#include "triax/backend/backend.h"
#include "triax/cuda/cuda_backend.h"
#include "triax/ops/adamw.h"
#include "unit/ops_testing.h"

using namespace triax;
using Catch::Matchers::Contains;

const triax::test::gpu::CheckLine triax::test::gpu::kCheckLine{"op", 44, 9};

namespace bt {

constexpr int N = 37, C = 67, V = 101, OC = 45;

// A GPU backend of one compute type and the CPU reference (float32).
struct Ctx {
  DType dt;
  std::unique_ptr<Backend> gpu = cuda::make_cuda_backend({.device = 0, .compute = dt});
  std::unique_ptr<Backend> cpu = make_cpu_backend();
};

double round_to(DType dt, double x) {
  switch (dt) {
    case DType::bf16: return static_cast<float>(bf16(static_cast<float>(x)));
    case DType::f16: return static_cast<float>(f16(static_cast<float>(x)));
    case DType::f32: return static_cast<float>(x);
    default: return x;
  }
}

// Host bytes of v in dtype dt.
std::vector<unsigned char> encode(DType dt, const std::vector<double>& v) {
  std::vector<unsigned char> b(v.size() * dtype_size(dt));
  for (size_t i = 0; i < v.size(); ++i) {
    unsigned char* p = b.data() + i * dtype_size(dt);
    switch (dt) {
      case DType::f32: { const float f = static_cast<float>(v[i]); std::memcpy(p, &f, 4); break; }
      case DType::f64: std::memcpy(p, &v[i], 8); break;
      case DType::bf16: { const bf16 h(static_cast<float>(v[i])); std::memcpy(p, &h, 2); break; }
      case DType::f16: { const f16 h(static_cast<float>(v[i])); std::memcpy(p, &h, 2); break; }
      case DType::i32: { const auto k = static_cast<int32_t>(v[i]); std::memcpy(p, &k, 4); break; }
      case DType::i64: { const auto k = static_cast<int64_t>(v[i]); std::memcpy(p, &k, 8); break; }
      case DType::u8: p[0] = static_cast<unsigned char>(v[i]); break;
    }
  }
  return b;
}

std::vector<double> decode(DType dt, const std::vector<unsigned char>& b) {
  const size_t es = dtype_size(dt), n = b.size() / es;
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char* p = b.data() + i * es;
    switch (dt) {
      case DType::f32: { float f; std::memcpy(&f, p, 4); v[i] = f; break; }
      case DType::f64: std::memcpy(&v[i], p, 8); break;
      case DType::bf16: { bf16 h; std::memcpy(&h, p, 2); v[i] = static_cast<float>(h); break; }
      case DType::f16: { f16 h; std::memcpy(&h, p, 2); v[i] = static_cast<float>(h); break; }
      case DType::i32: { int32_t k; std::memcpy(&k, p, 4); v[i] = k; break; }
      case DType::i64: { int64_t k; std::memcpy(&k, p, 8); v[i] = static_cast<double>(k); break; }
      case DType::u8: v[i] = p[0]; break;
    }
  }
  return v;
}

Tensor upload(Backend& be, DType dt, const std::vector<double>& v) {
  Tensor t = be.empty(Shape{static_cast<int64_t>(v.size())}, dt);
  const auto b = encode(dt, v);
  be.copy_from_host(t, b.data(), b.size());
  return t;
}

std::vector<double> download(Backend& be, const Tensor& t) {
  std::vector<unsigned char> b(t.nbytes());
  be.copy_to_host(b.data(), t, b.size());
  return decode(t.dtype(), b);
}

// The same values on both backends: dt on the GPU, float32 (or int32) on the CPU.
struct Pair {
  Tensor g, c;
};
Pair pair(Ctx& x, DType gpu_dt, const std::vector<double>& v0) {
  std::vector<double> v(v0.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = round_to(gpu_dt, v0[i]);
  const DType cdt = gpu_dt == DType::i32 ? DType::i32 : (gpu_dt == DType::f64 ? DType::f64 : DType::f32);
  return {upload(*x.gpu, gpu_dt, v), upload(*x.cpu, cdt, v)};
}
Pair rand_pair(Ctx& x, DType gpu_dt, size_t n, double lo = -1.0, double hi = 1.0) {
  return pair(x, gpu_dt, test::random_vec(n, lo, hi));
}
// An output: NaN (all bits set) on the GPU, so an element the op does not write fails.
Pair out_pair(Ctx& x, DType gpu_dt, size_t n) {
  Pair p{x.gpu->empty(Shape{static_cast<int64_t>(n)}, gpu_dt),
         x.cpu->zeros(Shape{static_cast<int64_t>(n)}, gpu_dt == DType::f64 ? DType::f64 : DType::f32)};
  const std::vector<unsigned char> ones(p.g.nbytes(), 0xff);
  x.gpu->copy_from_host(p.g, ones.data(), ones.size());
  return p;
}

using test::gpu::rel_err;  // support/gpu_check.h

double tol_for(DType dt) {
  switch (dt) {
    case DType::bf16: return 1e-2;
    case DType::f16: return 2e-3;
    default: return 1e-5;
  }
}

void report(const std::string& op, DType dt, double err, double tol) {
  test::gpu::report(op, dtype_name(dt), err, tol);
}

// Compares the GPU tensor with the CPU one, then gives the CPU tensor the GPU's values: a later op
// that reads this buffer starts from the same inputs on both sides, so each line measures one op
// (bfloat16 rounding does not pile up along a chain of ops).
void check(Ctx& x, const std::string& op, const Pair& p, double tol = -1) {
  const auto g = download(*x.gpu, p.g), c = download(*x.cpu, p.c);
  report(op, p.g.dtype(), rel_err(g, c), tol >= 0 ? tol : tol_for(p.g.dtype()));
  const auto b = encode(p.c.dtype(), g);
  x.cpu->copy_from_host(p.c, b.data(), b.size());
}

std::vector<double> ints(size_t n, int lo, int hi_exclusive) {
  const auto v = test::random_ints(n, lo, hi_exclusive);
  return {v.begin(), v.end()};
}

const DType kComputeTypes[] = {DType::f32, DType::bf16, DType::f16};

}  // namespace bt

using bt::Ctx;
using bt::N;
using bt::C;
using bt::V;
using bt::OC;

TEST_CASE("cuda backend: copies and fills in every dtype", "[cuda][backend]") {
  Ctx x{DType::f32};
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8}) {
    const auto v = bt::ints(101, 0, 100);
    Tensor t = bt::upload(*x.gpu, dt, v);
    bt::report("copy_from_host/copy_to_host", dt, bt::rel_err(bt::download(*x.gpu, t), v), 0);
    Tensor u = x.gpu->empty(Shape{101}, dt);
    x.gpu->fill(u, 255.0);  // all-ones bytes for u8: the memset path
    x.gpu->copy(u, t);
    bt::report("copy", dt, bt::rel_err(bt::download(*x.gpu, u), v), 0);
    for (double value : {0.0, 3.0, -1.5, 0.1, 255.0}) {
      const bool is_int = dt == DType::i32 || dt == DType::i64 || dt == DType::u8;
      if (is_int && (value < 0 || value != std::floor(value))) continue;
      x.gpu->fill(u, value);
      const std::vector<double> want(101, bt::decode(dt, bt::encode(dt, {value}))[0]);
      bt::report(fmt::format("fill {}", value), dt, bt::rel_err(bt::download(*x.gpu, u), want), 0);
    }
  }
  // copy_from_host of part of a buffer; copy_to_host of part.
  Tensor t = x.gpu->zeros(Shape{10}, DType::f32);
  const float three[3] = {1, 2, 3};
  x.gpu->copy_from_host(t, three, sizeof three);
  float back[4];
  x.gpu->copy_to_host(back, t, sizeof back);
  CHECK((back[0] == 1 && back[1] == 2 && back[2] == 3 && back[3] == 0));
}

TEST_CASE("cuda backend: element-wise ops, biases and periodic rows match the cpu backend", "[cuda][backend]") {
  for (DType dt : bt::kComputeTypes) {
    Ctx x{dt};
    const size_t n = size_t{N} * C;
    auto y = bt::rand_pair(x, dt, n), a = bt::rand_pair(x, dt, n), b = bt::rand_pair(x, dt, n);
    x.gpu->scale(y.g, -0.37), x.cpu->scale(y.c, bt::round_to(DType::f32, -0.37));
    bt::check(x, "scale", y);
    x.gpu->axpy(y.g, 1.0, a.g), x.cpu->axpy(y.c, 1.0, a.c);
    bt::check(x, "axpy a=1", y);
    x.gpu->axpy(y.g, 0.625, b.g), x.cpu->axpy(y.c, 0.625, b.c);
    bt::check(x, "axpy a=0.625", y);
    // Views one element in: not 16-byte aligned, so the element-by-element path.
    x.gpu->scale(y.g.slice(1, n), 1.5), x.cpu->scale(y.c.slice(1, n), 1.5);
    bt::check(x, "scale unaligned view", y);
    x.gpu->axpy(y.g.slice(1, n), -2.0, a.g.slice(0, n - 1)), x.cpu->axpy(y.c.slice(1, n), -2.0, a.c.slice(0, n - 1));
    bt::check(x, "axpy unaligned view", y);
    x.gpu->copy(y.g.slice(0, n - 3), y.g.slice(3, n)), x.cpu->copy(y.c.slice(0, n - 3), y.c.slice(3, n));
    bt::check(x, "copy overlapping views", y);
    auto out = bt::out_pair(x, dt, n);
    x.gpu->residual(out.g, a.g, b.g), x.cpu->residual(out.c, a.c, b.c);
    bt::check(x, "residual", out);
    x.gpu->residual(a.g, a.g, b.g), x.cpu->residual(a.c, a.c, b.c);
    bt::check(x, "residual in place", a);
    auto bias = bt::rand_pair(x, dt, C);
    x.gpu->add_bias(y.g, bias.g, N, C), x.cpu->add_bias(y.c, bias.c, N, C);
    bt::check(x, "add_bias", y);
    auto db = bt::rand_pair(x, DType::f32, C);  // a parameter gradient: float32, accumulated
    x.gpu->bias_grad(db.g, b.g, N, C), x.cpu->bias_grad(db.c, b.c, N, C);
    bt::check(x, "bias_grad", db);
    const int period = 16, row0 = 5;
    auto src = bt::rand_pair(x, dt, size_t{period} * C);
    x.gpu->add_rows_periodic(y.g, src.g, N, C, row0, period), x.cpu->add_rows_periodic(y.c, src.c, N, C, row0, period);
    bt::check(x, "add_rows_periodic", y);
    auto dsrc = bt::rand_pair(x, DType::f32, size_t{period} * C);
    x.gpu->sum_rows_periodic(dsrc.g, b.g, N, C, row0, period);
    x.cpu->sum_rows_periodic(dsrc.c, b.c, N, C, row0, period);
    bt::check(x, "sum_rows_periodic", dsrc);
    auto big = bt::rand_pair(x, DType::f32, size_t{3} * C);  // period larger than rows: some rows untouched
    x.gpu->sum_rows_periodic(big.g, b.g, 2, C, 1, 3), x.cpu->sum_rows_periodic(big.c, b.c, 2, C, 1, 3);
    bt::check(x, "sum_rows_periodic period>rows", big);
    // cast to and from float32.
    if (dt != DType::f32) {
      auto f = bt::rand_pair(x, DType::f32, n);
      Tensor h = x.gpu->empty(Shape{static_cast<int64_t>(n)}, dt), back = x.gpu->empty(Shape{static_cast<int64_t>(n)}, DType::f32);
      x.gpu->cast(h, f.g);
      x.gpu->cast(back, h);
      std::vector<double> want = bt::download(*x.cpu, f.c);
      for (auto& w : want) w = bt::round_to(dt, w);
      bt::report("cast f32->" + std::string(dtype_name(dt)) + "->f32", DType::f32,
                 bt::rel_err(bt::download(*x.gpu, back), want), 0);
    }
  }
}

TEST_CASE("cuda backend: linear, layernorm and gelu match the cpu backend", "[cuda][backend]") {
  for (DType dt : bt::kComputeTypes) {
    Ctx x{dt};
    auto inp = bt::rand_pair(x, dt, size_t{N} * C), w = bt::rand_pair(x, dt, size_t{OC} * C);
    auto bias = bt::rand_pair(x, dt, OC), dout = bt::rand_pair(x, dt, size_t{N} * OC);
    for (bool with_bias : {true, false}) {
      auto out = bt::out_pair(x, dt, size_t{N} * OC);
      x.gpu->linear_forward(out.g, inp.g, w.g, with_bias ? bias.g : Tensor(), N, C, OC);
      x.cpu->linear_forward(out.c, inp.c, w.c, with_bias ? bias.c : Tensor(), N, C, OC);
      bt::check(x, with_bias ? "linear_forward bias" : "linear_forward", out);
    }
    auto dinp = bt::out_pair(x, dt, size_t{N} * C);
    auto dw = bt::rand_pair(x, DType::f32, size_t{OC} * C), db = bt::rand_pair(x, DType::f32, OC);
    x.gpu->linear_backward(dinp.g, dw.g, db.g, dout.g, inp.g, w.g, N, C, OC, ops::GradMode::overwrite);
    x.cpu->linear_backward(dinp.c, dw.c, db.c, dout.c, inp.c, w.c, N, C, OC, ops::GradMode::overwrite);
    bt::check(x, "linear_backward dinp", dinp);
    bt::check(x, "linear_backward dweight", dw);
    bt::check(x, "linear_backward dbias", db);
    x.gpu->linear_backward(dinp.g, Tensor(), Tensor(), dout.g, inp.g, w.g, N, C, OC, ops::GradMode::accumulate);
    x.cpu->linear_backward(dinp.c, Tensor(), Tensor(), dout.c, inp.c, w.c, N, C, OC, ops::GradMode::accumulate);
    bt::check(x, "linear_backward dinp accumulate", dinp);

    auto lw = bt::rand_pair(x, dt, C), lb = bt::rand_pair(x, dt, C), g = bt::rand_pair(x, dt, size_t{N} * C);
    auto ln = bt::out_pair(x, dt, size_t{N} * C), mean = bt::out_pair(x, DType::f32, N), rstd = bt::out_pair(x, DType::f32, N);
    x.gpu->layernorm_forward(ln.g, mean.g, rstd.g, inp.g, lw.g, lb.g, N, C);
    x.cpu->layernorm_forward(ln.c, mean.c, rstd.c, inp.c, lw.c, lb.c, N, C);
    bt::check(x, "layernorm_forward out", ln);
    bt::check(x, "layernorm_forward mean", mean);
    bt::check(x, "layernorm_forward rstd", rstd);
    auto ldinp = bt::out_pair(x, dt, size_t{N} * C);
    auto ldw = bt::rand_pair(x, DType::f32, C), ldb = bt::rand_pair(x, DType::f32, C);
    x.gpu->layernorm_backward(ldinp.g, ldw.g, ldb.g, g.g, inp.g, lw.g, mean.g, rstd.g, N, C, ops::GradMode::overwrite);
    x.cpu->layernorm_backward(ldinp.c, ldw.c, ldb.c, g.c, inp.c, lw.c, mean.c, rstd.c, N, C, ops::GradMode::overwrite);
    bt::check(x, "layernorm_backward dinp", ldinp);
    bt::check(x, "layernorm_backward dweight", ldw);
    bt::check(x, "layernorm_backward dbias", ldb);
    x.gpu->layernorm_backward(ldinp.g, Tensor(), Tensor(), g.g, inp.g, lw.g, mean.g, rstd.g, N, C, ops::GradMode::accumulate);
    x.cpu->layernorm_backward(ldinp.c, Tensor(), Tensor(), g.c, inp.c, lw.c, mean.c, rstd.c, N, C, ops::GradMode::accumulate);
    bt::check(x, "layernorm_backward dinp accumulate", ldinp);

    auto gx = bt::rand_pair(x, dt, size_t{N} * C, -4, 4), gy = bt::out_pair(x, dt, size_t{N} * C);
    x.gpu->gelu_forward(gy.g, gx.g), x.cpu->gelu_forward(gy.c, gx.c);
    bt::check(x, "gelu_forward", gy);
    auto gd = bt::out_pair(x, dt, size_t{N} * C);
    x.gpu->gelu_backward(gd.g, gx.g, g.g), x.cpu->gelu_backward(gd.c, gx.c, g.c);
    bt::check(x, "gelu_backward", gd);
  }
}

TEST_CASE("cuda backend: attention and embedding match the cpu backend", "[cuda][backend]") {
  for (DType dt : bt::kComputeTypes) {
    Ctx x{dt};
    const int B = 2, T = 37, AC = 96, NH = 3;  // head size 32; T not a multiple of the tile
    auto qkv = bt::rand_pair(x, dt, size_t{B} * T * 3 * AC), dout = bt::rand_pair(x, dt, size_t{B} * T * AC);
    auto out = bt::out_pair(x, dt, size_t{B} * T * AC), lse = bt::out_pair(x, DType::f32, size_t{B} * NH * T);
    x.gpu->attention_forward(out.g, lse.g, qkv.g, B, T, AC, NH);
    x.cpu->attention_forward(out.c, lse.c, qkv.c, B, T, AC, NH);
    bt::check(x, "attention_forward out", out);
    bt::check(x, "attention_forward lse", lse);
    // Backward from the GPU's own forward output on both sides (the CPU recomputes it).
    auto dqkv = bt::out_pair(x, dt, size_t{B} * T * 3 * AC);
    x.gpu->attention_backward(dqkv.g, dout.g, qkv.g, out.g, lse.g, B, T, AC, NH);
    x.cpu->attention_backward(dqkv.c, dout.c, qkv.c, out.c, lse.c, B, T, AC, NH);
    bt::check(x, "attention_backward dqkv", dqkv);

    const int v0 = 30, v1 = 71;  // a vocab shard; tokens outside it give zero rows
    auto tokens = bt::pair(x, DType::i32, bt::ints(N, 0, V));
    auto wte = bt::rand_pair(x, dt, size_t{v1 - v0} * C), emb = bt::out_pair(x, dt, size_t{N} * C);
    x.gpu->embedding_forward(emb.g, tokens.g, wte.g, N, C, v0, v1);
    x.cpu->embedding_forward(emb.c, tokens.c, wte.c, N, C, v0, v1);
    bt::check(x, "embedding_forward", emb);
    auto g = bt::rand_pair(x, dt, size_t{N} * C), dwte = bt::rand_pair(x, DType::f32, size_t{v1 - v0} * C);
    x.gpu->embedding_backward(dwte.g, g.g, tokens.g, N, C, v0, v1);
    x.cpu->embedding_backward(dwte.c, g.c, tokens.c, N, C, v0, v1);
    bt::check(x, "embedding_backward dwte", dwte);
  }
}

// The Llama block's ops (RMSNorm, SwiGLU, RoPE, grouped-query attention) against the CPU
// backend's, for every compute type (tests/cuda/test_llama_kernels.cpp checks the launchers
// against double references of their own).
TEST_CASE("cuda backend: rmsnorm, swiglu, rope and grouped-query attention match the cpu backend", "[cuda][backend]") {
  for (DType dt : bt::kComputeTypes) {
    Ctx x{dt};
    auto inp = bt::rand_pair(x, dt, size_t{N} * C, -2, 2), w = bt::rand_pair(x, dt, C, 0.5, 1.5);
    auto g = bt::rand_pair(x, dt, size_t{N} * C);
    auto rn = bt::out_pair(x, dt, size_t{N} * C), rstd = bt::out_pair(x, DType::f32, N);
    x.gpu->rmsnorm_forward(rn.g, rstd.g, inp.g, w.g, N, C, 1e-5);
    x.cpu->rmsnorm_forward(rn.c, rstd.c, inp.c, w.c, N, C, 1e-5);
    bt::check(x, "rmsnorm_forward out", rn);
    bt::check(x, "rmsnorm_forward rstd", rstd, 1e-5);
    auto rdinp = bt::out_pair(x, dt, size_t{N} * C), rdw = bt::rand_pair(x, DType::f32, C);
    x.gpu->rmsnorm_backward(rdinp.g, rdw.g, g.g, inp.g, w.g, rstd.g, N, C, ops::GradMode::overwrite);
    x.cpu->rmsnorm_backward(rdinp.c, rdw.c, g.c, inp.c, w.c, rstd.c, N, C, ops::GradMode::overwrite);
    bt::check(x, "rmsnorm_backward dinp", rdinp);
    bt::check(x, "rmsnorm_backward dweight", rdw, 1e-5);
    x.gpu->rmsnorm_backward(rdinp.g, Tensor(), g.g, inp.g, w.g, rstd.g, N, C, ops::GradMode::accumulate);
    x.cpu->rmsnorm_backward(rdinp.c, Tensor(), g.c, inp.c, w.c, rstd.c, N, C, ops::GradMode::accumulate);
    bt::check(x, "rmsnorm_backward dinp accumulate", rdinp);

    const int F = 45;  // odd: the scalar path
    auto h = bt::rand_pair(x, dt, size_t{N} * 2 * F, -4, 4), sd = bt::rand_pair(x, dt, size_t{N} * F);
    auto sy = bt::out_pair(x, dt, size_t{N} * F), sdh = bt::out_pair(x, dt, size_t{N} * 2 * F);
    x.gpu->swiglu_forward(sy.g, h.g, N, F), x.cpu->swiglu_forward(sy.c, h.c, N, F);
    bt::check(x, "swiglu_forward", sy);
    x.gpu->swiglu_backward(sdh.g, sd.g, h.g, N, F), x.cpu->swiglu_backward(sdh.c, sd.c, h.c, N, F);
    bt::check(x, "swiglu_backward", sdh);

    const int B = 2, T = 37, NH = 4, NKV = 2, HD = 32, AC = NH * HD;  // groups of 2; T not a tile multiple
    const size_t W = size_t(NH + 2 * NKV) * HD;
    std::vector<double> cs, sn;
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < HD / 2; ++i) {
        const double a = t * std::pow(10000.0, -2.0 * i / HD);
        cs.push_back(std::cos(a)), sn.push_back(std::sin(a));
      }
    auto cosp = bt::pair(x, DType::f32, cs), sinp = bt::pair(x, DType::f32, sn);
    auto qkv = bt::rand_pair(x, dt, size_t{B} * T * W, -2, 2);
    x.gpu->rope_forward(qkv.g, cosp.g, sinp.g, B, T, NH, NKV, HD);
    x.cpu->rope_forward(qkv.c, cosp.c, sinp.c, B, T, NH, NKV, HD);
    bt::check(x, "rope_forward qkv", qkv);
    auto dout = bt::rand_pair(x, dt, size_t{B} * T * AC);
    auto out = bt::out_pair(x, dt, size_t{B} * T * AC), lse = bt::out_pair(x, DType::f32, size_t{B} * NH * T);
    x.gpu->attention_forward(out.g, lse.g, qkv.g, B, T, AC, NH, NKV);
    x.cpu->attention_forward(out.c, lse.c, qkv.c, B, T, AC, NH, NKV);
    bt::check(x, "attention_forward gqa out", out);
    bt::check(x, "attention_forward gqa lse", lse, 1e-5);
    auto dqkv = bt::out_pair(x, dt, size_t{B} * T * W);
    x.gpu->attention_backward(dqkv.g, dout.g, qkv.g, out.g, lse.g, B, T, AC, NH, NKV);
    x.cpu->attention_backward(dqkv.c, dout.c, qkv.c, out.c, lse.c, B, T, AC, NH, NKV);
    bt::check(x, "attention_backward gqa dqkv", dqkv);
    x.gpu->rope_backward(dqkv.g, cosp.g, sinp.g, B, T, NH, NKV, HD);
    x.cpu->rope_backward(dqkv.c, cosp.c, sinp.c, B, T, NH, NKV, HD);
    bt::check(x, "rope_backward dqkv", dqkv);
  }
}

TEST_CASE("cuda backend: the vocab-parallel cross-entropy pieces match the cpu backend", "[cuda][backend]") {
  for (DType dt : bt::kComputeTypes) {
    Ctx x{dt};
    const int Vs = 53, v0 = 48, valid = 97;  // the shard [48, 101) with 4 padding columns
    auto logits = bt::rand_pair(x, dt, size_t{N} * Vs, -4, 4);
    auto targets = bt::pair(x, DType::i32, bt::ints(N, 0, valid));
    auto mx = bt::out_pair(x, DType::f32, N), se = bt::out_pair(x, DType::f32, N), tl = bt::out_pair(x, DType::f32, N);
    x.gpu->xent_shard_max(mx.g, logits.g, N, Vs, v0, valid), x.cpu->xent_shard_max(mx.c, logits.c, N, Vs, v0, valid);
    bt::check(x, "xent_shard_max", mx);
    x.gpu->xent_shard_sumexp(se.g, logits.g, mx.g, N, Vs, v0, valid);
    x.cpu->xent_shard_sumexp(se.c, logits.c, mx.c, N, Vs, v0, valid);
    bt::check(x, "xent_shard_sumexp", se);
    x.gpu->xent_shard_target_logit(tl.g, logits.g, targets.g, N, Vs, v0, valid);
    x.cpu->xent_shard_target_logit(tl.c, logits.c, targets.c, N, Vs, v0, valid);
    bt::check(x, "xent_shard_target_logit", tl);
    auto losses = bt::out_pair(x, DType::f32, N), lse = bt::out_pair(x, DType::f32, N);
    x.gpu->xent_loss_from_stats(losses.g, lse.g, mx.g, se.g, tl.g, N);
    x.cpu->xent_loss_from_stats(losses.c, lse.c, mx.c, se.c, tl.c, N);
    bt::check(x, "xent_loss_from_stats losses", losses);
    bt::check(x, "xent_loss_from_stats lse", lse);
    auto dl = bt::out_pair(x, dt, size_t{N} * Vs);
    x.gpu->xent_shard_backward(dl.g, logits.g, lse.g, targets.g, 1.0 / N, N, Vs, v0, valid);
    x.cpu->xent_shard_backward(dl.c, logits.c, lse.c, targets.c, 1.0 / N, N, Vs, v0, valid);
    bt::check(x, "xent_shard_backward", dl);
  }
}

TEST_CASE("cuda backend: reductions in double and non-finite counts", "[cuda][backend]") {
  Ctx x{DType::f32};
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    const size_t n = 100003;
    auto v = bt::rand_pair(x, dt, n);
    const double s = x.gpu->sum(v.g), sc = x.cpu->sum(v.c);
    bt::report("sum", dt, std::abs(s - sc) / std::max(1.0, std::abs(sc)), 1e-12);
    CHECK(x.gpu->sum(v.g) == s);  // the same bits again
    auto acc = bt::rand_pair(x, DType::f64, 3);
    x.gpu->sum_squares_into(acc.g, 1, v.g), x.cpu->sum_squares_into(acc.c, 1, v.c);
    bt::check(x, "sum_squares_into", acc, 1e-12);
    // Non-finite: NaN, +inf and -inf at known places.
    std::vector<double> w = test::random_vec(n);
    const size_t bad[] = {0, 17, 4096, n - 1};
    w[bad[0]] = std::nan(""), w[bad[1]] = HUGE_VAL, w[bad[2]] = -HUGE_VAL, w[bad[3]] = std::nan("");
    Tensor t = bt::upload(*x.gpu, dt, w), cnt = bt::upload(*x.gpu, DType::f64, {5.0, 0.0});
    x.gpu->count_nonfinite_into(cnt, 1, t);
    x.gpu->count_nonfinite_into(cnt, 0, t);
    const auto got = bt::download(*x.gpu, cnt);
    bt::report("count_nonfinite_into", dt, std::abs(got[0] - 9.0) + std::abs(got[1] - 4.0), 0);
  }
}

TEST_CASE("cuda backend: adamw with float32, bfloat16 and float16 compute copies", "[cuda][backend]") {
  Ctx x{DType::f32};
  const size_t n = 10007;
  const AdamWConfig cfg;
  AdamWStep step;
  step.lr = 0.1f, step.t = 3, step.grad_scale = 0.8f;  // a large step: the change is checked, not just the weights
  for (DType copy_dt : {DType::f32, DType::bf16, DType::f16}) {
    std::vector<double> p0 = test::random_vec(n);
    for (auto& e : p0) e = bt::round_to(DType::f32, e);
    auto p = bt::pair(x, DType::f32, p0), g = bt::rand_pair(x, DType::f32, n);
    auto m = bt::rand_pair(x, DType::f32, n, -0.1, 0.1), v = bt::rand_pair(x, DType::f32, n, 0.0, 0.01);
    Tensor copy = x.gpu->empty(Shape{static_cast<int64_t>(n)}, copy_dt);
    const std::vector<unsigned char> ones(copy.nbytes(), 0xff);
    x.gpu->copy_from_host(copy, ones.data(), ones.size());
    x.gpu->adamw(p.g, g.g, m.g, v.g, cfg, 0.1f, step, copy);
    x.cpu->adamw(p.c, g.c, m.c, v.c, cfg, 0.1f, step, Tensor());
    const std::string tag = fmt::format("adamw (copy {})", dtype_name(copy_dt));
    std::vector<double> dg = bt::download(*x.gpu, p.g), dc = bt::download(*x.cpu, p.c);
    for (size_t i = 0; i < n; ++i) dg[i] -= p0[i], dc[i] -= p0[i];
    bt::report(tag + " param change", DType::f32, bt::rel_err(dg, dc), 1e-5);
    bt::check(x, tag + " param", p);
    bt::check(x, tag + " m", m);
    bt::check(x, tag + " v", v);
    std::vector<double> want = bt::download(*x.gpu, p.g);
    for (auto& w : want) w = bt::round_to(copy_dt, w);
    bt::report(tag + " compute copy", copy_dt, bt::rel_err(bt::download(*x.gpu, copy), want), 0);
  }
}

TEST_CASE("cuda backend: MoE row moves match the cpu backend; scatter_add_rows is bit-reproducible",
          "[cuda][backend]") {
  for (DType dt : bt::kComputeTypes) {
    Ctx x{dt};
    const int in_rows = 41, rows = 37;
    auto in = bt::rand_pair(x, dt, size_t{in_rows} * C), idx = bt::pair(x, DType::i32, bt::ints(rows, 0, in_rows));
    auto out = bt::out_pair(x, dt, size_t{rows} * C);
    x.gpu->gather_rows(out.g, in.g, idx.g, rows, C), x.cpu->gather_rows(out.c, in.c, idx.c, rows, C);
    bt::check(x, "gather_rows", out, 0);
    // Many duplicates: 37 rows into 5.
    auto dst = bt::pair(x, DType::i32, bt::ints(rows, 0, 5)), scale = bt::rand_pair(x, dt, rows);
    auto acc0 = test::random_vec(size_t{5} * C);
    for (bool scaled : {true, false}) {
      auto acc = bt::pair(x, dt, acc0);
      const Tensor sg = scaled ? scale.g : Tensor(), sc = scaled ? scale.c : Tensor();
      x.gpu->scatter_add_rows(acc.g, out.g, dst.g, sg, rows, C), x.cpu->scatter_add_rows(acc.c, out.c, dst.c, sc, rows, C);
      bt::check(x, scaled ? "scatter_add_rows scaled" : "scatter_add_rows", acc);
      // Twice more from the same start: identical bits.
      auto again = bt::pair(x, dt, acc0), third = bt::pair(x, dt, acc0);
      x.gpu->scatter_add_rows(again.g, out.g, dst.g, sg, rows, C);
      x.gpu->scatter_add_rows(third.g, out.g, dst.g, sg, rows, C);
      std::vector<unsigned char> b1(acc.g.nbytes()), b2(b1.size()), b3(b1.size());
      x.gpu->copy_to_host(b1.data(), acc.g, b1.size());
      x.gpu->copy_to_host(b2.data(), again.g, b2.size());
      x.gpu->copy_to_host(b3.data(), third.g, b3.size());
      bt::report("scatter_add_rows identical bits x3", dt, (b1 == b2 && b2 == b3) ? 0.0 : 1.0, 0);
    }
    auto a = bt::rand_pair(x, dt, size_t{rows} * C), b = bt::rand_pair(x, dt, size_t{rows} * C);
    auto dots = bt::out_pair(x, DType::f64, rows);
    x.gpu->row_dots(dots.g, a.g, b.g, rows, C), x.cpu->row_dots(dots.c, a.c, b.c, rows, C);
    bt::check(x, "row_dots", dots, 1e-12);
    auto so = bt::out_pair(x, dt, size_t{rows} * C);
    x.gpu->scale_rows(so.g, a.g, scale.g, rows, C), x.cpu->scale_rows(so.c, a.c, scale.c, rows, C);
    bt::check(x, "scale_rows", so);
    // A bad index is found on the device and reported at the next synchronisation.
    auto badidx = bt::pair(x, DType::i32, {0.0, 1.0, 99.0});
    x.gpu->gather_rows(out.g, in.g, badidx.g, 3, C);
    CHECK_THROWS_WITH(x.gpu->synchronize(), Contains("row index 99 at 2 outside [0, 41)"));
    x.gpu->synchronize();  // reported once
  }
}

TEST_CASE("cuda backend: events, synchronize, memory accounting, scratch reuse", "[cuda][backend]") {
  Ctx x{DType::f32};
  Backend& be = *x.gpu;
  CHECK(be.name() == "cuda");
  CHECK(!be.host_accessible());
  CHECK(cuda::compute_stream(be) != nullptr);
  const size_t base = be.bytes_in_use();
  be.reset_peak();
  {
    Tensor big = be.empty(Shape{1 << 20}, DType::f32);
    CHECK(be.bytes_in_use() == base + (size_t{4} << 20));
    Tensor big2 = be.zeros(Shape{1 << 20}, DType::bf16);
    CHECK(be.peak_bytes() == base + (size_t{6} << 20));
    CHECK(cuda::pool_used_high(be) >= (size_t{6} << 20));
    auto e = be.record();
    be.scale(big2, 2.0);
    auto e2 = be.record();
    e2->synchronize();
    CHECK(e->ready());
    CHECK(e2->ready());
    // A second backend on the same device orders after the first one's event.
    auto other = cuda::make_cuda_backend({.device = 0, .compute = DType::f32});
    Tensor t = other->empty(Shape{4}, DType::f32);
    be.fill(big, 7.0);
    auto done = be.record();
    other->wait(*done);
    other->fill(t, 1.0);
    other->synchronize();
    CHECK(bt::download(*other, t) == std::vector<double>(4, 1.0));
    // A CPU event is complete: waiting on it is a no-op.
    auto cpu_event = x.cpu->record();
    be.wait(*cpu_event);
    be.synchronize();
  }
  CHECK(be.bytes_in_use() == base);
  CHECK(be.peak_bytes() == base + (size_t{6} << 20));
  // Launcher scratch comes from the backend's arena: after a warm-up call the same op allocates nothing.
  auto g = bt::rand_pair(x, DType::f32, size_t{N} * C), inp = bt::rand_pair(x, DType::f32, size_t{N} * C);
  auto w = bt::rand_pair(x, DType::f32, C), mean = bt::rand_pair(x, DType::f32, N), rstd = bt::rand_pair(x, DType::f32, N);
  auto dinp = bt::out_pair(x, DType::f32, size_t{N} * C), dw = bt::rand_pair(x, DType::f32, C);
  const size_t cold = be.bytes_in_use();
  be.layernorm_backward(dinp.g, dw.g, dw.g, g.g, inp.g, w.g, mean.g, rstd.g, N, C, ops::GradMode::overwrite);
  be.synchronize();
  const size_t warm = be.bytes_in_use();
  CHECK(warm > cold);  // the arena took its buffer from the backend
  for (int i = 0; i < 3; ++i)
    be.layernorm_backward(dinp.g, dw.g, dw.g, g.g, inp.g, w.g, mean.g, rstd.g, N, C, ops::GradMode::overwrite);
  be.synchronize();
  CHECK(be.bytes_in_use() == warm);
}

TEST_CASE("cuda backend: argument errors name the op and the buffer", "[cuda][backend]") {
  Ctx x{DType::bf16};
  Backend& be = *x.gpu;
  Tensor a = be.empty(Shape{10}, DType::bf16), f = be.empty(Shape{10}, DType::f32);
  Tensor host = x.cpu->empty(Shape{10}, DType::f32);
  CHECK_THROWS_WITH(be.scale(Tensor(), 2.0), Contains("backend scale: x is undefined"));
  CHECK_THROWS_WITH(be.axpy(f, 1.0, host), Contains("backend axpy: x is on cpu, not cuda:0"));
  CHECK_THROWS_WITH(be.residual(a, a, be.empty(Shape{3}, DType::bf16)), Contains("b holds 3 elements, 10 needed"));
  CHECK_THROWS_WITH(be.residual(a, a, f), Contains("backend residual: b is float32, the op computes in bfloat16"));
  CHECK_THROWS_WITH(be.bias_grad(be.empty(Shape{5}, DType::bf16), a, 2, 5),
                    Contains("parameter gradients are float32 on the cuda backend"));
  CHECK_THROWS_WITH(be.gelu_forward(be.empty(Shape{10}, DType::i32), be.empty(Shape{10}, DType::i32)),
                    Contains("the cuda backend computes in float32, bfloat16 or float16, not int32"));
  CHECK_THROWS_WITH(be.embedding_forward(a, f, a, 2, 5, 0, 2), Contains("tokens must be int32"));
  CHECK_THROWS_WITH(be.copy(a, f), Contains("backend copy"));
  CHECK_THROWS_WITH(be.copy_from_host(a, nullptr, 100), Contains("100 bytes into a 20-byte buffer"));
  CHECK_THROWS_AS(be.attention_forward(be.empty(Shape{3 * 10 * 30}, DType::bf16), f, a, 1, 1, 30, 1), ConfigError);
  // The Llama ops: sizes from the head counts (qkv width C + 2 NKV C/NH), statistics float32.
  Tensor q = be.empty(Shape{1 * 4 * (64 + 2 * 16)}, DType::bf16), o = be.empty(Shape{4 * 64}, DType::bf16);
  Tensor l = be.empty(Shape{4 * 4}, DType::f32);
  CHECK_THROWS_WITH(be.attention_forward(o, l, q, 1, 4, 64, 4, 3), Contains("NKV=3") && Contains("NH=4"));
  CHECK_THROWS_WITH(be.attention_forward(o, l, be.empty(Shape{4 * 64 * 2}, DType::bf16), 1, 4, 64, 4, 4),
                    Contains("qkv holds 512 elements, 768 needed"));
  CHECK_THROWS_WITH(be.rmsnorm_forward(a, a, a, a, 2, 5, 1e-5), Contains("backend rmsnorm_forward: rstd is bfloat16"));
  CHECK_THROWS_WITH(be.swiglu_forward(a, a, 2, 5), Contains("h holds 10 elements, 20 needed"));
  Tensor h20 = be.empty(Shape{20}, DType::bf16);
  CHECK_THROWS_WITH(be.swiglu_backward(h20, a, h20, 2, 5), Contains("backend swiglu_backward: dh may not alias h"));
  CHECK_THROWS_WITH(be.rope_forward(q, a, a, 1, 4, 4, 1, 16), Contains("backend rope_forward: cos holds 10 elements, 32 needed"));
  CHECK_THROWS_WITH(be.rope_backward(q, f, f, 1, 4, 4, 1, 15), Contains("HD=15"));
}

TEST_CASE("cuda backend: make_cuda_backend refuses a missing device and a compute type without kernels",
          "[cuda][nogpu]") {
  cuda::CudaBackendOptions o;
  o.device = 1000;
  CHECK_THROWS_AS(cuda::make_cuda_backend(o), DeviceError);
  o.compute = DType::f16;  // float16 is accepted: only the device is missing
  CHECK_THROWS_AS(cuda::make_cuda_backend(o), DeviceError);
  o.device = 0;
  o.compute = DType::i64;
  CHECK_THROWS_WITH(cuda::make_cuda_backend(o), Contains("float16") && Contains("int64"));
}
