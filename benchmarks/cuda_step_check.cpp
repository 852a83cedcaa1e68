// cuda_step_check: one fp32 training step of a small GPT on the CPU backend and on the CUDA
// backend, from the same seed, weights and data, through the same Trainer: compares the loss, the
// gradient norm, every parameter gradient (after the step: the DP-synchronised, unclipped
// gradients) and every updated parameter. Prints one line per tensor with its relative error
// (max |cuda - cpu| / max |cpu| over the tensor) and exits 0 when all are within --tol (1e-5),
// 1 otherwise, 77 (skipped) when CUDA sees no device. Single process, one GPU (device 0); the
// CUDA run's communicator is the device communicator over a one-rank world (NCCL).
//
// AdamW's eps is 1e-3 here (not 1e-8): the first step's update is lr * g / (|g| + eps), which for
// eps << |g| is lr * sign(g), so a gradient element near zero whose sign differs between two
// correct summation orders would move its weight by 2 lr. With eps = 1e-3 the update is a smooth
// function of the gradient and a kernel error in AdamW still shows (the update is up to lr).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "triax/core/gpu_count.h"
#include "triax/distributed/comm/self_comm.h"
#include "triax/train/trainer.h"

namespace {

struct Snapshot {
  double loss = 0, grad_norm = 0;
  std::vector<std::string> names;
  std::map<std::string, std::vector<float>> grads, params;
};

Snapshot one_step(const triax::TrainConfig& cfg) {
  triax::Trainer t(triax::make_self_communicator("world", 0), cfg);
  const triax::IterationMetrics m = t.step();
  Snapshot s;
  s.loss = m.loss;
  s.grad_norm = m.grad_norm;
  triax::ParamStore& store = t.store();
  for (size_t i = 0; i < store.size(); ++i) {
    const std::string& name = store.info(i).spec.name;
    s.names.push_back(name);
    std::vector<float> g(store.info(i).numel);
    if (!g.empty()) store.backend().copy_to_host(g.data(), store.grad_t(i), g.size() * sizeof(float));
    s.grads[name] = std::move(g);
    s.params[name] = store.param_to_host(i);
  }
  return s;
}

// max |a - b| / max |b|; +inf for a NaN, a size mismatch, or a difference where b is all zeros.
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (std::isnan(d)) return INFINITY;
    num = std::max(num, d);
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  if (num == 0) return 0;
  return den > 0 ? num / den : INFINITY;
}

double rel_err(double a, double b) {
  const double d = std::fabs(a - b);
  if (std::isnan(d)) return INFINITY;
  return d == 0 ? 0 : d / std::max(std::fabs(b), 1e-300);
}

}  // namespace

int main(int argc, char** argv) {
  // tiny with 2 heads of 64 channels: a head size the CUDA attention kernels compile (32, 64, 128).
  int layers = 2, hidden = 128, heads = 2, seq = 64, micro = 2, global = 4;
  double tol = 1e-5, lr = 1e-3;
  uint64_t seed = 1234;
  std::string model = "tiny", against = "cuda", json_path;
  CLI::App app{"cuda_step_check: one fp32 step on --backend cpu and --backend cuda, compared tensor by tensor"};
  app.add_option("--model", model, "model preset")->capture_default_str();
  app.add_option("--num-layers", layers, "layers")->capture_default_str();
  app.add_option("--hidden-size", hidden, "channels")->capture_default_str();
  app.add_option("--num-attention-heads", heads, "heads")->capture_default_str();
  app.add_option("--seq-length", seq, "tokens per sample")->capture_default_str();
  app.add_option("--micro-batch-size", micro, "samples per micro-batch")->capture_default_str();
  app.add_option("--global-batch-size", global, "samples per step (micro-batches accumulate)")->capture_default_str();
  app.add_option("--lr", lr, "learning rate of the step")->capture_default_str();
  app.add_option("--seed", seed, "seed of weights and data")->capture_default_str();
  app.add_option("--tol", tol, "largest relative error accepted")->capture_default_str();
  app.add_option("--against", against, "the backend compared with cpu (cpu-checked rehearses the check without a GPU)")
      ->capture_default_str();
  app.add_option("--json", json_path, "also write the table as JSON (ok, tol, rows of tensor, rel_err, max_abs_cpu)");
  CLI11_PARSE(app, argc, argv);

  std::string why;
  if (const int n = triax::cuda_device_count(&why); n == 0 && against == "cuda") {
    std::printf("cuda_step_check: skipped: CUDA sees 0 devices (%s)\n", why.c_str());
    return 77;
  }
  triax::TrainConfig cfg;
  cfg.model = model;
  cfg.layers = layers;
  cfg.hidden = hidden;
  cfg.heads = heads;
  cfg.ffn = 4 * hidden;
  cfg.max_seq = seq;
  cfg.seq = seq;
  cfg.micro_batch = micro;
  cfg.global_batch = global;
  cfg.train_iters = 1;
  cfg.lr = lr;
  cfg.seed = seed;
  cfg.adamw.eps = 1e-3f;  // see the header: the update is a smooth function of the gradient
  try {
    cfg.backend = "cpu";
    const Snapshot cpu = one_step(cfg);
    cfg.backend = against;
    const Snapshot gpu = one_step(cfg);

    bool ok = true;
    int bad = 0;
    // scale: max |cpu| of the tensor; an all-zero reference would compare nothing, so it fails.
    nlohmann::json rows = nlohmann::json::array();
    auto row = [&](const std::string& what, double e, double scale) {
      const bool pass = e <= tol && scale > 0;
      ok = ok && pass;
      bad += !pass;
      rows.push_back({{"tensor", what}, {"rel_err", e}, {"max_abs_cpu", scale}, {"ok", pass}});
      std::printf("%-44s %12.3e %12.3e  %s\n", what.c_str(), e, scale, pass ? "ok" : "FAIL");
    };
    auto amax = [](const std::vector<float>& v) {
      double m = 0;
      for (float x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
      return m;
    };
    std::printf("cuda_step_check: cpu vs %s: %s, %d layers, hidden %d, %d heads, seq %d, %d x %d samples, lr %g, "
                "seed %llu, tol %g\n", against.c_str(), model.c_str(), layers, hidden, heads, seq,
                global / std::max(1, micro), micro, lr, static_cast<unsigned long long>(seed), tol);
    std::printf("%-44s %12s %12s\n", "tensor", "max rel err", "max |cpu|");
    row("loss", rel_err(gpu.loss, cpu.loss), std::fabs(cpu.loss));
    row("grad norm", rel_err(gpu.grad_norm, cpu.grad_norm), cpu.grad_norm);
    for (const auto& name : cpu.names)
      row("grad  " + name, rel_err(gpu.grads.at(name), cpu.grads.at(name)), amax(cpu.grads.at(name)));
    for (const auto& name : cpu.names)
      row("param " + name, rel_err(gpu.params.at(name), cpu.params.at(name)), amax(cpu.params.at(name)));
    std::printf("cuda_step_check: %s (loss cpu %.9g %s %.9g; %d of %zu checks over %g)\n", ok ? "ok" : "FAIL",
                cpu.loss, against.c_str(), gpu.loss, bad, 2 + 2 * cpu.names.size(), tol);
    if (!json_path.empty()) {
      std::ofstream f(json_path);
      f << nlohmann::json{{"ok", ok}, {"tol", tol}, {"against", against}, {"loss_cpu", cpu.loss},
                          {"loss_other", gpu.loss}, {"rows", rows}}.dump(1)
        << "\n";
      if (!f) {
        std::fprintf(stderr, "cuda_step_check: --json %s: write failed\n", json_path.c_str());
        return 1;
      }
    }
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_step_check: error: %s\n", e.what());
    return 1;
  }
}
