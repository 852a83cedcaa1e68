// The start-up memory model against the model it predicts: parameter counts equal to what the
// built chunks register (dense, MoE, tp-split), activations equal to GptChunk's own count, the
// schedule's in-flight bound; the refusal (exit 5's OutOfMemoryError) with the prediction, the
// limit and the flag to change, and a Trainer that refuses before it allocates the model.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>

#include "triax/distributed/comm/self_comm.h"
#include "triax/model/gpt.h"
#include "triax/params/param_store.h"
#include "triax/train/memory_plan.h"
#include "triax/train/trainer.h"

using namespace triax;
using Catch::Contains;

namespace {
TrainConfig small(int layers) {
  TrainConfig c;
  c.model = "tiny";
  c.layers = layers;
  c.seq = 32;
  c.micro_batch = 3;
  c.num_micro_batches = 2;
  c.train_iters = 1;
  return c;
}

std::string oom_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const OutOfMemoryError& e) {
    return e.what();
  }
  FAIL("expected an OutOfMemoryError");
  return {};
}

// The parameters a rank of pipeline stage `stage` registers (its chunks, as the trainer builds
// them, on one TP rank), laid out by ZeRO level `zero` for rank 0 of a shard group of d.
struct StageStore {
  std::unique_ptr<Communicator> self = make_self_communicator();
  ParamStore store;
  std::vector<std::unique_ptr<GptChunk>> chunks;
  StageStore(const ResolvedTrainConfig& r, int stage, int zero, int d) {
    const TrainConfig& c = r.explicit_cfg;
    ChunkMoe moe;
    if (c.moe_every > 0) moe = ChunkMoe{c.moe_every, r.moe, self.get()};
    for (int v = 0; v < c.vpp; ++v) {
      const int vs = v * c.pp + stage;
      int first = 0;
      for (int i = 0; i < vs; ++i) first += static_cast<int>(r.stage_layers.at(static_cast<size_t>(i)));
      const ChunkSpec spec{first, static_cast<int>(r.stage_layers.at(static_cast<size_t>(vs))), vs == 0,
                           vs == c.pp * c.vpp - 1};
      chunks.push_back(std::make_unique<GptChunk>(r.model, spec, *self, store, c.recompute, c.pp == 1, false, moe));
    }
    if (zero >= 2) store.finalize_sharded(ShardSpec{zero, d, 0, d, 0});
    else store.finalize(zero == 1 ? static_cast<size_t>(d) : 1);
  }
  // The k largest units' padded sizes (or pieces) added up.
  double largest(size_t k, bool piece) const {
    std::vector<double> v;
    for (const auto& u : store.units()) v.push_back(static_cast<double>(piece ? u.piece() : u.size()));
    std::sort(v.rbegin(), v.rend());
    double s = 0;
    for (size_t i = 0; i < std::min(k, v.size()); ++i) s += v[i];
    return s;
  }
};
}  // namespace

TEST_CASE("the memory model counts the parameters and activations the trainer builds", "[train]") {
  // GPT-2's block, the Llama block (RMSNorm, SwiGLU, RoPE, GQA, untied head; Mixtral-shaped
  // experts), and the Llama block with biases and a tied head.
  for (const int block : {0, 1, 2})
  for (const bool moe : {false, true}) {
    for (const Recompute rc : {Recompute::none, Recompute::selective, Recompute::full}) {
      TrainConfig c = small(4);
      c.recompute = rc;
      if (block > 0) c.model = "llama-tiny";
      if (block == 2) c.disable_bias_linear = false, c.untie_embeddings = false;
      if (moe) c.moe_every = 2, c.experts = 3, c.topk = 1;
      const std::string mode(recompute_name(rc));
      CAPTURE(block, moe, mode);
      Trainer t(std::shared_ptr<Communicator>(make_self_communicator()), c);
      const RankMemory m = predict_rank_memory(resolve_train_config(c, 1), 0);
      CHECK(m.params == static_cast<double>(t.store().numel()));
      CHECK(m.weights == 4.0 * static_cast<double>(t.store().numel()));
      REQUIRE(t.chunks().size() == 1);
      CHECK(m.per_micro_batch == 4.0 * static_cast<double>(t.chunks()[0]->activation_floats(3, 32)));
      CHECK(m.in_flight == 1);  // 1F1B on one stage: one micro-batch at a time
      CHECK(m.data == 4.0 * 256);  // the synthetic successor table
    }
  }
}

TEST_CASE("per stage: the first stage holds pp micro-batches in flight, the last the head", "[train]") {
  TrainConfig c = small(8);
  c.pp = 4, c.tp = 2;
  c.num_micro_batches = 8;
  const ResolvedTrainConfig r = resolve_train_config(c, 8);
  const RankMemory first = predict_rank_memory(r, 0), last = predict_rank_memory(r, 3), mid = predict_rank_memory(r, 1);
  CHECK(first.in_flight == 4);
  CHECK(last.in_flight == 1);
  // tiny: C 64, padded vocab 256 over tp 2 = 128 rows; wpe 64 rows; each stage 2 layers.
  const double C = 64, layer = 4 * C + (3 * C * C + 3 * C) / 2 + C * C / 2 + C + (4 * C * C + 4 * C + 4 * C * C) / 2 + C;
  CHECK(mid.params == 2 * layer);
  CHECK(first.params == 2 * layer + 128 * C + 64 * C);
  CHECK(last.params == 2 * layer + 2 * C + 128 * C);  // ln_f and its own copy of the tied embedding
  // ZeRO-1 shards the moments over dp (here 2 at pp 2 x tp 2 on 8 ranks), nothing else.
  c.pp = 2;
  const RankMemory plain = predict_rank_memory(resolve_train_config(c, 8), 0);
  c.zero = 1;
  const RankMemory sharded = predict_rank_memory(resolve_train_config(c, 8), 0);
  CHECK(sharded.moments * 2 == plain.moments);
  CHECK(sharded.weights == plain.weights);
}

TEST_CASE("over the limit: refused with the prediction, the limit and the flag to change", "[train]") {
  TrainConfig c = small(2);
  c.micro_batch = 64;
  const ResolvedTrainConfig r = resolve_train_config(c, 1);
  const RankMemory m = predict_rank_memory(r, 0);
  REQUIRE(m.activations > m.weights + m.grads + m.moments);  // activations dominate at micro-batch 64
  // Exactly the prediction fits; one byte less does not.
  MemoryLimit fits{static_cast<uint64_t>(m.total()) + 1, "a test"};
  CHECK_NOTHROW(refuse_if_over_memory(r, {0}, fits, "h1"));
  const MemoryLimit tight{static_cast<uint64_t>(m.total()) - 1, "a test limit"};
  const std::string what = oom_of([&] { refuse_if_over_memory(r, {0}, tight, "h1"); });
  CHECK_THAT(what, Contains("out of memory, refused before allocating") && Contains("for the 1 rank on host h1") &&
                       Contains("(a test limit)") && Contains("lower --micro-batch-size (now 64)"));
  // Four ranks on one host share its memory: each alone fits, together they do not.
  MemoryLimit three{static_cast<uint64_t>(3 * m.total()), "a test"};
  CHECK_NOTHROW(refuse_if_over_memory(r, {0, 0, 0}, three, "h1"));
  CHECK_THAT(oom_of([&] { refuse_if_over_memory(r, {0, 0, 0, 0}, three, "h1"); }), Contains("the 4 ranks on host h1"));
  // Unknown limit: nothing to compare with.
  CHECK_NOTHROW(refuse_if_over_memory(r, {0}, MemoryLimit{}, "h1"));
  // Parameters dominate: the advice is the layout or the model, not the micro-batch.
  TrainConfig big = small(2);
  big.hidden = 1024, big.heads = 8, big.micro_batch = 1, big.seq = 8;
  const ResolvedTrainConfig rb = resolve_train_config(big, 1);
  CHECK_THAT(oom_of([&] { refuse_if_over_memory(rb, {0}, MemoryLimit{1 << 20, "a test"}, "h1"); }),
             Contains("use more --tp / --pp (now 1 / 1), --zero 1 (or 2, 3), or a smaller model"));
}

TEST_CASE("the trainer refuses a config over the limit before building it, in well under a second", "[train]") {
  ::setenv("TRIAX_MEMORY_LIMIT_MIB", "64", 1);
  TrainConfig c = small(2);
  c.micro_batch = 2048;  // about 2.4 GiB of activations
  const auto t0 = std::chrono::steady_clock::now();
  const std::string what = oom_of([&] { Trainer t(std::shared_ptr<Communicator>(make_self_communicator()), c); });
  ::unsetenv("TRIAX_MEMORY_LIMIT_MIB");
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 1.0);
  CHECK_THAT(what, Contains("but 64 MiB are available (TRIAX_MEMORY_LIMIT_MIB)") &&
                       Contains("--micro-batch-size (now 2048)"));
  // 2^31 - 1 layers: refused from the arithmetic alone (issue 24 item 7: 90 s of silence before).
  TrainConfig huge = small(1);
  huge.layers = 2147483647;
  huge.micro_batch = 1;
  const auto t1 = std::chrono::steady_clock::now();
  CHECK_THAT(oom_of([&] { Trainer t(std::shared_ptr<Communicator>(make_self_communicator()), huge); }),
             Contains("refused before allocating") && Contains("--num-layers 2147483647"));
  CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count() < 5.0);
}

TEST_CASE("ZeRO 1-3: the shard, weights, gradients and moments as the store lays them out", "[train]") {
  // GPT-2 (tied: pp 2 puts a copy of the embedding on the last stage), the Llama block (untied)
  // and MoE layers (the experts their own unit); dp 4, shard groups of 4 and (HSDP) 2.
  for (const int block : {0, 1})
  for (const bool moe : {false, true})
  for (const int pp : {1, 2})
  for (const int zero : {1, 2, 3})
  for (const int shard : {0, 2}) {
    if (zero == 1 && shard) continue;
    TrainConfig c = small(6);
    c.hidden = 99, c.heads = 3;  // odd widths: units are not multiples of the groups, padding shows
    if (block == 1) c.model = "llama-tiny", c.hidden = 102, c.heads = 3, c.group_query_attention = false;
    if (moe) c.moe_every = 2, c.experts = 3, c.topk = 1;
    c.pp = pp, c.zero = zero, c.zero_shard_size = shard;
    const ResolvedTrainConfig r = resolve_train_config(c, 4 * pp);
    const int d = shard ? shard : 4;
    for (int stage = 0; stage < pp; ++stage) {
      CAPTURE(block, moe, pp, zero, shard, stage);
      const StageStore s(r, stage, zero, d);
      const RankMemory m = predict_rank_memory(r, stage);
      const double n = static_cast<double>(s.store.numel());
      const double sh = zero >= 2 ? static_cast<double>(s.store.shard_size()) : static_cast<double>(s.store.padded_numel()) / d;
      CHECK(m.zero == zero);
      CHECK(m.shard_group == d);
      CHECK(m.params == n);
      CHECK(m.shard == sh);
      CHECK(m.moments == 8 * sh);
      if (zero == 1) {
        CHECK(m.weights == 4.0 * static_cast<double>(s.store.padded_numel()));
        CHECK(m.grads == m.weights + 4 * sh);  // the whole gradients and the reduce-scattered shard
        CHECK(m.staging == 4 * sh);
        continue;
      }
      CHECK(m.weights == 4.0 * static_cast<double>(zero == 3 ? s.store.shard_size() : s.store.padded_numel()));
      CHECK(m.grads == 4 * sh);
      CHECK(m.staging == (zero == 2 ? 4 * sh : 0.0));
      // ZeRO-3: the two largest units gathered (max_resident) in the compute type with their pieces.
      CHECK(m.gathered == (zero == 3 ? 4 * (s.largest(2, false) + s.largest(2, true)) : 0.0));
      // Gradient buffers: open (one unit, two in an MoE layer) + 2 reducing + their 2 pieces, and the
      // tied embedding's copy all step under pp 2 (an upper bound, exact for equal layers).
      if (pp == 1 && !moe) CHECK(m.unit_grads == 4 * (s.largest(3, false) + s.largest(2, true)));
      CHECK(m.unit_grads <= 4 * (s.largest(5, false) + s.largest(2, true)));
      CHECK(m.unit_grads >= 4 * (s.largest(3, false) + s.largest(2, true)) - 4 * s.largest(1, false));
    }
  }
  // ZeRO-3 at dp 8 holds 1/8 of the masters, gradients and moments (units padded to 8).
  TrainConfig c = small(6);
  c.zero = 3;
  const ResolvedTrainConfig r = resolve_train_config(c, 8);
  const RankMemory m = predict_rank_memory(r, 0);
  CHECK(m.shard * 8 >= m.params);
  CHECK(m.shard * 8 < m.params + 8 * 8);  // 8 units (embedding, 6 layers, head), each padded by < 8
  CHECK_THAT(describe_rank_memory(m), Contains("(ZeRO-3: masters, gradients and moments of") &&
                                          Contains("1/8 of the padded units") && Contains("ZeRO-3 gathered units"));
  // Without overlap every unit's gradient buffer stays open until the step: the whole padded store.
  c.overlap_grad_reduce = false;
  const RankMemory all = predict_rank_memory(resolve_train_config(c, 8), 0);
  CHECK(all.unit_grads > 4 * 8 * m.shard);
}

TEST_CASE("context parallelism: seq / cp rows, the K/V exchange buffers, ZeRO over dp x cp", "[train]") {
  // llama-tiny (GQA: kv_heads < heads) so that the exchange counts only the KV heads.
  for (const std::string type : {"p2p", "allgather"})
  for (const int cp : {2, 4}) {
    CAPTURE(type, cp);
    TrainConfig c = small(4);
    c.model = "llama-tiny";
    c.seq = 64;
    c.cp = cp, c.cp_comm_type = type;
    const ResolvedTrainConfig r = resolve_train_config(c, 2 * cp);  // dp 2
    const RankMemory m = predict_rank_memory(r, 0);
    TrainConfig one = small(4);  // one process on seq / cp tokens, dp 2
    one.model = "llama-tiny";
    one.seq = 64 / cp;
    const RankMemory o = predict_rank_memory(resolve_train_config(one, 2), 0);
    CHECK(m.per_micro_batch == o.per_micro_batch);
    CHECK(m.params == o.params);
    const double kv = 3.0 * (64 / cp) * 2 * r.model.kv_heads() * r.model.head_dim();  // B x T/cp rows
    REQUIRE(r.model.kv_heads() < r.model.n_head);
    const double buffers = type == "p2p" ? 5 : 2 * cp + 1;
    CHECK(m.working - o.working == Approx(4 * buffers * kv));  // RoPE: no position rows
    // ZeRO-1 and ZeRO-3 shard over dp x cp = 2 cp ranks.
    for (const int zero : {1, 3}) {
      c.zero = zero;
      const RankMemory z = predict_rank_memory(resolve_train_config(c, 2 * cp), 0);
      CHECK(z.shard_group == 2 * cp);
      CHECK(z.shard * 2 * cp >= z.params);
      CHECK(z.shard * 2 * cp < z.params + 2.0 * cp * 8);  // at most 6 units, each padded by < 2 cp
    }
  }  // GPT-2's learned positions: the local rows of the table and their gradient besides the ring's 5.
  TrainConfig c = small(4);
  c.seq = 64, c.cp = 2;
  TrainConfig one = small(4);
  one.seq = 32;
  const ResolvedTrainConfig r = resolve_train_config(c, 2);
  const double d = predict_rank_memory(r, 0).working - predict_rank_memory(resolve_train_config(one, 1), 0).working;
  CHECK(d == Approx(4 * (5 * 3.0 * 32 * 2 * 64 + 2 * 32 * 64)));  // B 3, T/cp 32, C 64 (kv width 2C)
}
