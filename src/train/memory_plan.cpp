// The start-up memory model (memory_plan.h). The activation terms mirror GptChunk's buffers
// (GptChunk::activation_floats) and the schedule's documented bound on micro-batches in flight
// (pipeline/schedule.h); everything is counted in double so that no shape can wrap it around.
#include "triax/train/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "triax/core/error.h"
#include "triax/pipeline/schedule.h"

namespace triax {
namespace {

constexpr double kMiB = 1.0 / (1 << 20);

// Floats of one in-flight micro-batch in a chunk of `layers` layers (GptChunk::activation_floats).
double chunk_activation_floats(const ResolvedTrainConfig& r, double layers, bool embedding, bool head) {
  const TrainConfig& c = r.explicit_cfg;
  const double tp = c.tp, B = static_cast<double>(r.batch.micro_batch), T = r.seq, C = r.model.n_embd;
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

// Parameters of `layers` layers starting at `first` on one TP rank (MoE layers replace the MLP).
double layer_params(const ResolvedTrainConfig& r, int64_t first, int64_t layers) {
  const TrainConfig& c = r.explicit_cfg;
  const GptConfig& m = r.model;
  const double tp = c.tp, C = m.n_embd, F = m.ffn_size(), Q = m.qkv_width(), b = m.bias ? 1 : 0;
  const double norms = 2 * (m.norm_kind_has_bias() ? 2 : 1) * C;  // two norms, replicated
  const double attn = norms + (Q * C + b * Q) / tp + C * C / tp + b * C;
  const double up = m.swiglu ? 2 : 1;  // gate and up, or c_fc
  const double expert = (up + 1) * F * C + b * (up * F + C);
  const double mlp = ((up + 1) * F * C + b * up * F) / tp + b * C;
  int64_t moe = 0;
  if (c.moe_every > 0) moe = (first + layers) / c.moe_every - first / c.moe_every;
  const double experts = c.experts, local_experts = experts / c.ep;
  const double moe_mlp = experts * C + local_experts * expert;
  return static_cast<double>(layers) * attn + static_cast<double>(layers - moe) * mlp + static_cast<double>(moe) * moe_mlp;
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
  int64_t first = 0;
  for (int vs = 0; vs < P * V; ++vs) {
    const int64_t count = r.stage_layers.at(static_cast<size_t>(vs));
    if (vs % P == stage) {
      const bool embedding = vs == 0, head = vs == P * V - 1;
      m.params += layer_params(r, first, count);
      const bool learned = r.model.positions == PositionEmbedding::learned_absolute;
      if (embedding) m.params += vocab_rows * C + (learned ? static_cast<double>(r.model.max_seq) * C : 0);
      // The final norm, and the head: its own matrix when untied; when tied, a copy of the
      // embedding when the embedding lives on another stage.
      if (head)
        m.params += (r.model.norm_kind_has_bias() ? 2 : 1) * C +
                    (!r.model.tied_embeddings || P > 1 ? vocab_rows * C : 0);
      largest_chunk = std::max(largest_chunk, chunk_activation_floats(r, static_cast<double>(count), embedding, head));
    }
    first += count;
  }
  m.weights = 4 * m.params;
  m.grads = 4 * m.params;
  m.moments = 8 * m.params / (c.zero >= 1 ? r.dp : 1);
  const int mbs = static_cast<int>(std::min<int64_t>(r.batch.num_micro_batches, std::numeric_limits<int>::max()));
  m.in_flight = activation_bound(c.schedule, P, V, mbs, stage);
  m.per_micro_batch = 4 * largest_chunk;
  m.activations = m.per_micro_batch * m.in_flight;
  const double N = static_cast<double>(r.batch.micro_batch) * r.seq;
  const double Cl = C / tp, Fl = r.model.ffn_size() / tp;
  const double Ql = r.model.qkv_width() / tp, Hl = (r.model.swiglu ? 2 : 1) * Fl;
  const bool has_head = stage == P - 1;
  // Backward's transient gradients: dqkv and datt, dg and the MLP input's (dh), 4 of (N, C).
  m.working = 4 * (N * (Ql + Cl + Fl + Hl + 4 * C) + (has_head ? N * vocab_rows : 0));
  if (c.data.empty() || c.data == "synthetic") m.data = 4.0 * r.model.vocab;
  return m;
}

std::string describe_rank_memory(const RankMemory& m, bool zero1) {
  return fmt::format(
      "{:.0f} MiB = parameters {:.0f} MiB ({:.0f} fp32 values) + gradients {:.0f} MiB + AdamW moments {:.0f} MiB{} + "
      "activations {:.0f} MiB ({} micro-batch chunks in flight x {:.2f} MiB) + working buffers {:.0f} MiB{}",
      m.total() * kMiB, m.weights * kMiB, m.params, m.grads * kMiB, m.moments * kMiB, zero1 ? " (ZeRO-1)" : "",
      m.activations * kMiB, m.in_flight, m.per_micro_batch * kMiB, m.working * kMiB,
      m.data >= (1 << 20) ? fmt::format(" + generated data {:.0f} MiB", m.data * kMiB) : std::string());
}

void refuse_if_over_memory(const ResolvedTrainConfig& r, const std::vector<int>& stages_on_host,
                           const MemoryLimit& limit, const std::string& host) {
  if (!limit.bytes || stages_on_host.empty()) return;
  double need = 0, need_state = 0;
  RankMemory largest;
  for (const int s : stages_on_host) {
    const RankMemory m = predict_rank_memory(r, s);
    need += m.total();
    need_state += m.weights + m.grads + m.moments + m.data;
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
              describe_rank_memory(largest, c.zero >= 1), advice);
}

}  // namespace triax
