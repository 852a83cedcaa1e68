// Mechanisms the published-run validation relies on, checked against hand-computed numbers on the
// round test cluster: backward TP collectives hidden behind weight-gradient GEMMs, the mixed-precision
// optimizer's bytes, and GEMM waves inside a layer.
#include <catch2/catch.hpp>

#include "plan/fixtures.h"
#include "triax/plan/cost_model.h"
#include "triax/plan/gemm_model.h"

using namespace triax::plan;
using triax::plan::test::round_cluster;
using triax::plan::test::small_model;

namespace {
Layout tp4(int mbs) {
  Layout l;
  l.precision = Precision::fp16;
  l.tp = 4;
  l.micro_batch = mbs;
  return l;
}
}  // namespace

TEST_CASE("backward TP all-reduces hide behind the QKV and fc1 weight-gradient GEMMs") {
  Cluster c = round_cluster();
  c.memory_gbps = 1e12;  // nothing memory bound
  c.kernel_overhead_us = 0;
  const ModelShape m = small_model();  // 8 layers, h 512, f 2048, s 256, batch 64
  const CollectiveModel net(c);
  const GroupPlacement g = place_group(c, 4, 1);
  for (int mbs : {1, 64}) {
    INFO("micro-batch " << mbs);
    Layout off = tp4(mbs), on = tp4(mbs);
    on.tp_overlap_backward = true;
    const Estimate a = estimate(m, net, off), b = estimate(m, net, on);
    CHECK(b.time.compute == Approx(a.time.compute));
    const double M = mbs * 256.0;
    const double ar = net.seconds(CollectiveOp::all_reduce, g, 2 * M * 512);
    const double wgrad = 2 * M * (3 * 512 / 4) * 512 / 100e12 + 2 * M * (2048 / 4) * 512 / 100e12;
    const double per_layer = std::min(2 * ar, wgrad);
    CHECK(a.time.tp_comm - b.time.tp_comm == Approx(a.micro_batches * 8 * per_layer).epsilon(1e-6));
  }
  // With sequence parallelism the hidden collectives are the two reduce-scatters.
  Cluster slow = c;
  slow.peak_tflops_bf16 = 0.1;  // GEMMs far longer than any collective: all of it hides
  const CollectiveModel snet(slow);
  Layout off = tp4(4), on = tp4(4);
  off.sequence_parallel = on.sequence_parallel = true;
  on.tp_overlap_backward = true;
  const Estimate a = estimate(m, snet, off), b = estimate(m, snet, on);
  const double rs = snet.seconds(CollectiveOp::reduce_scatter, g, 2 * 4 * 256.0 * 512);
  CHECK(a.time.tp_comm - b.time.tp_comm == Approx(a.micro_batches * 8 * 2 * rs).epsilon(1e-6));
}

TEST_CASE("the optimizer streams 54 bytes per parameter with fp16 gradients, 38 with fp32 ones") {
  Cluster c = round_cluster();
  c.kernel_overhead_us = 0;
  const ModelShape m = small_model();
  const CollectiveModel net(c);
  Layout half;
  half.precision = Precision::fp16;
  half.grad_reduce_fp32 = false;
  Layout full = half;
  full.grad_reduce_fp32 = true;
  const double params = total_parameters(m);
  CHECK(estimate(m, net, half).time.optimizer == Approx(params * 54 / 1000e9).epsilon(1e-3));
  CHECK(estimate(m, net, full).time.optimizer == Approx(params * 38 / 1000e9).epsilon(1e-3));
}

TEST_CASE("a layer's GEMMs pay for partial waves on a structured GPU") {
  // The same cluster with and without SM structure: 4 SMs of 128 x 128 tiles. h 512 at tp 4 gives
  // N = 384 for QKV (3 tiles of columns); M = 256 tokens is 2 rows -> 6 tiles -> 2 waves of 4: 75%.
  Cluster flat = round_cluster();
  flat.memory_gbps = 1e12;
  flat.kernel_overhead_us = 0;
  Cluster waves = flat;
  waves.sm_count = 4;
  waves.gemm_tile_m = waves.gemm_tile_n = 128;
  const GemmModel gm = GemmModel::for_cluster(waves, 100e12);
  CHECK(gm.efficiency({256, 384, 512, 1}) == Approx(0.75));
  const ModelShape m = small_model();
  const Estimate a = estimate(m, CollectiveModel(flat), tp4(1)), b = estimate(m, CollectiveModel(waves), tp4(1));
  // QKV forward loses 25%; the other shapes (backward ones transposed: dgrad 256 x 512 over K = 384,
  // wgrad 384 x 512 over the tokens) lose less: the layer as a whole about 5%.
  CHECK(b.time.compute > a.time.compute * 1.04);
}

TEST_CASE("fused attention runs at its own measured fraction of peak when the cluster gives one") {
  Cluster c = round_cluster();
  c.memory_gbps = 1e9;  // GB/s: nothing memory bound
  const ModelShape m = small_model();  // 8 layers, h 512, s 256, batch 64
  Layout l;
  l.micro_batch = 4;
  const Estimate base = estimate(m, CollectiveModel(c), l);
  c.attention_efficiency = 0.25;
  const Estimate slow = estimate(m, CollectiveModel(c), l);
  // 4 b s^2 h forward and 2.5x that backward per layer and micro-batch, now at 25 instead of 100 TFLOP/s.
  const double flops = 3.5 * 4 * 4 * 256.0 * 256 * 512;
  CHECK(slow.time.compute - base.time.compute ==
        Approx(base.micro_batches * 8 * flops * (1 / 25e12 - 1 / 100e12)).epsilon(1e-9));
  c.attention_efficiency = 1.5;
  CHECK_THROWS_WITH(validate(c), Catch::Contains("attention_efficiency"));
}

TEST_CASE("the runtime's copies are their bytes at the copy rate") {
  Cluster c = round_cluster();
  c.memory_gbps = 1e9;   // everything else negligible
  c.copy_gbps = 10;      // 10 GB/s
  const ModelShape m = small_model();
  const double h = 512, f = 2048, e = 4, b = 4, M = b * 256;
  Layout l;
  l.precision = Precision::fp32;
  l.micro_batch = 4;
  Layout on = l;
  on.runtime_copies = true;
  const CollectiveModel net(c);
  // Per layer: input copy 2eMh, bias fills eM(3h+f), two bias adds 4eMh forward; bias-gradient
  // sums eM(3h+f) and the zeroed dK, dV 2eMh backward.
  const double layer = 8 * e * M * h + 2 * e * M * (3 * h + f);
  {
    const Estimate a = estimate(m, net, l), r = estimate(m, net, on);
    // One rank: the embedding's extra passes (2 + 3) e M h and the head's gradient hand-over 2 e M h.
    const double bytes = 8 * layer + 7 * e * M * h;
    CHECK(r.time.compute - a.time.compute == Approx(a.micro_batches * bytes / 10e9).epsilon(1e-6));
  }
  {
    l.pp = on.pp = 2;
    ModelShape big_head = m;
    big_head.vocab = 32768;  // the head's stage stays the slowest either way
    const Estimate a = estimate(big_head, net, l), r = estimate(big_head, net, on);
    // The last stage (the head's, the slowest): 4 layers, its input boundary (one copy of
    // 2 e M h forward, one backward) and the head's hand-over.
    const double bytes = 4 * layer + 2 * 2 * e * M * h + 2 * e * M * h;
    CHECK(r.time.compute - a.time.compute == Approx(a.micro_batches * bytes / 10e9).epsilon(1e-6));
  }
}

TEST_CASE("an unfused vocabulary-parallel cross-entropy streams 24 more bytes per logit") {
  Cluster c = round_cluster();
  c.memory_gbps = 1e9;  // 1 GB/s at the cluster's streaming efficiency: the loss dominates
  const ModelShape m = small_model();
  Layout fused;
  fused.precision = Precision::bf16;
  fused.tp = 4;
  fused.micro_batch = 4;
  Layout unfused = fused;
  unfused.fused_cross_entropy = false;
  const CollectiveModel net(c);
  const Estimate a = estimate(m, net, fused), b = estimate(m, net, unfused);
  // Forward (e + 36) against (e + 16), backward (e + 12) against (e + 8): 24 bytes per logit of the
  // rank's M x V / t shard, per micro-batch, at the streaming rate.
  const double logits = 4.0 * m.seq * m.vocab / 4;
  const double rate = c.memory_gbps * 1e9 * c.memory_efficiency;
  CHECK(b.time.compute - a.time.compute == Approx(a.micro_batches * 24 * logits / rate).epsilon(1e-6));
}

TEST_CASE("ranks beyond the cores time-slice: the node's busy time over its cores bounds the step") {
  Cluster c = round_cluster();
  c.nodes = 1;
  c.memory_gbps = 1e9;
  const ModelShape m = small_model();
  Layout l;
  l.dp = 4;
  l.micro_batch = 4;
  const Estimate own = estimate(m, CollectiveModel(c), l);
  CHECK(own.time.core_sharing == 0);
  // 4 data-parallel ranks on 2 cores: nobody waits, so the step is the 4 ranks' busy time over 2
  // cores: twice the compute and optimizer time of one rank at a full core.
  c.cores_per_node = 2;
  const Estimate shared = estimate(m, CollectiveModel(c), l);
  const double busy = own.time.compute + own.time.tp_comm + own.time.pp_comm + own.time.optimizer;
  CHECK(shared.seconds_per_iteration == Approx(std::max(own.seconds_per_iteration, 4 * busy / 2)).epsilon(1e-9));
  CHECK(shared.time.core_sharing > 0);
  // A pipeline's bubble is idle time the other ranks on the core use: pp 2 x tp 2 on 2 cores costs
  // less than twice its full-core step, and at least the busy time over the cores.
  Layout pipe;
  pipe.tp = 2;
  pipe.pp = 2;
  pipe.micro_batch = 4;
  c.cores_per_node = 0;
  const Estimate full = estimate(m, CollectiveModel(c), pipe);
  c.cores_per_node = 2;
  const Estimate sliced = estimate(m, CollectiveModel(c), pipe);
  CHECK(full.time.bubble > 0);
  CHECK(sliced.seconds_per_iteration < 2 * full.seconds_per_iteration);
  CHECK(sliced.seconds_per_iteration > full.seconds_per_iteration);
  c.cores_per_node = -1;
  CHECK_THROWS_WITH(validate(c), Catch::Contains("cores_per_node"));
}

TEST_CASE("Megatron-Core's DDP buckets: the embedding's bucket is reduced after, and gathered before, the compute") {
  const Cluster c = round_cluster();
  const ModelShape m = small_model();  // 8 layers, h 512, V 1024, s 256, batch 64, learned positions
  const CollectiveModel net(c);
  Layout off;
  off.precision = Precision::bf16;
  off.grad_reduce_fp32 = false;
  off.dp = 8;
  off.micro_batch = 8;  // one micro-batch: the whole reduction would hide behind its backward
  off.zero = 1;
  off.dp_overlap = true;
  off.dp_param_gather_overlap = true;
  Layout on = off;
  on.dp_mcore_buckets = true;
  const Estimate a = estimate(m, net, off), b = estimate(m, net, on);
  CHECK(b.time.compute == Approx(a.time.compute));
  // Rank 0's last bucket holds the word embedding and the position table (bf16, 2 bytes each):
  // its reduce-scatter starts after the last backward kernel, its all-gather before the first forward.
  const GroupPlacement g = place_group(c, 8, 1);
  const double emb_bytes = 2.0 * (1024 * 512 + 256 * 512);
  const double tail = net.seconds(CollectiveOp::reduce_scatter, g, emb_bytes) +
                      net.seconds(CollectiveOp::all_gather, g, emb_bytes);
  CHECK(tail > 0);
  CHECK(b.time.dp_comm - a.time.dp_comm == Approx(tail).epsilon(1e-9));

  // Pipeline ranks after the first keep one bucket: their reduction starts after their own last
  // backward and can hide only behind the drain of the ranks before them.
  Cluster slow = c;
  slow.intra_gbps = 1;  // the reduction outlasts the backward
  const CollectiveModel slow_net(slow);
  // Without the position table rank 1 holds the most parameters (its final LayerNorm), so its
  // reduction, no longer hidden behind its own backward, becomes the exposed one.
  ModelShape m2 = m;
  m2.learned_positions = false;
  Layout off2 = off, on2 = on;
  off2.pp = on2.pp = 2;
  off2.dp = on2.dp = 4;
  off2.micro_batch = on2.micro_batch = 4;
  const Estimate a2 = estimate(m2, slow_net, off2), b2 = estimate(m2, slow_net, on2);
  CHECK(b2.time.dp_comm > a2.time.dp_comm);
}

TEST_CASE("Megatron-LM r0.8 overlaps pipeline sends only in the interleaved schedule") {
  const Cluster c = round_cluster();
  const ModelShape m = small_model();  // 8 layers
  const CollectiveModel net(c);
  Layout l;
  l.precision = Precision::bf16;
  l.pp = 2;
  l.micro_batch = 4;
  l.pp_overlap = true;
  Layout only = l;
  only.pp_overlap_interleaved_only = true;
  // 1F1B: the flag puts the sends back on the critical path, as without overlap.
  Layout none = l;
  none.pp_overlap = false;
  const Estimate hidden = estimate(m, net, l), waits = estimate(m, net, only), off = estimate(m, net, none);
  CHECK(hidden.time.pp_comm == 0);
  CHECK(waits.time.pp_comm > 0);
  CHECK(waits.time.pp_comm == Approx(off.time.pp_comm));
  CHECK(waits.seconds_per_iteration == Approx(off.seconds_per_iteration));
  // Interleaved: still hidden.
  for (Layout* x : {&l, &only}) {
    x->schedule = Schedule::interleaved;
    x->vpp = 2;
  }
  CHECK(estimate(m, net, only).time.pp_comm == 0);
  CHECK(estimate(m, net, only).seconds_per_iteration == Approx(estimate(m, net, l).seconds_per_iteration));
}

TEST_CASE("an overlapped data-parallel collective holds SMs from the kernels beside it") {
  Cluster c = round_cluster();
  c.peak_tflops_bf16 /= 1e4;  // slow kernels, so that both collectives hide behind them
  c.memory_gbps /= 1e4;
  const ModelShape m = small_model();
  Layout l;
  l.precision = Precision::bf16;
  l.grad_reduce_fp32 = false;
  l.dp = 8;
  l.micro_batch = 8;  // one micro-batch: reduction beside the backward, gather beside the forward
  l.zero = 1;
  l.dp_overlap = true;
  l.dp_param_gather_overlap = true;
  c.comm_sm_fraction = 0;
  const CollectiveModel net0(c);
  const Estimate a = estimate(m, net0, l);
  REQUIRE(a.time.dp_comm < 1e-3 * a.seconds_per_iteration);  // both collectives hidden
  c.comm_sm_fraction = 0.25;
  const CollectiveModel net(c);
  const Estimate b = estimate(m, net, l);
  // The whole reduce-scatter and all-gather (bf16: 2 bytes per parameter each) run beside compute.
  const GroupPlacement g = place_group(c, 8, 1);
  const double bytes = b.memory.weights;
  const double beside = net.seconds(CollectiveOp::reduce_scatter, g, bytes) + net.seconds(CollectiveOp::all_gather, g, bytes);
  CHECK(b.time.dp_comm - a.time.dp_comm == Approx(0.25 * beside).epsilon(1e-9));
  CHECK(b.time.compute == Approx(a.time.compute));
  // The kernels are not slowed without overlap: the collectives then run alone.
  Layout serial = l;
  serial.dp_overlap = false;
  serial.dp_param_gather_overlap = false;
  CHECK(estimate(m, net, serial).seconds_per_iteration == Approx(estimate(m, net0, serial).seconds_per_iteration));
  c.comm_sm_fraction = 1;
  CHECK_THROWS_WITH(validate(c), Catch::Contains("comm_sm_fraction must be in [0, 1), got 1"));
}
