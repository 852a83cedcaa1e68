// Helpers of the trainer equivalence tests: train a configuration on the world, train its serial
// counterpart (one rank, same global batch) in-process, and compare losses, gradient norms and every
// parameter (this rank's TP shard of the serial full tensor; experts by their global names) to 1e-5
// relative. The gradient norms matter: AdamW is nearly blind to a uniform gradient scale (a lost
// 1/dp or 1/micro-batches), so equal losses and weights alone do not prove equal gradients.
#pragma once
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cmath>
#include <map>

#include "support/multirank.h"
#include "triax/distributed/comm/self_comm.h"
#include "triax/model/param_shards.h"
#include "triax/train/trainer.h"

namespace triax::test {

// The small run the 3D training tests share: nano model, 4 layers, 8-token samples, a global
// batch of 8 one-sample micro-batches; the caller picks iterations, learning rate and seed.
inline TrainConfig nano_train_config(int64_t iters, double lr, uint64_t seed) {
  TrainConfig c;
  c.model = "nano";
  c.layers = 4;
  c.seq = 8;
  c.global_batch = 8;
  c.micro_batch = 1;
  c.train_iters = iters;
  c.lr = lr;
  c.seed = seed;
  return c;
}

struct Result {
  std::vector<double> losses;
  std::vector<double> grad_norms;  // global norm before clipping, per iteration
  std::map<std::string, std::vector<float>> params;  // full shape (serial) or local shard
  int zero_level = 0, store_level = 0;  // the optimizer's ZeRO level and the store's layout (2/3 when sharded)
};

inline Result train(std::shared_ptr<Communicator> world, const TrainConfig& cfg, const TrainerOptions& opts = {}) {
  Trainer t(std::move(world), cfg, opts);
  Result r;
  t.train([&](const IterationMetrics& m) {
    r.losses.push_back(m.loss);
    r.grad_norms.push_back(m.grad_norm);
  });
  r.zero_level = t.optimizer().zero_level();
  r.store_level = t.store().zero_level();
  // Whole masters at any ZeRO level: gathered first when only the compute copy travelled (1, 2),
  // assembled from the shard group under ZeRO-3 (a collective every rank calls in order).
  t.optimizer().gather_master_weights();
  for (size_t i = 0; i < t.store().size(); ++i)
    r.params[t.store().info(i).spec.name] =
        t.optimizer().zero_level() == 3 ? t.optimizer().sharding().full_master(i) : t.store().param_to_host(i);
  return r;
}

// The serial run of a configuration (tp = cp = pp = dp = 1, the same global batch by gradient
// accumulation), computed once per process for each distinct serial configuration.
inline const Result& serial(TrainConfig cfg) {
  cfg.tp = cfg.pp = cfg.vpp = cfg.cp = 1;
  cfg.dp = 1;
  cfg.ep = 1;
  cfg.schedule = ScheduleKind::one_f_one_b;
  cfg.zero = 0;
  cfg.sequence_parallel = false;
  cfg.recompute = Recompute::none;
  cfg.moe_chunks = 1;
  cfg.pipeline_layers.clear();
  const std::string key = fmt::format("{}/{}/{}/{}/{}/{}/{}/{}/{}/{}/{}", cfg.model, cfg.layers.value_or(0), cfg.moe_every, cfg.experts, cfg.topk, cfg.no_drop,
                                      cfg.capacity_factor, cfg.global_batch.value_or(0), cfg.seq.value_or(0), cfg.seed,
                                      cfg.rampup ? fmt::format("{},{},{}", cfg.rampup->start, cfg.rampup->increment,
                                                               cfg.rampup->samples)
                                                 : "none");
  static std::map<std::string, Result> cache;
  auto it = cache.find(key);
  if (it == cache.end()) {
    auto self = make_self_communicator("serial", test::world().rank());
    it = cache.emplace(key, train(std::shared_ptr<Communicator>(std::move(self)), cfg)).first;
  }
  return it->second;
}

inline double rel_err(std::span<const float> a, std::span<const float> b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// The vocab-parallel tensors (the embedding, the untied LM head): padded rows depend on tp.
inline bool is_vocab_param(const GptConfig& m, const std::string& name) {
  return name == m.embedding_param() || name == m.lm_head_param();
}

// The part of the serial model's full tensor `full` (parameter `name`) that tp rank tp_rank of
// cfg's layout holds: its TP shard; for the vocab-parallel wte only the real vocabulary rows, which
// start the local shard (the rows after them are padding, zero in any layout). Empty when this
// rank's wte shard is all padding.
inline std::vector<float> serial_part(const TrainConfig& cfg, const std::string& name, const std::vector<float>& full,
                                      int tp_rank) {
  GptConfig m = GptConfig::preset(cfg.model);
  m.n_layer = cfg.layers.value_or(m.n_layer);
  const int C = m.n_embd;
  if (is_vocab_param(m, name)) {
    const int vl = m.padded_vocab(cfg.tp) / cfg.tp;
    const int r0 = tp_rank * vl, r1 = std::min(r0 + vl, m.vocab);
    if (r1 <= r0) return {};
    return {full.begin() + static_cast<ptrdiff_t>(r0) * C, full.begin() + static_cast<ptrdiff_t>(r1) * C};
  }
  // Recreate the full shape of this parameter in the serial model from its element count.
  std::vector<int64_t> shape;
  TpSplit split = TpSplit::none;
  if (name.ends_with("c_attn.weight")) { shape = {3 * C, C}; split = TpSplit::qkv_rows; }
  else if (name.ends_with("c_attn.bias")) { shape = {3 * C}; split = TpSplit::qkv_rows; }
  else if (name.ends_with("attn.c_proj.weight")) { shape = {C, C}; split = TpSplit::cols; }
  else if (name.ends_with("mlp.c_fc.weight")) { shape = {m.ffn_size(), C}; split = TpSplit::rows; }
  else if (name.ends_with("mlp.c_fc.bias")) { shape = {m.ffn_size()}; split = TpSplit::rows; }
  else if (name.ends_with("mlp.c_proj.weight")) { shape = {C, m.ffn_size()}; split = TpSplit::cols; }
  else if (name.starts_with("model.layers.") && name.find(".mlp.experts.") == std::string::npos &&
           name.find("block_sparse_moe") == std::string::npos) {
    // The Llama family: column-parallel q/k/v, gate/up (weights and biases) split by rows,
    // row-parallel o_proj/down_proj by columns, the rest replicated.
    const int64_t n = static_cast<int64_t>(full.size());
    for (const char* col : {"q_proj.", "k_proj.", "v_proj.", "gate_proj.", "up_proj."})
      if (name.find(col) != std::string::npos) {
        split = TpSplit::rows;
        shape = name.ends_with(".weight") ? std::vector<int64_t>{n / C, C} : std::vector<int64_t>{n};
      }
    if (name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight")) {
      split = TpSplit::cols;
      shape = {C, n / C};
    }
    if (split == TpSplit::none) shape = {n};
  }
  else shape = {static_cast<int64_t>(full.size())};
  return shard_of(full, shape, split, tp_rank, cfg.tp);
}

// Compares this rank's losses, gradient norms and parameters with the serial model's.
inline void compare(const TrainConfig& cfg, const Result& got, int tp_rank) {
  const Result& ref = serial(cfg);
  REQUIRE(got.losses.size() == ref.losses.size());
  REQUIRE(got.grad_norms.size() == ref.grad_norms.size());
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    INFO("iteration " << i + 1 << " loss " << got.losses[i] << " serial " << ref.losses[i] << "; grad norm "
                      << got.grad_norms[i] << " serial " << ref.grad_norms[i]);
    CHECK(std::abs(got.losses[i] - ref.losses[i]) <= 1e-5 * std::abs(ref.losses[i]));
    CHECK(std::abs(got.grad_norms[i] - ref.grad_norms[i]) <= 1e-5 * std::abs(ref.grad_norms[i]));
  }
  // The model learned something, so equal weights are not equal initial weights.
  REQUIRE(ref.losses.back() < ref.losses.front());
  for (const auto& [name, mine] : got.params) {
    INFO(name);
    REQUIRE(ref.params.count(name) == 1);
    const auto& full = ref.params.at(name);
    const auto want = serial_part(cfg, name, full, tp_rank);
    if (is_vocab_param(GptConfig::preset(cfg.model), name)) {
      // Padded rows differ with tp (zeros either way); compare the real vocabulary rows.
      REQUIRE(want.size() <= mine.size());
      CHECK(rel_err(std::span<const float>(mine).first(want.size()), want) <= 1e-5);
      continue;
    }
    REQUIRE(want.size() == mine.size());
    if (name.ends_with("c_attn.bias")) {
      // The key bias's gradient is exactly zero in exact arithmetic (softmax is invariant to a
      // shift shared by all keys), so in fp32 it is rounding noise (~1e-10) that AdamW's eps turns
      // into tiny, layout-dependent updates. Q and V parts: 1e-5 relative; K part: absolute.
      const size_t part = mine.size() / 3;
      std::span<const float> a(mine), b(want);
      CHECK(rel_err(a.subspan(0, part), b.subspan(0, part)) <= 1e-5);
      CHECK(rel_err(a.subspan(2 * part, part), b.subspan(2 * part, part)) <= 1e-5);
      for (size_t i = part; i < 2 * part; ++i) CHECK(std::abs(a[i] - b[i]) <= 1e-6);
      continue;
    }
    if (name.find(".moe.experts.") != std::string::npos && name.ends_with(".bias")) {
      // An expert's bias starts at zero and is fed by the few tokens routed to that expert, whose
      // gradient sum cancels: it is compared as part of its linear layer (weight and bias
      // together), still to 1e-5 relative.
      const std::string wname = name.substr(0, name.size() - 4) + "weight";
      const auto& wm = got.params.at(wname);
      const auto& wr = ref.params.at(wname);
      std::vector<float> a(mine), b(want);
      a.insert(a.end(), wm.begin(), wm.end());
      b.insert(b.end(), wr.begin(), wr.end());
      CHECK(rel_err(a, b) <= 1e-5);
      continue;
    }
    CHECK(rel_err(mine, want) <= 1e-5);
  }
}


}  // namespace triax::test
