// The cost model, checked where its answer is known exactly: Korthikanti's activation formulas,
// compute time equal to FLOPs / rate when nothing is memory bound, memory terms per parameter,
// the collectives each step issues, and the schedules' bubble relations.
#include <catch2/catch.hpp>

#include "plan/fixtures.h"
#include "triax/core/error.h"
#include "triax/plan/cost_model.h"

using namespace triax::plan;
using triax::plan::test::round_cluster;
using triax::plan::test::small_model;

namespace {

Layout megatron_style() {
  Layout l;
  l.precision = Precision::fp16;
  l.attention = AttentionKernel::unfused;
  l.dropout = true;
  return l;
}

// A cluster on which no kernel is memory bound and kernels cost no launch gap.
Cluster compute_bound() {
  Cluster c = round_cluster();
  c.memory_gbps = 1e12;
  c.kernel_overhead_us = 0;
  return c;
}

}  // namespace

TEST_CASE("activation bytes per layer are Korthikanti et al.'s Table 2") {
  ModelShape m;
  m.layers = 4;
  m.hidden = 1024;
  m.heads = 16;
  m.vocab = 1000;
  m.seq = 2048;
  m.global_batch = 8;
  const double s = 2048, h = 1024, a = 16, b = 2, t = 4;
  const double sbh = s * b * h;
  Layout l = megatron_style();
  l.micro_batch = 2;
  l.recompute = Recompute::none;
  CHECK(layer_activation_bytes(m, l) == Approx(sbh * (34 + 5 * a * s / h)).epsilon(1e-12));
  l.tp = 4;
  CHECK(layer_activation_bytes(m, l) == Approx(sbh * (10 + 24 / t + 5 * a * s / (h * t))).epsilon(1e-12));
  l.sequence_parallel = true;
  CHECK(layer_activation_bytes(m, l) == Approx(sbh / t * (34 + 5 * a * s / h)).epsilon(1e-12));
  l.recompute = Recompute::selective;
  CHECK(layer_activation_bytes(m, l) == Approx(sbh / t * 34).epsilon(1e-12));
  l.sequence_parallel = false;
  CHECK(layer_activation_bytes(m, l) == Approx(sbh * (10 + 24 / t)).epsilon(1e-12));
  l.recompute = Recompute::full;
  CHECK(layer_activation_bytes(m, l) == Approx(2 * sbh).epsilon(1e-12));
  l.sequence_parallel = true;
  CHECK(layer_activation_bytes(m, l) == Approx(2 * sbh / t).epsilon(1e-12));
  // Without dropout the two masks and the attention dropout output go: 32 + 2as/h, fp32 doubles it.
  l = Layout{};
  l.attention = AttentionKernel::unfused;
  l.micro_batch = 2;
  CHECK(layer_activation_bytes(m, l) == Approx(sbh * (32 + 2 * a * s / h)).epsilon(1e-12));
  l.precision = Precision::fp32;
  CHECK(layer_activation_bytes(m, l) == Approx(2 * sbh * (32 + 2 * a * s / h)).epsilon(1e-12));
  // A fused attention kernel keeps only fp32 row statistics instead of the s x s scores.
  l.precision = Precision::bf16;
  l.attention = AttentionKernel::fused;
  CHECK(layer_activation_bytes(m, l) == Approx(sbh * 32 + 4 * b * a * s).epsilon(1e-12));
}

TEST_CASE("with nothing memory bound, compute time is executed FLOPs over the GEMM rate") {
  const CollectiveModel net(compute_bound());
  const ModelShape m = small_model();
  for (int tp : {1, 2, 8}) {
    for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full}) {
      Layout l = megatron_style();
      l.tp = tp;
      l.micro_batch = 4;
      l.recompute = rc;
      INFO(describe(l));
      const Estimate e = estimate(m, net, l);
      const double rate = 100e12 * 1.0;  // peak x gemm_efficiency
      CHECK(e.time.compute == Approx(e.flops.executed / tp / rate).epsilon(1e-6));
      CHECK(e.time.bubble == 0);
      CHECK(e.time.pp_comm == 0);
    }
  }
  // A fused attention kernel's backward recomputes the scores: 2.5x its forward, not 2x.
  Layout l;
  l.micro_batch = 4;
  const Estimate e = estimate(m, net, l);
  const double extra = 0.5 * m.global_batch * m.layers * attention_core_flops_per_sequence(m);
  CHECK(e.time.compute == Approx((e.flops.executed + extra) / 100e12).epsilon(1e-6));
}

TEST_CASE("TFLOP/s counts executed FLOPs and MFU model FLOPs") {
  const CollectiveModel net(cluster_preset("selene-a100"));
  Layout l = megatron_style();
  l.tp = 8;
  l.pp = 2;
  l.dp = 4;
  l.micro_batch = 1;
  l.recompute = Recompute::full;
  const Estimate e = estimate(model_preset("megatron-7.5b"), net, l);
  const double T = e.seconds_per_iteration;
  CHECK(T == Approx(e.time.total()));
  CHECK(e.tflops_per_gpu * 1e12 * T * 64 == Approx(e.flops.executed).epsilon(1e-12));
  CHECK(e.mfu * T * 64 * 312e12 == Approx(e.flops.model).epsilon(1e-12));
  CHECK(e.flops.executed > e.flops.model);
  CHECK(e.tokens_per_second == Approx(512.0 * 2048 / T));
}

TEST_CASE("memory per parameter: weights, gradients, optimizer state, ZeRO-1") {
  const CollectiveModel net(round_cluster());
  const ModelShape m = small_model();
  const double P = total_parameters(m);
  Layout l;
  l.dp = 4;
  Estimate e = estimate(m, net, l);
  CHECK(e.memory.weights == Approx(2 * P).epsilon(1e-12));    // bf16
  CHECK(e.memory.gradients == Approx(4 * P).epsilon(1e-12));  // fp32 accumulation
  CHECK(e.memory.optimizer == Approx(12 * P).epsilon(1e-12)); // fp32 master + m + v
  l.zero = 1;
  e = estimate(m, net, l);
  CHECK(e.memory.optimizer == Approx(12 * P / 4).epsilon(1e-12));
  l.grad_reduce_fp32 = false;
  e = estimate(m, net, l);
  CHECK(e.memory.gradients == Approx(2 * P).epsilon(1e-12));
  l = Layout{};
  l.precision = Precision::fp32;
  e = estimate(m, net, l);
  CHECK(e.memory.weights == Approx(4 * P).epsilon(1e-12));
  CHECK(e.memory.optimizer == Approx(8 * P).epsilon(1e-12));  // no separate master copy
  CHECK(e.memory.reserved == Approx(1.0 * (1 << 30)));
  // tp shards matrices and column biases; LayerNorms and row-parallel biases are replicated.
  l = Layout{};
  l.tp = 2;
  e = estimate(m, net, l);
  const double h = m.hidden, f = m.ffn_hidden(), V = m.vocab, s = m.seq;
  const double per_rank = m.layers * ((4 * h * h + 2 * h * f + 3 * h + f) / 2 + 6 * h) + V * h / 2 + s * h + 2 * h;
  CHECK(e.memory.weights == Approx(2 * per_rank).epsilon(1e-12));
}

TEST_CASE("activations in flight follow the schedule") {
  const CollectiveModel net(round_cluster());
  const ModelShape m = small_model();  // 8 layers, batch 64
  Layout l;
  l.pp = 4;
  l.micro_batch = 2;  // 32 micro-batches
  const double per_layer = layer_activation_bytes(m, l);
  Estimate e = estimate(m, net, l);
  REQUIRE(e.memory.stage == 0);
  CHECK(e.memory.activations == Approx(4 * 2 * per_layer).epsilon(1e-12));  // p micro-batches x 2 layers
  l.schedule = Schedule::zb_h1;
  CHECK(estimate(m, net, l).memory.activations == Approx(4 * 2 * per_layer).epsilon(1e-12));
  l.schedule = Schedule::gpipe;  // every rank holds all 32; the last also the logits for the loss
  e = estimate(m, net, l);
  CHECK(e.memory.stage == 3);
  CHECK(e.memory.activations == Approx(32 * 2 * per_layer + (2 + 4) * 512.0 * m.vocab).epsilon(1e-12));
  l.schedule = Schedule::interleaved;
  l.vpp = 2;  // Megatron's warm-up on rank 0: (p-1)*2 + (v-1)*p + 1 = 11 chunks of 1 layer
  CHECK(estimate(m, net, l).memory.activations == Approx(11 * per_layer).epsilon(1e-12));
  // Full recompute keeps layer inputs plus one layer's full activations as the working set.
  l = Layout{};
  l.pp = 4;
  l.micro_batch = 2;
  l.recompute = Recompute::full;
  Layout none = l;
  none.recompute = Recompute::none;
  e = estimate(m, net, l);
  CHECK(e.memory.activations ==
        Approx(4 * 2 * layer_activation_bytes(m, l) + layer_activation_bytes(m, none) - layer_activation_bytes(m, l))
            .epsilon(1e-12));
}

TEST_CASE("tensor-parallel collectives per layer and pass") {
  const CollectiveModel net(round_cluster());
  const ModelShape m = small_model();
  Layout l;
  l.tp = 8;
  l.micro_batch = 4;  // 16 micro-batches
  const auto g = place_group(net.cluster(), 8, 1);
  const double M = 4.0 * m.seq, bytes = 2 * M * m.hidden;
  const double ar = net.seconds(CollectiveOp::all_reduce, g, bytes);
  const double ag = net.seconds(CollectiveOp::all_gather, g, bytes);
  const double rs = net.seconds(CollectiveOp::reduce_scatter, g, bytes);
  const double ce = 3 * net.seconds(CollectiveOp::all_reduce, g, 4 * M);
  // 2 all-reduces forward + 2 backward per layer; embedding and head one each; cross-entropy's 3.
  CHECK(estimate(m, net, l).time.tp_comm == Approx(16 * (8 * 4 * ar + 2 * ar + ce)).epsilon(1e-12));
  l.recompute = Recompute::full;  // the recomputed forward repeats its 2
  CHECK(estimate(m, net, l).time.tp_comm == Approx(16 * (8 * 6 * ar + 2 * ar + ce)).epsilon(1e-12));
  l.recompute = Recompute::none;
  l.sequence_parallel = true;
  CHECK(estimate(m, net, l).time.tp_comm == Approx(16 * (8 * 4 * (ag + rs) + rs + ag + rs + ce)).epsilon(1e-12));
}

TEST_CASE("pipeline p2p inside a node, across nodes, and scattered over the tp ranks") {
  const CollectiveModel net(round_cluster());
  const ModelShape m = small_model();
  const double M = 2.0 * m.seq, msg = 2 * M * m.hidden;
  Layout l;
  l.pp = 2;
  l.micro_batch = 2;  // 32 micro-batches
  const auto intra = place_group(net.cluster(), 2, 1);
  CHECK(estimate(m, net, l).time.pp_comm == Approx(32 * 2 * net.seconds(CollectiveOp::p2p, intra, msg)).epsilon(1e-12));
  l.tp = 8;  // stages are whole nodes now
  const auto pair = place_group(net.cluster(), 2, 8);
  const auto tp = place_group(net.cluster(), 8, 1);
  const double sg = net.seconds(CollectiveOp::p2p, pair, msg / 8) + net.seconds(CollectiveOp::all_gather, tp, msg);
  CHECK(estimate(m, net, l).time.pp_comm == Approx(32 * 2 * sg).epsilon(1e-12));
  l.pp_scatter_gather = false;
  CHECK(estimate(m, net, l).time.pp_comm == Approx(32 * 2 * net.seconds(CollectiveOp::p2p, pair, msg)).epsilon(1e-12));
  CHECK(sg < net.seconds(CollectiveOp::p2p, pair, msg));
  // Interleaving sends v times per micro-batch.
  l.pp_scatter_gather = true;
  l.schedule = Schedule::interleaved;
  l.vpp = 2;
  CHECK(estimate(m, net, l).time.pp_comm == Approx(32 * 4 * sg).epsilon(1e-12));
}

TEST_CASE("data-parallel reduction: exposed without overlap, hidden with it, ZeRO-1 as RS + AG") {
  Cluster c = round_cluster();
  c.intra_gbps = 1000;  // a reduction shorter than one micro-batch's backward
  const CollectiveModel net(c);
  const ModelShape m = small_model();
  const double P = total_parameters(m);
  const auto g = place_group(net.cluster(), 8, 1);
  const double norm = 2 * net.seconds(CollectiveOp::all_reduce, g, 4);
  Layout l;
  l.dp = 8;
  l.dp_overlap = false;
  Estimate e = estimate(m, net, l);
  CHECK(e.time.dp_comm == Approx(net.seconds(CollectiveOp::all_reduce, g, 4 * P) + norm).epsilon(1e-12));
  CHECK(e.dp_algorithm == "ring");
  l.dp_overlap = true;  // the last backward is longer than this reduction
  CHECK(estimate(m, net, l).time.dp_comm == Approx(norm).epsilon(1e-12));
  l.dp_overlap = false;
  l.zero = 1;  // reduce-scatter fp32 gradients, all-gather bf16 parameters
  CHECK(estimate(m, net, l).time.dp_comm ==
        Approx(net.seconds(CollectiveOp::reduce_scatter, g, 4 * P) + net.seconds(CollectiveOp::all_gather, g, 2 * P) + norm)
            .epsilon(1e-12));
}

TEST_CASE("optimizer time streams the state once") {
  Cluster c = round_cluster();
  const CollectiveModel net(c);
  const ModelShape m = small_model();
  const double P = total_parameters(m);
  Layout l;
  // gradient read twice and zeroed (3 x 4), master/m/v read + written (24), bf16 copy written (2)
  CHECK(estimate(m, net, l).time.optimizer == Approx(P * 38 / 1e12).epsilon(1e-12));
  l.dp = 4;
  l.zero = 1;
  CHECK(estimate(m, net, l).time.optimizer == Approx(P / 4 * 38 / 1e12).epsilon(1e-12));
  l = Layout{};
  l.precision = Precision::fp32;
  CHECK(estimate(m, net, l).time.optimizer == Approx(P * 36 / 1e12).epsilon(1e-12));
}

TEST_CASE("schedules: GPipe equals 1F1B in time, interleaving divides the bubble, ZB-H1 shrinks it") {
  const CollectiveModel net(cluster_preset("selene-a100"));
  ModelShape m = model_preset("megatron-39b");
  m.vocab = 1024;  // a light head keeps the stages nearly equal
  Layout l;
  l.tp = 8;
  l.pp = 8;
  l.dp = 1;
  l.micro_batch = 1;
  m.global_batch = 64;
  const Estimate f1 = estimate(m, net, l);
  const double busy = f1.time.compute + f1.time.tp_comm + f1.time.pp_comm;
  CHECK(f1.time.bubble / busy == Approx(7.0 / 64).epsilon(0.03));  // (p - 1) / m
  l.schedule = Schedule::gpipe;
  CHECK(estimate(m, net, l).seconds_per_iteration == f1.seconds_per_iteration);
  l.schedule = Schedule::interleaved;
  l.vpp = 3;
  const Estimate il = estimate(m, net, l);
  CHECK(il.time.bubble / (il.time.compute + il.time.tp_comm + il.time.pp_comm) == Approx(7.0 / (3 * 64)).epsilon(0.05));
  l.schedule = Schedule::zb_h1;
  l.vpp = 1;
  const Estimate zb = estimate(m, net, l);
  CHECK(zb.time.bubble > 0);
  CHECK(zb.time.bubble < f1.time.bubble);
}

TEST_CASE("ZB-H1's bubble is (T_F + T_B - T_W) / (T_F + T_B + T_W) of 1F1B's") {
  // Compute bound, tp 1, unfused attention: per layer T_F ~ 24h^2 + 4sh, T_B ~ 24h^2 + 8sh (input
  // gradients, attention core twice), T_W ~ 24h^2 (per token, in FLOPs).
  const CollectiveModel net(compute_bound());
  ModelShape m = model_preset("megatron-39b");
  m.vocab = 1024;
  m.global_batch = 64;
  Layout l;
  l.pp = 8;
  l.attention = AttentionKernel::unfused;
  const Estimate f1 = estimate(m, net, l);
  l.schedule = Schedule::zb_h1;
  const Estimate zb = estimate(m, net, l);
  const double h = m.hidden, s = m.seq;
  CHECK(zb.time.bubble / f1.time.bubble == Approx((24 * h + 12 * s) / (72 * h + 12 * s)).epsilon(0.02));
}

TEST_CASE("a model too large for one device does not fit") {
  const CollectiveModel net(cluster_preset("selene-a100"));
  Layout l;
  Estimate e = estimate(model_preset("megatron-39b"), net, l);
  CHECK(!e.memory.fits());
  CHECK(e.memory.total() > e.memory.capacity);
  l.tp = 8;
  l.pp = 4;
  l.recompute = Recompute::full;
  e = estimate(model_preset("megatron-39b"), net, l);
  CHECK(e.memory.fits());
}

TEST_CASE("every layout rule is enforced with a message naming the numbers") {
  const Cluster c = round_cluster();  // 4 x 8
  const ModelShape m = small_model();  // 8 layers, 8 heads, batch 64
  struct Case {
    Layout l;
    const char* message;
  };
  auto with = [](auto f) {
    Layout l;
    f(l);
    return l;
  };
  const Case cases[] = {
      {with([](Layout& l) { l.tp = 0; }), "must be >= 1"},
      {with([](Layout& l) { l.dp = 64; }), "exceeds the cluster's 32"},
      {with([](Layout& l) { l.tp = 3; }), "tp 3 does not divide heads 8"},
      {with([](Layout& l) { l.pp = 3; }), "pp*vpp = 3 does not divide layers 8"},
      {with([](Layout& l) { l.schedule = Schedule::interleaved; l.pp = 2; }), "needs vpp >= 2"},
      {with([](Layout& l) { l.schedule = Schedule::interleaved; l.vpp = 2; }), "needs pp >= 2"},
      {with([](Layout& l) { l.vpp = 2; l.pp = 2; }), "vpp 2 needs the interleaved schedule"},
      {with([](Layout& l) { l.dp = 3; }), "dp*mbs = 3 does not divide global batch 64"},
      {with([](Layout& l) { l.micro_batch = 128; }), "dp*mbs = 128 does not divide global batch 64"},
      {with([](Layout& l) { l.schedule = Schedule::interleaved; l.pp = 4; l.vpp = 2; l.micro_batch = 32; }),
       "micro-batches 2 must be a multiple of pp 4"},
  };
  const CollectiveModel net(c);
  for (const auto& k : cases) {
    INFO(k.message);
    auto why = layout_problem(m, c, k.l);
    REQUIRE(why);
    CHECK_THAT(*why, Catch::Contains(k.message));
    CHECK_THROWS_AS(estimate(m, net, k.l), triax::ConfigError);
  }
  ModelShape odd = m;
  odd.ffn = 100;
  Layout tp8;
  tp8.tp = 8;
  CHECK_THAT(*layout_problem(odd, c, tp8), Catch::Contains("tp 8 does not divide ffn 100"));
  Layout sp = tp8;
  sp.sequence_parallel = true;
  ModelShape odd_seq = m;
  odd_seq.seq = 100;
  CHECK_THAT(*layout_problem(odd_seq, c, sp), Catch::Contains("tp 8 does not divide seq 100"));
  Layout tp16;
  tp16.tp = 16;
  ModelShape wide = m;
  wide.heads = 16;
  CHECK_THAT(*layout_problem(wide, c, tp16), Catch::Contains("tp 16 exceeds the 8 GPUs of a node"));
  CHECK(!layout_problem(wide, c, tp16, LayoutRules{true}));  // allowed across nodes on request
  Cluster six = c;
  six.gpus_per_node = 6;
  Layout tp4;
  tp4.tp = 4;
  CHECK_THAT(*layout_problem(m, six, tp4), Catch::Contains("would straddle nodes"));
  CHECK(!layout_problem(m, c, Layout{}));
}

TEST_CASE("enum names round-trip and bad names list the choices") {
  for (auto s : {Schedule::gpipe, Schedule::one_f_one_b, Schedule::interleaved, Schedule::zb_h1})
    CHECK(parse_schedule(to_string(s)) == s);
  for (auto r : {Recompute::none, Recompute::selective, Recompute::full}) CHECK(parse_recompute(to_string(r)) == r);
  for (auto p : {Precision::bf16, Precision::fp16, Precision::fp32}) CHECK(parse_precision(to_string(p)) == p);
  for (auto a : {AttentionKernel::fused, AttentionKernel::unfused}) CHECK(parse_attention(to_string(a)) == a);
  CHECK_THROWS_WITH(parse_schedule("1F1B"), Catch::Contains("expected one of: gpipe, 1f1b, interleaved, zb-h1"));
  CHECK_THROWS_AS(parse_precision("int8"), triax::ConfigError);
}
