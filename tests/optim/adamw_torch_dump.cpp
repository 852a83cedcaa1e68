// adamw_torch_dump: the triax side of adamw_torch_check.py. Trains a small GPT serially for a few
// steps (warm-up and decay, so lr changes every step; clipping low enough to act; decay and
// no-decay parameters) and writes what torch.optim.AdamW needs to replay the updates: the initial
// weights, each step's synced (unclipped) gradients with its lr and clip coefficient, the
// parameter ranges with their decay flag, and triax's final weights and Adam moments.
//   adamw_torch_dump OUT_DIR   ->  OUT_DIR/adamw.json, OUT_DIR/adamw.f32 (the arrays, float32)
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "triax/distributed/comm/self_comm.h"
#include "triax/train/trainer.h"

using namespace triax;

int main(int argc, char** argv) {
  if (argc != 2) {
    fmt::print(stderr, "usage: adamw_torch_dump OUT_DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  TrainConfig c;
  c.model = "nano";
  c.layers = 2;
  c.seq = 8;
  c.global_batch = 4;
  c.micro_batch = 2;
  c.train_iters = 5;
  c.lr = 3e-3;
  c.min_lr = 3e-4;
  c.warmup_iters = 2;
  c.clip_grad = 2.0;  // the norms are ~1.5 to 3: some steps clip, some do not
  c.adamw.weight_decay = 0.1f;
  c.seed = 31;
  Trainer t(std::shared_ptr<Communicator>(make_self_communicator("world", 0)), c);
  std::ofstream bin(dir + "/adamw.f32", std::ios::binary);
  size_t written = 0;  // floats
  auto put = [&](std::span<const float> v) {
    bin.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
    const size_t at = written;
    written += v.size();
    return at;
  };
  nlohmann::json j;
  j["beta1"] = c.adamw.beta1;
  j["beta2"] = c.adamw.beta2;
  j["eps"] = c.adamw.eps;
  j["weight_decay"] = c.adamw.weight_decay;
  j["numel"] = t.store().flat_params().size();
  for (const auto& r : t.optimizer().ranges())
    j["ranges"].push_back({{"offset", r.flat_offset}, {"count", r.count}, {"decay", r.decay}});
  j["init"] = put(t.store().flat_params());
  int clipped = 0;
  for (int s = 0; s < c.train_iters; ++s) {
    const IterationMetrics m = t.step();
    const StepReport& rep = t.last_report();
    if (rep.skipped) {
      fmt::print(stderr, "step {} was skipped (non-finite gradient norm)\n", s + 1);
      return 1;
    }
    clipped += rep.clip_coef < 1.0;
    j["steps"].push_back({{"lr", m.lr}, {"clip_coef", rep.clip_coef}, {"grad_norm", rep.grad_norm},
                          {"grads", put(t.store().flat_grads())}});
  }
  j["final"] = put(t.store().flat_params());
  j["exp_avg"] = put(t.optimizer().state_to_host(0));
  j["exp_avg_sq"] = put(t.optimizer().state_to_host(1));
  j["clipped_steps"] = clipped;
  bin.close();
  std::ofstream(dir + "/adamw.json") << j.dump(1) << "\n";
  if (!bin) {
    fmt::print(stderr, "cannot write {}/adamw.f32\n", dir);
    return 3;
  }
  return 0;
}
