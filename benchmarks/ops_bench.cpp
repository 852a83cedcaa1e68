// ops_bench: time each CPU op (forward and backward) at one Transformer block's shapes, beside the
// block's own GEMMs measured in the same run, and print each op's time as a share of the GEMM time.
// The Llama block's ops (RMSNorm, SwiGLU, RoPE, grouped-query attention) follow at the same B, T, C,
// beside the Llama block's own GEMMs. Checks before timing: attention rows against a naive double
// reference. Prints wall time and
// process CPU time (best of reps): on a shared machine, run with OMP_NUM_THREADS=1
// OPENBLAS_NUM_THREADS=1 and read the CPU column, which other processes do not inflate.
//   ops_bench [--batch 4] [--seq 1024] [--channels 768] [--heads 12] [--vocab 50304] [--reps 5] [--json]
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "triax/ops/attention.h"
#include "triax/ops/embedding.h"
#include "triax/ops/gelu.h"
#include "triax/ops/gemm.h"
#include "triax/ops/layernorm.h"
#include "triax/ops/linear.h"
#include "triax/ops/residual.h"
#include "triax/ops/rmsnorm.h"
#include "triax/ops/rope.h"
#include "triax/ops/softmax_xent.h"
#include "triax/ops/swiglu.h"
#include "triax/ops/adamw.h"

using namespace triax::ops;

namespace {

std::vector<float> random_floats(size_t n, std::mt19937& g, float lo = -1, float hi = 1) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(g);
  return v;
}

double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

struct Timing {
  double wall = 1e30, cpu = 1e30;
};

// Best of reps for wall and CPU time separately (the machine is shared: the minimum is the least
// disturbed run).
Timing time_best(int reps, const std::function<void()>& f) {
  f();  // warm-up: first-touch page faults, BLAS thread start
  Timing best;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_seconds();
    f();
    best.cpu = std::min(best.cpu, cpu_seconds() - c0);
    best.wall = std::min(best.wall, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Naive double attention output for one (b, h, i).
std::vector<double> attention_row(const std::vector<float>& qkv, int b, int h, int i, int T, int C, int NH) {
  const int hs = C / NH;
  std::vector<double> s(i + 1), out(hs, 0.0);
  double mx = -INFINITY, z = 0;
  for (int j = 0; j <= i; ++j) {
    double d = 0;
    for (int c = 0; c < hs; ++c)
      d += double(qkv[(size_t(b) * T + i) * 3 * C + h * hs + c]) * qkv[(size_t(b) * T + j) * 3 * C + C + h * hs + c];
    s[j] = d / std::sqrt(double(hs));
    mx = std::max(mx, s[j]);
  }
  for (int j = 0; j <= i; ++j) z += std::exp(s[j] - mx);
  for (int j = 0; j <= i; ++j)
    for (int c = 0; c < hs; ++c)
      out[c] += std::exp(s[j] - mx) / z * qkv[(size_t(b) * T + j) * 3 * C + 2 * C + h * hs + c];
  return out;
}

struct Row {
  std::string name;
  Timing t;
  double flops, bytes;
  bool llama = false;  // shares against the Llama block's GEMMs
};
using AddRow = std::function<void(std::string, double, double, const std::function<void()>&)>;

// The Llama block at the same B, T, C: F = 8C/3 rounded up to 64 (Llama's MLP rule), NH/4 key/value
// heads (NH when 4 does not divide it). Its GEMMs first (fwd + bwd: qkv, o, gate|up, down), then
// its ops: two RMSNorms, SwiGLU, RoPE on q and k, grouped-query attention.
void add_llama_rows(const AddRow& add, int B, int T, int C, int NH, std::mt19937& g) {
  const int N = B * T, HD = C / NH, NKV = NH % 4 == 0 ? NH / 4 : NH, F = (8 * C / 3 + 63) / 64 * 64;
  const int W = C + 2 * NKV * HD;  // qkv row width
  const double nc = double(N) * C;
  const int widest = std::max({W, 2 * F, C});
  auto in = random_floats(size_t(N) * std::max(C, F), g), dout = random_floats(size_t(N) * widest, g);
  auto w = random_floats(size_t(widest) * std::max(C, F), g, -0.05f, 0.05f);
  std::vector<float> out(size_t(N) * widest), dinp(size_t(N) * std::max(C, F)), dw(w.size(), 0.0f);
  add("llama GEMMs fwd+bwd (qkv,o,gate|up,down)", 2.0 * N * C * (double(W) + C + 2 * F + F) * 3, 0, [&] {
    for (auto [ic, oc] : {std::pair{C, W}, std::pair{C, C}, std::pair{C, 2 * F}, std::pair{F, C}}) {
      linear_forward<float>(out.data(), in.data(), w.data(), nullptr, N, ic, oc);
      linear_backward<float>(dinp.data(), dw.data(), nullptr, dout.data(), in.data(), w.data(), N, ic, oc);
    }
  });
  auto x = random_floats(size_t(N) * C, g), nw = random_floats(C, g, 0.5f, 1.5f);
  std::vector<float> rstd(N), dnw(C, 0.0f);
  add("rmsnorm fwd x2", 0, 2 * 2 * nc * 4, [&] {
    for (int r = 0; r < 2; ++r) rmsnorm_forward<float>(out.data(), rstd.data(), x.data(), nw.data(), N, C, 1e-5);
  });
  add("rmsnorm bwd x2", 0, 2 * 4 * nc * 4, [&] {
    for (int r = 0; r < 2; ++r)
      rmsnorm_backward<float>(dinp.data(), dnw.data(), dout.data(), x.data(), nw.data(), rstd.data(), N, C,
                              GradMode::accumulate);
  });
  auto h = random_floats(size_t(N) * 2 * F, g, -3, 3);
  add("swiglu fwd", 0, 3.0 * N * F * 4, [&] { swiglu_forward<float>(out.data(), h.data(), N, F); });
  add("swiglu bwd", 0, 5.0 * N * F * 4, [&] { swiglu_backward<float>(out.data(), dout.data(), h.data(), N, F); });
  auto qkv = random_floats(size_t(N) * W, g), cs = random_floats(size_t(T) * HD / 2, g, 0, 6.28f), sn = cs;
  for (size_t i = 0; i < cs.size(); ++i) {  // a rotation table: repeated use keeps the norms
    sn[i] = std::sin(cs[i]);
    cs[i] = std::cos(cs[i]);
  }
  const double rope_bytes = 2.0 * N * (NH + NKV) * HD * 4;
  add("rope fwd (q, k)", 0, rope_bytes, [&] { rope_forward<float>(qkv.data(), cs.data(), sn.data(), B, T, NH, NKV, HD); });
  add("rope bwd (q, k)", 0, rope_bytes, [&] { rope_backward<float>(qkv.data(), cs.data(), sn.data(), B, T, NH, NKV, HD); });
  std::vector<float> lse(size_t(B) * NH * T), dqkv(size_t(N) * W);
  attention_forward<float>(out.data(), lse.data(), qkv.data(), B, T, C, NH, NKV);
  add(fmt::format("gqa attention fwd ({} kv heads)", NKV), 4.0 * B * NH * double(T) * T / 2 * HD, 0,
      [&] { attention_forward<float>(out.data(), lse.data(), qkv.data(), B, T, C, NH, NKV); });
  add(fmt::format("gqa attention bwd ({} kv heads)", NKV), 10.0 * B * NH * double(T) * T / 2 * HD, 0,
      [&] { attention_backward<float>(dqkv.data(), dout.data(), qkv.data(), lse.data(), B, T, C, NH, NKV); });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Time the CPU ops of one Transformer block against its GEMMs"};
  int B = 4, T = 1024, C = 768, NH = 12, V = 50304, reps = 5;
  bool json = false;
  app.add_option("--batch", B);
  app.add_option("--seq", T);
  app.add_option("--channels", C);
  app.add_option("--heads", NH);
  app.add_option("--vocab", V, "padded vocabulary for the cross-entropy (valid = 50257 or V)");
  app.add_option("--reps", reps);
  app.add_flag("--json", json);
  CLI11_PARSE(app, argc, argv);
  const int N = B * T, valid = std::min(V, 50257);
  std::mt19937 g(1234);

  auto x = random_floats(size_t(N) * C, g), dx = random_floats(size_t(N) * C, g);
  auto lnw = random_floats(C, g, 0.5f, 1.5f), lnb = random_floats(C, g);
  auto wqkv = random_floats(size_t(3) * C * C, g, -0.05f, 0.05f), bqkv = random_floats(3 * C, g);
  auto wfc = random_floats(size_t(4) * C * C, g, -0.05f, 0.05f), bfc = random_floats(4 * C, g);
  auto qkv = random_floats(size_t(N) * 3 * C, g), dqkv_in = random_floats(size_t(N) * C, g);
  auto h = random_floats(size_t(N) * 4 * C, g, -3, 3), dh = random_floats(size_t(N) * 4 * C, g);
  std::vector<float> out(size_t(N) * 4 * C), out2(size_t(N) * 4 * C), mean(N), rstd(N), lse(size_t(B) * NH * T);
  std::vector<float> dqkv(size_t(N) * 3 * C), dw(size_t(4) * C * C, 0.0f), db(4 * C, 0.0f), dlw(C, 0.0f), dlb(C, 0.0f);

  // ---- correctness beside the timing ----
  attention_forward<float>(out.data(), lse.data(), qkv.data(), B, T, C, NH);
  double worst = 0;
  for (auto [b, hh, i] : {std::tuple{0, 0, 0}, std::tuple{B - 1, NH - 1, T - 1}, std::tuple{B / 2, NH / 2, T / 2 + 3}}) {
    const auto want = attention_row(qkv, b, hh, i, T, C, NH);
    for (int c = 0; c < C / NH; ++c)
      worst = std::max(worst, std::abs(out[(size_t(b) * T + i) * C + hh * (C / NH) + c] - want[c]));
  }
  if (!(worst < 1e-4)) {
    fmt::print(stderr, "ops_bench: attention differs from the reference by {:.3g}\n", worst);
    return 1;
  }

  std::vector<Row> rows;
  auto add = [&](std::string name, double flops, double bytes, const std::function<void()>& f) {
    rows.push_back({std::move(name), time_best(reps, f), flops, bytes});
  };
  const double nc = double(N) * C;
  // The block's four linears, forward + backward (dinp and dweight), as the GEMM reference.
  const double gemm_flops = 2.0 * N * C * (3 * C + C + 4 * C + 4 * C) * 3;
  add("block GEMMs fwd+bwd (qkv, proj, fc, fc2)", gemm_flops, 0, [&] {
    for (auto [ic, oc] : {std::pair{C, 3 * C}, std::pair{C, C}, std::pair{C, 4 * C}, std::pair{4 * C, C}}) {
      linear_forward<float>(out.data(), h.data(), wfc.data(), bfc.data(), N, ic, oc);
      linear_backward<float>(out2.data(), dw.data(), nullptr, dh.data(), h.data(), wfc.data(), N, ic, oc);
    }
  });
  add("attention fwd", 4.0 * B * NH * double(T) * T / 2 * (C / NH), 0,
      [&] { attention_forward<float>(out.data(), lse.data(), qkv.data(), B, T, C, NH); });
  add("attention bwd", 10.0 * B * NH * double(T) * T / 2 * (C / NH), 0,
      [&] { attention_backward<float>(dqkv.data(), dqkv_in.data(), qkv.data(), lse.data(), B, T, C, NH); });
  add("layernorm fwd x2", 0, 2 * 2 * nc * 4, [&] {
    for (int r = 0; r < 2; ++r) layernorm_forward<float>(out.data(), mean.data(), rstd.data(), x.data(), lnw.data(), lnb.data(), N, C);
  });
  add("layernorm bwd x2", 0, 2 * 5 * nc * 4, [&] {
    for (int r = 0; r < 2; ++r)
      layernorm_backward<float>(out2.data(), dlw.data(), dlb.data(), dx.data(), x.data(), lnw.data(), mean.data(),
                                rstd.data(), N, C, GradMode::accumulate);
  });
  add("gelu fwd", 0, 2 * 4 * nc * 4, [&] { gelu_forward<float>(out.data(), h.data(), int64_t(N) * 4 * C); });
  add("gelu bwd", 0, 3 * 4 * nc * 4, [&] { gelu_backward<float>(out2.data(), h.data(), dh.data(), int64_t(N) * 4 * C); });
  add("bias grads (qkv, proj, fc, fc2)", 0, 9 * nc * 4, [&] {
    for (int oc : {3 * C, C, 4 * C, C}) linear_backward<float>(nullptr, nullptr, db.data(), dh.data(), nullptr, nullptr, N, C, oc);
  });
  add("residual fwd x2", 0, 2 * 3 * nc * 4, [&] {
    for (int r = 0; r < 2; ++r) residual_forward<float>(out.data(), x.data(), dx.data(), int64_t(N) * C);
  });
  // Shares from CPU time with one thread (robust on a shared machine), else from wall time.
  const bool by_cpu = omp_get_max_threads() == 1;
  auto secs = [&](const Row& r) { return by_cpu ? r.t.cpu : r.t.wall; };
  double block_other = 0, gemm_s = secs(rows[0]);
  for (size_t i = 1; i < rows.size(); ++i) block_other += secs(rows[i]);

  // The Llama block: its GEMMs and its ops, shares against its own GEMMs.
  const size_t llama0 = rows.size();
  add_llama_rows(add, B, T, C, NH, g);
  for (size_t i = llama0; i < rows.size(); ++i) rows[i].llama = true;
  double llama_other = 0;
  const double llama_gemm_s = secs(rows[llama0]);
  for (size_t i = llama0 + 1; i < rows.size(); ++i) llama_other += secs(rows[i]);

  // Model-level ops (once per step, not per block), for the record.
  {
    std::vector<float> logits = random_floats(size_t(std::min(N, 1024)) * V, g, -4, 4), loss(N), xl(N);
    const int Nx = std::min(N, 1024);
    std::uniform_int_distribution<int> tok(0, valid - 1);
    std::vector<int32_t> tg(N);
    for (auto& t : tg) t = tok(g);
    add(fmt::format("softmax-xent fwd+bwd ({} rows)", Nx), 0, 3.0 * Nx * V * 4, [&] {
      softmax_xent_forward<float>(loss.data(), xl.data(), logits.data(), tg.data(), Nx, V, valid);
      softmax_xent_backward<float>(logits.data(), logits.data(), xl.data(), tg.data(), 1.0f / Nx, Nx, V, valid);
    });
    const int64_t np = 124'000'000 / 8;  // an eighth of GPT-2 124M's parameters
    std::vector<float> p = random_floats(np, g), m(np, 0.0f), v(np, 0.0f), gr = random_floats(np, g);
    int64_t step = 0;
    add("adamw (15.5M params)", 0, 7.0 * np * 4, [&] {
      triax::adamw_update(p, gr, m, v, triax::AdamWConfig{}, 0.1f, triax::AdamWStep{1e-3f, ++step, 1.0f});
    });
  }

  nlohmann::json j;
  fmt::print("ops_bench B={} T={} C={} NH={} V={} threads={} blas_nests_in_openmp={} (best of {}; shares by {} time)\n", B,
             T, C, NH, V, omp_get_max_threads(), gemm_nests_in_openmp(), reps, by_cpu ? "cpu" : "wall");
  fmt::print("{:<42} {:>9} {:>9} {:>9} {:>8} {:>9}\n", "op", "wall ms", "cpu ms", "GFLOP/s", "GB/s", "vs GEMMs");
  for (const auto& r : rows) {
    const double s = secs(r);
    fmt::print("{:<42} {:>9.2f} {:>9.2f} {:>9} {:>8} {:>8.1f}%\n", r.name, r.t.wall * 1e3, r.t.cpu * 1e3,
               r.flops ? fmt::format("{:.1f}", r.flops / s / 1e9) : "", r.bytes ? fmt::format("{:.1f}", r.bytes / s / 1e9) : "",
               100 * s / (r.llama ? llama_gemm_s : gemm_s));
    j["ops"].push_back({{"op", r.name}, {"wall_ms", r.t.wall * 1e3}, {"cpu_ms", r.t.cpu * 1e3}});
  }
  fmt::print("block: GEMMs {:.1f} ms, other ops {:.1f} ms -> {:.1f}% of block time in the linear GEMMs\n", gemm_s * 1e3,
             block_other * 1e3, 100 * gemm_s / (gemm_s + block_other));
  j["gemm_share"] = gemm_s / (gemm_s + block_other);
  fmt::print("llama block: GEMMs {:.1f} ms, other ops {:.1f} ms -> {:.1f}% in the linear GEMMs (the rmsnorm, swiglu, "
             "rope and gqa rows: shares vs the llama GEMMs)\n",
             llama_gemm_s * 1e3, llama_other * 1e3, 100 * llama_gemm_s / (llama_gemm_s + llama_other));
  j["llama_gemm_share"] = llama_gemm_s / (llama_gemm_s + llama_other);
  if (json) fmt::print("{}\n", j.dump());
  return 0;
}
