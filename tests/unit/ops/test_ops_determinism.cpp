// Same inputs, same bits: every CPU op run twice (outputs pre-filled with different garbage) gives
// bit-identical results, and the ops triax computes itself give the same bits with 1, 2 or 3
// OpenMP threads. The GEMM-based ones (linear, attention) are excluded from the thread-count
// comparison: OpenBLAS (OpenMP build) partitions differently, and rounds differently, by thread
// count. Sizes are above the parallel thresholds so the threaded paths run.
#include <catch2/catch.hpp>
#include <omp.h>

#include <cstring>
#include <map>
#include <string>

#include "triax/ops/attention.h"
#include "triax/ops/embedding.h"
#include "triax/ops/gelu.h"
#include "triax/ops/layernorm.h"
#include "triax/ops/linear.h"
#include "triax/ops/residual.h"
#include "triax/ops/softmax_xent.h"
#include "triax/ops/adamw.h"
#include "unit/ops_testing.h"

using namespace triax::ops;
using namespace triax::test;

namespace {

constexpr int B = 2, T = 96, C = 128, NH = 4, V = 300, Vvalid = 290, N = B * T;

struct Inputs {
  std::vector<int32_t> tokens = random_ints(N, 0, Vvalid), targets = random_ints(N, 0, Vvalid);
  std::vector<float> wte = cast<float>(random_vec(V * C)), wpe = cast<float>(random_vec(T * C));
  std::vector<float> x = cast<float>(random_vec(N * C)), w = cast<float>(random_vec(C, 0.5, 1.5)),
                     b = cast<float>(random_vec(C));
  std::vector<float> W = cast<float>(random_vec(3 * C * C)), bias = cast<float>(random_vec(3 * C));
  std::vector<float> qkv = cast<float>(random_vec(N * 3 * C)), dout = cast<float>(random_vec(N * 3 * C));
  std::vector<float> logits = cast<float>(random_vec(N * V, -5, 5));
};

using Outputs = std::map<std::string, std::vector<float>>;

// Every op forward and backward; written outputs start as `fill` so stale values would show.
Outputs run_all(const Inputs& in, float fill) {
  Outputs o;
  auto buf = [&](const std::string& name, size_t n) -> float* { return (o[name] = std::vector<float>(n, fill)).data(); };
  // Accumulated (parameter) gradients start from the same values every run.
  auto acc = [&](const std::string& name, size_t n) -> float* { return (o[name] = std::vector<float>(n, 0.25f)).data(); };
  float* emb = buf("embedding", N * C);
  embedding_forward<float>(emb, in.tokens.data(), in.wte.data(), in.wpe.data(), B, T, C, V);
  float* dwte = acc("dwte", V * C);
  float* dwpe = acc("dwpe", T * C);
  embedding_backward<float>(dwte, dwpe, in.x.data(), in.tokens.data(), B, T, C, V);

  float* ln = buf("ln", N * C);
  float* mean = buf("mean", N);
  float* rstd = buf("rstd", N);
  layernorm_forward<float>(ln, mean, rstd, in.x.data(), in.w.data(), in.b.data(), N, C);
  float* dln = buf("dln", N * C);
  float* dw = acc("dlnw", C);
  float* db = acc("dlnb", C);
  layernorm_backward<float>(dln, dw, db, in.dout.data(), in.x.data(), in.w.data(), mean, rstd, N, C);

  float* lin = buf("linear", N * 3 * C);
  linear_forward<float>(lin, in.x.data(), in.W.data(), in.bias.data(), N, C, 3 * C);
  float* dlin = buf("dlinear_inp", N * C);
  float* dW = acc("dlinear_w", 3 * C * C);
  float* dbias = acc("dlinear_b", 3 * C);
  linear_backward<float>(dlin, dW, dbias, in.dout.data(), in.x.data(), in.W.data(), N, C, 3 * C);

  float* att = buf("attention", N * C);
  float* lse = buf("attention_lse", B * NH * T);
  attention_forward<float>(att, lse, in.qkv.data(), B, T, C, NH);
  float* dqkv = buf("dqkv", N * 3 * C);
  attention_backward<float>(dqkv, in.dout.data(), in.qkv.data(), lse, B, T, C, NH);

  float* g = buf("gelu", N * C);
  gelu_forward<float>(g, in.x.data(), N * C);
  float* dg = buf("dgelu", N * C);
  gelu_backward<float>(dg, in.x.data(), in.dout.data(), N * C);
  float* r = buf("residual", N * C);
  residual_forward<float>(r, in.x.data(), in.dout.data(), N * C);

  float* loss = buf("loss", N);
  float* xlse = buf("xent_lse", N);
  softmax_xent_forward<float>(loss, xlse, in.logits.data(), in.targets.data(), N, V, Vvalid);
  float* dlogits = buf("dlogits", N * V);
  softmax_xent_backward<float>(dlogits, in.logits.data(), xlse, in.targets.data(), 1.0f / N, N, V, Vvalid);

  auto& p = o["adamw_params"] = in.x;
  auto& m = o["adamw_m"] = std::vector<float>(N * C, 0.0f);
  auto& v = o["adamw_v"] = std::vector<float>(N * C, 0.0f);
  for (int step = 1; step <= 2; ++step)
    triax::adamw_update(p, std::span<const float>(in.dout).first(p.size()), m, v, triax::AdamWConfig{}, 0.1f,
                        triax::AdamWStep{1e-3f, step, 1.0f});
  return o;
}

bool uses_blas(const std::string& name) {
  return name.starts_with("linear") || name.starts_with("dlinear") || name.starts_with("attention") || name == "dqkv";
}

void require_same_bits(const Outputs& a, const Outputs& b, const std::string& what, bool skip_blas = false) {
  for (const auto& [name, va] : a) {
    if (skip_blas && uses_blas(name)) continue;
    INFO(what << ": " << name);
    const auto& vb = b.at(name);
    REQUIRE(va.size() == vb.size());
    REQUIRE(std::memcmp(va.data(), vb.data(), va.size() * sizeof(float)) == 0);
  }
}

}  // namespace

TEST_CASE("every op gives the same bits twice; triax's own loops for any thread count") {
  const Inputs in;
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  const Outputs first = run_all(in, 1.5f);
  const Outputs second = run_all(in, -7.0f);
  require_same_bits(first, second, "run twice");
  for (int threads : {1, 3}) {
    omp_set_num_threads(threads);
    const Outputs other = run_all(in, 3.0f);
    require_same_bits(other, run_all(in, -3.0f), fmt::format("run twice with {} threads", threads));
    require_same_bits(first, other, fmt::format("{} threads against 2", threads), /*skip_blas=*/true);
  }
  omp_set_num_threads(saved);
}
