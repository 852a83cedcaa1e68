// torch_compare_triax: the triax side of benchmarks/torch_compare.py, a long-lived worker that the
// driver alternates with a PyTorch worker of the same model. One full training step is the
// library's single-rank path: GptChunk forward + backward (embedding, L layers, final LayerNorm,
// tied LM head, cross-entropy) and Optimizer::step (global norm, clip, fused AdamW).
//
// Commands, one per line on stdin; each answer is one JSON line on stdout:
//   hello                 the model: parameters (name, shape, weight decay), padded vocabulary, FLOPs
//   export PATH           the current parameters as safetensors (triax's names; metadata "decay":
//                         the names with weight decay, comma-separated)
//   steps K               K training steps on the next K batches: losses, grad norms, seconds each
//   sgemm R               the sgemm ceiling: each distinct GEMM shape of the step (linears and LM
//                         head, forward NT, input gradient NN, weight gradient TN) as one
//                         cblas_sgemm call, best of R, weighted by how often the step issues it
//   quit
// Batches: step s (0-based, counted over the worker's life) takes sequences s*B .. s*B+B-1 of the
// --data file (int32 tokens, sequence i = tokens [i*T, i*T+T], targets shifted by one), wrapping.
#include <CLI/CLI.hpp>
#include <cblas.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "triax/core/cpu_isa.h"
#include "triax/dist/self_comm.h"
#include "triax/io/safetensors.h"
#include "triax/model/gpt.h"
#include "triax/optim/optimizer.h"

using namespace triax;

namespace {

double wall_now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void reply(const nlohmann::json& j) {
  std::fputs((j.dump() + "\n").c_str(), stdout);
  std::fflush(stdout);
}

struct Gemm {
  std::string what;
  int M, N, K;
  bool ta, tb;
  int count;  // how many times one step issues it
  double flops() const { return 2.0 * M * N * K; }
};

// The step's linear and head GEMMs (row-major, C = op(A) op(B)); attention's small per-head
// GEMMs are not in the ceiling (the same rate is applied to their FLOPs).
std::vector<Gemm> step_gemms(const GptConfig& cfg, int B, int T) {
  const int N = B * T, C = cfg.n_embd, F = cfg.ffn_size(), Vp = cfg.padded_vocab();
  std::vector<Gemm> g;
  auto linear = [&](const std::string& w, int OC, int IC, int count) {
    g.push_back({w + " fwd", N, OC, IC, false, true, count});     // out = inp W^T
    g.push_back({w + " dinp", N, IC, OC, false, false, count});   // dinp = dout W
    g.push_back({w + " dW", OC, IC, N, true, false, count});      // dW = dout^T inp
  };
  linear("qkv", 3 * C, C, cfg.n_layer);
  linear("attn.proj", C, C, cfg.n_layer);
  linear("fc", F, C, cfg.n_layer);
  linear("fc.proj", C, F, cfg.n_layer);
  linear("lm_head", Vp, C, 1);
  return g;
}

// Model FLOPs of one step, the same count for both sides: linears and LM head (real vocabulary)
// 6 N p, causal attention (the half of QK^T and PV below the diagonal) forward + backward.
nlohmann::json step_flops(const GptConfig& cfg, int B, int T) {
  const double N = double(B) * T, C = cfg.n_embd, F = cfg.ffn_size(), L = cfg.n_layer, V = cfg.vocab;
  const double linears = 6 * N * L * (4 * C * C + 2 * C * F);
  const double head = 6 * N * C * V;
  const double attention = 6 * double(B) * T * T * C * L;
  return {{"linears", linears}, {"head", head}, {"attention", attention}, {"total", linears + head + attention}};
}

nlohmann::json sgemm_ceiling(const std::vector<Gemm>& gemms, int reps) {
  size_t na = 0, nb = 0, nc = 0;
  for (const auto& g : gemms)
    na = std::max(na, size_t(g.M) * g.K), nb = std::max(nb, size_t(g.K) * g.N), nc = std::max(nc, size_t(g.M) * g.N);
  // Normal values in [-0.5, 0.5) (no denormals); filled once per call, outside the timing.
  auto fill = [](size_t n) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = float((uint32_t(i) * 2654435761u) >> 16) / 65536.0f - 0.5f;
    return v;
  };
  std::vector<float> a = fill(na), b = fill(nb), c = fill(nc);
  double flops = 0, seconds = 0;
  nlohmann::json shapes = nlohmann::json::array();
  for (const auto& g : gemms) {
    const int lda = g.ta ? g.M : g.K, ldb = g.tb ? g.K : g.N;
    double best = 1e30;
    for (int r = 0; r <= reps; ++r) {  // r = 0: warm-up
      const double t0 = wall_now();
      cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans, g.tb ? CblasTrans : CblasNoTrans, g.M, g.N, g.K,
                  1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), g.N);
      if (r > 0) best = std::min(best, wall_now() - t0);
    }
    flops += g.count * g.flops();
    seconds += g.count * best;
    shapes.push_back({{"gemm", g.what}, {"M", g.M}, {"N", g.N}, {"K", g.K}, {"count", g.count},
                      {"gflops_per_s", g.flops() / best / 1e9}});
  }
  return {{"gflops_per_s", flops / seconds / 1e9}, {"gemm_gflop", flops / 1e9}, {"seconds", seconds}, {"shapes", shapes}};
}

std::vector<int32_t> read_tokens(const std::string& path, int vocab, size_t min_tokens) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw IoError(fmt::format("torch_compare_triax: cannot open the token file {}", path));
  const auto bytes = static_cast<size_t>(f.tellg());
  if (bytes % 4 || bytes / 4 < min_tokens)
    throw IoError(fmt::format("torch_compare_triax: {} has {} bytes; it needs a whole number of int32 tokens, at "
                              "least {} (one batch)",
                              path, bytes, min_tokens));
  std::vector<int32_t> t(bytes / 4);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(t.data()), static_cast<std::streamsize>(bytes));
  for (size_t i = 0; i < t.size(); ++i)
    if (t[i] < 0 || t[i] >= vocab)
      throw IoError(fmt::format("torch_compare_triax: token {} at index {} of {} is outside [0, {})", t[i], i, path, vocab));
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"triax worker of benchmarks/torch_compare.py (commands on stdin, JSON lines on stdout)"};
  GptConfig cfg;
  int B = 8, T = 256, threads = 2;
  uint64_t seed = 1234;
  double lr = 6e-4, clip = 1.0;
  AdamWConfig adamw;
  std::string data;
  app.add_option("--layers", cfg.n_layer)->required();
  app.add_option("--heads", cfg.n_head)->required();
  app.add_option("--channels", cfg.n_embd)->required();
  app.add_option("--vocab", cfg.vocab)->required();
  app.add_option("--max-seq", cfg.max_seq, "position-embedding rows (default: --seq)");
  app.add_option("--seq", T)->required()->check(CLI::PositiveNumber);
  app.add_option("--batch", B)->required()->check(CLI::PositiveNumber);
  app.add_option("--threads", threads)->check(CLI::PositiveNumber);
  app.add_option("--seed", seed);
  app.add_option("--lr", lr);
  app.add_option("--clip", clip);
  app.add_option("--beta1", adamw.beta1);
  app.add_option("--beta2", adamw.beta2);
  app.add_option("--eps", adamw.eps);
  app.add_option("--weight-decay", adamw.weight_decay);
  app.add_option("--data", data, "int32 token file")->required();
  bool max_seq_given = false;
  app.callback([&] { max_seq_given = app.count("--max-seq") > 0; });
  CLI11_PARSE(app, argc, argv);
  if (!max_seq_given) cfg.max_seq = T;
  try {
    cfg.validate();
    if (T > cfg.max_seq) throw ConfigError(fmt::format("--seq {} exceeds --max-seq {}", T, cfg.max_seq));
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
    const std::vector<int32_t> tokens = read_tokens(data, cfg.vocab, size_t(B) * T + 1);
    const size_t nseq = (tokens.size() - 1) / T;

    auto grid = std::make_unique<ProcessGrid>(std::shared_ptr<Communicator>(make_self_communicator()), GridShape{});
    ParamStore store;
    GptChunk chunk(cfg, ChunkSpec{0, cfg.n_layer, true, true}, grid->tp(), store, Recompute::none);
    store.finalize();
    chunk.init_params(seed);
    OptimizerConfig ocfg;
    ocfg.adamw = adamw;
    ocfg.max_grad_norm = clip;
    Optimizer opt(store, *grid, ocfg);
    const auto gemms = step_gemms(cfg, B, T);

    std::vector<int32_t> x(size_t(B) * T), y(size_t(B) * T);
    int64_t step = 0;
    std::string line;
    while (std::getline(std::cin, line)) {
      std::istringstream in(line);
      std::string cmd;
      in >> cmd;
      if (cmd == "quit") break;
      if (cmd == "hello") {
        nlohmann::json params = nlohmann::json::array();
        for (const auto& p : store.infos())
          params.push_back({{"name", p.spec.name}, {"shape", p.local_shape}, {"weight_decay", p.spec.weight_decay}});
        reply({{"side", "triax"},
               {"params", params},
               {"numel", store.numel()},
               {"padded_vocab", cfg.padded_vocab()},
               {"flops", step_flops(cfg, B, T)},
               {"openblas", openblas_get_config()},
               {"isa", cpu_isa_name(cpu_isa())},
               {"threads", threads}});
      } else if (cmd == "export") {
        std::string path;
        in >> path;
        io::SafetensorsWriter w;
        std::string decay;
        for (size_t i = 0; i < store.size(); ++i) {
          const auto& p = store.info(i);
          w.add(p.spec.name, io::Shape(p.local_shape), store.param_to_host(i));
          if (p.spec.weight_decay) decay += (decay.empty() ? "" : ",") + p.spec.name;
        }
        w.add_metadata("decay", decay);
        w.write(path);
        reply({{"exported", path}});
      } else if (cmd == "steps") {
        int k = 0;
        in >> k;
        nlohmann::json losses = nlohmann::json::array(), norms = nlohmann::json::array(),
                       secs = nlohmann::json::array();
        for (int i = 0; i < k; ++i, ++step) {
          for (int b = 0; b < B; ++b) {
            const size_t s = (size_t(step) * B + b) % nseq;
            std::copy_n(tokens.begin() + s * T, T, x.begin() + size_t(b) * T);
            std::copy_n(tokens.begin() + s * T + 1, T, y.begin() + size_t(b) * T);
          }
          const double t0 = wall_now();
          store.zero_grads();
          const double loss = chunk.forward(0, B, T, x, y, Tensor(), Tensor(), true);
          chunk.backward(0, Tensor(), Tensor());
          const StepReport rep = opt.step(lr);
          secs.push_back(wall_now() - t0);
          losses.push_back(loss);
          norms.push_back(rep.grad_norm);
        }
        reply({{"losses", losses}, {"grad_norms", norms}, {"seconds", secs}});
      } else if (cmd == "sgemm") {
        int reps = 3;
        in >> reps;
        reply(sgemm_ceiling(gemms, std::max(1, reps)));
      } else {
        reply({{"error", fmt::format("unknown command '{}' (hello, export PATH, steps K, sgemm R, quit)", line)}});
      }
    }
  } catch (const std::exception& e) {
    reply({{"error", e.what()}});
    fmt::print(stderr, "torch_compare_triax: {}\n", e.what());
    return 1;
  }
  return 0;
}
