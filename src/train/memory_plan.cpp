// The start-up memory model (memory_plan.h). The activation terms mirror GptChunk's buffers
// (GptChunk::activation_floats) and the schedule's documented bound on micro-batches in flight
// (pipeline/schedule.h); everything is counted in double so that no shape can wrap it around.
#include "triax/train/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "triax/core/dtype.h"
#include "triax/core/error.h"
#include "triax/optim/zero_sharding.h"
#include "triax/pipeline/schedule.h"

namespace triax {
namespace {

constexpr double kMiB = 1.0 / (1 << 20);

// Rows of each sequence on one rank: seq / cp under context parallelism (its two zigzag chunks).
double local_seq(const ResolvedTrainConfig& r) { return static_cast<double>(r.seq) / r.explicit_cfg.cp; }

// The data-parallel ranks the weights' state is sharded over: dp x cp (CP ranks hold the same
// weights), or --zero-shard-size under ZeRO-2/3.
double shard_ranks(const ResolvedTrainConfig& r) {
  const TrainConfig& c = r.explicit_cfg;
  return c.zero >= 2 && c.zero_shard_size > 0 ? c.zero_shard_size : static_cast<double>(r.dp) * c.cp;
}

// Bytes of ContextParallel's K/V exchange buffers (kept by it between layers; cp 1: none): each
// of B x seq/cp rows x 2 kv_heads/tp x head_dim values of the compute type; the ring (p2p) keeps 5
// (K/V in hand and in flight, two dK/dV partial sums, the incoming one; forward uses 2 of them),
// allgather this rank's K/V, all ranks' K/V and their gradients (2 cp + 1).
double cp_exchange_bytes(const ResolvedTrainConfig& r) {
  const TrainConfig& c = r.explicit_cfg;
  if (c.cp <= 1) return 0;
  const double kv = static_cast<double>(r.batch.micro_batch) * local_seq(r) * 2 * r.model.kv_heads() / c.tp *
                    r.model.head_dim();
  const double buffers = c.cp_comm_type == "allgather" ? 2.0 * c.cp + 1 : 5.0;
  return buffers * kv * static_cast<double>(dtype_size(r.compute));
}

// Floats of one in-flight micro-batch in a chunk of `layers` layers (GptChunk::activation_floats),
// on this rank's seq / cp rows of every sequence.
double chunk_activation_floats(const ResolvedTrainConfig& r, double layers, bool embedding, bool head) {
  const TrainConfig& c = r.explicit_cfg;
  const double tp = c.tp, B = static_cast<double>(r.batch.micro_batch), T = local_seq(r), C = r.model.n_embd;
  const double N = B * T, Nl = c.sequence_parallel && c.tp > 1 ? N / tp : N;
  const double Cl = C / tp, Fl = r.model.ffn_size() / tp, NHl = r.model.n_head / tp;
  const double Ql = r.model.qkv_width() / tp, Hl = (r.model.swiglu ? 2 : 1) * Fl;  // fused QKV, MLP input
  const double stats = r.model.norm == Norm::rmsnorm ? 2 * Nl : 4 * Nl;              // (mean and) rstd, x2
  double per_layer = Nl * C;
  if (c.recompute != Recompute::full) {
    per_layer += stats + N * Ql + N * Cl + B * NHl * T + Nl * C + N * Hl;
    if (c.recompute == Recompute::none) per_layer += 2 * N * C + N * Fl;
  }
  return per_layer * layers + (embedding ? N : 0) + (head ? Nl * C : 0);
}

// One layer's parameters on one TP rank: the dense unit (attention, norms, and the MLP or the MoE
// router) and, for an MoE layer, its local experts (their own unit, sharded over expert-DP).
struct LayerParams {
  double dense = 0, experts = 0;
};
LayerParams layer_params(const ResolvedTrainConfig& r, bool moe) {
  const TrainConfig& c = r.explicit_cfg;
  const GptConfig& m = r.model;
  const double tp = c.tp, C = m.n_embd, F = m.ffn_size(), Q = m.qkv_width(), b = m.bias ? 1 : 0;
  const double norms = 2 * (m.norm_kind_has_bias() ? 2 : 1) * C;  // two norms, replicated
  const double attn = norms + (Q * C + b * Q) / tp + C * C / tp + b * C;
  const double up = m.swiglu ? 2 : 1;  // gate and up, or c_fc
  if (!moe) return {attn + ((up + 1) * F * C + b * up * F) / tp + b * C, 0};
  const double expert = (up + 1) * F * C + b * (up * F + C);
  return {attn + static_cast<double>(c.experts) * C, static_cast<double>(c.experts) / c.ep * expert};
}

// `count` ZeRO units of `size` parameters (unpadded) each, sharded over `group` ranks. `tied`: the
// tied embedding's copy under pp > 1, whose gradient stays open until the step (summed over stages).
struct UnitKind {
  double size = 0, count = 0;
  double group = 1;
  bool tied = false;
  double padded() const { return std::ceil(size / group) * group; }
  double piece() const { return padded() / group; }
};

// The units of a rank of pipeline stage `stage`, as GptChunk declares them (begin_unit): the
// embedding, each layer (an MoE layer's experts as a second unit), the head (final norm, and the
// untied head matrix), the tied embedding's copy on the last stage when pp > 1.
std::vector<UnitKind> stage_units(const ResolvedTrainConfig& r, int stage) {
  const TrainConfig& c = r.explicit_cfg;
  const int P = c.pp, V = c.vpp;
  const double C = r.model.n_embd, vocab = static_cast<double>(r.model.padded_vocab(c.tp)) / c.tp * C;
  const double g = shard_ranks(r);
  const double eg = c.ep > 1 ? static_cast<double>(r.dp) / c.ep * c.cp : g;  // expert_dp x cp
  const bool tied = r.model.tied_embeddings, learned = r.model.positions == PositionEmbedding::learned_absolute;
  std::vector<UnitKind> us;
  int64_t first = 0;
  for (int vs = 0; vs < P * V; ++vs) {
    const int64_t count = r.stage_layers.at(static_cast<size_t>(vs));
    if (vs % P == stage) {
      if (vs == 0) us.push_back({vocab + (learned ? static_cast<double>(r.model.max_seq) * C : 0), 1, g, tied && P > 1});
      // Layer l is an MoE layer when (l + 1) % moe_every == 0.
      const int64_t moe = c.moe_every > 0 ? (first + count) / c.moe_every - first / c.moe_every : 0;
      us.push_back({layer_params(r, false).dense, static_cast<double>(count - moe), g});
      const LayerParams ml = layer_params(r, true);
      us.push_back({ml.dense, static_cast<double>(moe), g});
      us.push_back({ml.experts, static_cast<double>(moe), eg});
      if (vs == P * V - 1) {
        // The tied head is the embedding itself: on this store when pp is 1, a copy otherwise.
        us.push_back({(r.model.norm_kind_has_bias() ? 2 : 1) * C + (tied ? 0 : vocab), 1, g});
        if (tied && P > 1) us.push_back({vocab, 1, g, true});
      }
    }
    first += count;
  }
  std::erase_if(us, [](const UnitKind& u) { return u.size <= 0 || u.count <= 0; });
  return us;
}

// The sum of `value` over the k units with the largest value (units of a kind count separately).
template <class F>
double largest(std::vector<UnitKind> us, double k, F value) {
  std::sort(us.begin(), us.end(), [&](const UnitKind& a, const UnitKind& b) { return value(a) > value(b); });
  double sum = 0;
  for (const UnitKind& u : us) {
    const double n = std::min(k, u.count);
    sum += n * value(u);
    k -= n;
    if (k <= 0) break;
  }
  return sum;
}

// Weights, gradients, moments and the ZeRO terms of m (m.params set), by level (RankMemory).
void zero_state(const ResolvedTrainConfig& r, const std::vector<UnitKind>& us, RankMemory& m) {
  const TrainConfig& c = r.explicit_cfg;
  m.zero = c.zero;
  m.shard_group = static_cast<int>(shard_ranks(r));
  const double d = m.shard_group;
  if (c.zero <= 1) {
    const double padded = c.zero == 1 ? std::ceil(m.params / d) * d : m.params;  // ParamStore::finalize(dp)
    m.shard = c.zero == 1 ? padded / d : m.params;
    m.weights = m.grads = 4 * padded;
    m.moments = 8 * m.shard;
    if (c.zero == 1) m.grads += 4 * m.shard, m.staging = 4 * m.shard;
    return;
  }
  double padded = 0;
  for (const UnitKind& u : us) padded += u.count * u.padded(), m.shard += u.count * u.piece();
  m.weights = 4 * (c.zero == 3 ? m.shard : padded);
  m.grads = 4 * m.shard;
  m.moments = 8 * m.shard;
  if (c.zero == 2) m.staging = 4 * m.shard;  // ZeroSharding::gather_weights
  const ZeroShardingOptions zo;
  const auto size = [](const UnitKind& u) { return u.padded(); };
  const auto piece = [](const UnitKind& u) { return u.piece(); };
  const double reducing = static_cast<double>(zo.max_reducing);
  if (!c.overlap_grad_reduce) {
    m.unit_grads = 4 * (padded + largest(us, reducing, piece));  // every unit open until the step
  } else {
    // Open while backward writes them: one unit (two in an MoE layer: its experts and the rest),
    // plus the tied embedding all step; max_reducing more reduce-scattering into their pieces.
    std::vector<UnitKind> untied = us, tied_units = us;
    std::erase_if(untied, [](const UnitKind& u) { return u.tied; });
    std::erase_if(tied_units, [](const UnitKind& u) { return !u.tied; });
    const double open = c.moe_every > 0 ? 2 : 1;
    m.unit_grads = 4 * (largest(untied, open + reducing, size) + largest(tied_units, 1, size) +
                        largest(us, reducing, piece));
  }
  if (c.zero == 3) {
    const double resident = static_cast<double>(zo.max_resident);
    m.gathered = static_cast<double>(dtype_size(r.compute)) * (largest(us, resident, size) + largest(us, resident, piece));
  }
}

}  // namespace

RankMemory predict_rank_memory(const ResolvedTrainConfig& r, int stage) {
  const TrainConfig& c = r.explicit_cfg;
  const int P = c.pp, V = c.vpp;
  const double tp = c.tp, C = r.model.n_embd;
  const double vocab_rows = static_cast<double>(r.model.padded_vocab(c.tp)) / tp;
  RankMemory m;
  m.stage = stage;
  double largest_chunk = 0;
  for (int vs = stage; vs < P * V; vs += P) {
    const double count = static_cast<double>(r.stage_layers.at(static_cast<size_t>(vs)));
    largest_chunk = std::max(largest_chunk, chunk_activation_floats(r, count, vs == 0, vs == P * V - 1));
  }
  const std::vector<UnitKind> us = stage_units(r, stage);
  for (const UnitKind& u : us) m.params += u.count * u.size;
  zero_state(r, us, m);
  const int mbs = static_cast<int>(std::min<int64_t>(r.batch.num_micro_batches, std::numeric_limits<int>::max()));
  m.in_flight = activation_bound(c.schedule, P, V, mbs, stage);
  m.per_micro_batch = 4 * largest_chunk;
  m.activations = m.per_micro_batch * m.in_flight;
  const double N = static_cast<double>(r.batch.micro_batch) * local_seq(r);
  const double Cl = C / tp, Fl = r.model.ffn_size() / tp;
  const double Ql = r.model.qkv_width() / tp, Hl = (r.model.swiglu ? 2 : 1) * Fl;
  const bool has_head = stage == P - 1;
  // Backward's transient gradients: dqkv and datt, dg and the MLP input's (dh), 4 of (N, C).
  m.working = 4 * (N * (Ql + Cl + Fl + Hl + 4 * C) + (has_head ? N * vocab_rows : 0));
  // Context parallelism: the K/V exchange buffers, and (learned positions) the position rows of
  // the local tokens and their gradient.
  const bool learned = r.model.positions == PositionEmbedding::learned_absolute;
  if (c.cp > 1) m.working += cp_exchange_bytes(r) + (learned ? 8 * local_seq(r) * C : 0);
  if (c.data.empty() || c.data == "synthetic") m.data = 4.0 * r.model.vocab;
  return m;
}

std::string describe_rank_memory(const RankMemory& m) {
  auto mib = [](double b) { return fmt::format("{:.1f} MiB", b * kMiB); };
  std::string zero;
  if (m.zero >= 1)
    zero = fmt::format(" (ZeRO-{}: {} of {:.0f} values, 1/{} of the {})", m.zero,
                       m.zero == 3 ? "masters, gradients and moments" : m.zero == 2 ? "gradients and moments" : "moments",
                       m.shard, m.shard_group, m.zero >= 2 ? "padded units" : "padded store");
  std::string extra;
  if (m.gathered > 0) extra += fmt::format(" + ZeRO-3 gathered units {}", mib(m.gathered));
  if (m.zero == 2)
    extra += fmt::format(" + the larger of the unit gradient buffers in flight {} and the weights' all-gather staging {}",
                         mib(m.unit_grads), mib(m.staging));
  else if (m.unit_grads > 0)
    extra += fmt::format(" + unit gradient buffers in flight {}", mib(m.unit_grads));
  if (m.zero == 1) extra += fmt::format(" + all-gather staging {}", mib(m.staging));
  return fmt::format(
      "{} = parameters {} ({:.0f} fp32 values) + gradients {} + AdamW moments {}{}{} + activations {} ({} micro-batch "
      "chunks in flight x {:.2f} MiB) + working buffers {}{}",
      mib(m.total()), mib(m.weights), m.params, mib(m.grads), mib(m.moments), zero, extra, mib(m.activations),
      m.in_flight, m.per_micro_batch * kMiB, mib(m.working),
      m.data >= (1 << 20) ? fmt::format(" + generated data {}", mib(m.data)) : std::string());
}

void refuse_if_over_memory(const ResolvedTrainConfig& r, const std::vector<int>& stages_on_host,
                           const MemoryLimit& limit, const std::string& host) {
  if (!limit.bytes || stages_on_host.empty()) return;
  double need = 0, need_state = 0;
  RankMemory largest;
  for (const int s : stages_on_host) {
    const RankMemory m = predict_rank_memory(r, s);
    need += m.total();
    need_state += m.state() + m.data;
    if (m.total() > largest.total()) largest = m;
  }
  const double room = static_cast<double>(*limit.bytes);
  if (need <= room) return;
  const TrainConfig& c = r.explicit_cfg;
  // The flag to change: what the micro-batch cannot fix (the model's state alone does not fit)
  // is the layout or the model; otherwise the larger of the activations and the working buffers.
  std::string advice;
  if (need_state > room)
    advice = fmt::format("use more --tp / --pp (now {} / {}){}, or a smaller model (--model {}, --num-layers {}, "
                         "--hidden-size {}, --vocab-size {}{})",
                         c.tp, c.pp, c.zero >= 1 ? "" : ", --zero 1 (or 2, 3)", c.model, r.model.n_layer, r.model.n_embd,
                         r.model.vocab, c.moe_every > 0 ? fmt::format(", --experts {}", c.experts) : std::string());
  else if (largest.working > largest.activations)
    advice = fmt::format("lower --micro-batch-size (now {}) or --vocab-size (now {}), or use more --tp",
                         r.batch.micro_batch, r.model.vocab);
  else
    advice = fmt::format("lower --micro-batch-size (now {}) or --seq-length (now {}), or use --recompute full{}",
                         r.batch.micro_batch, r.seq, c.tp * c.pp > 1 ? "" : ", or more --tp / --pp");
  TRIAX_THROW(MemoryRefused,
              "out of memory, refused before allocating: the memory model (docs/PLANNER.md) predicts {:.0f} MiB for "
              "the {} rank{} on host {} but {:.0f} MiB are available ({}); the largest, a rank of pipeline stage {}, "
              "needs {}. To fit: {}",
              need * kMiB, stages_on_host.size(), stages_on_host.size() == 1 ? "" : "s", host,
              static_cast<double>(*limit.bytes) * kMiB, limit.source, largest.stage,
              describe_rank_memory(largest), advice);
}

}  // namespace triax
