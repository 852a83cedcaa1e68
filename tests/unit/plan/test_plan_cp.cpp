// Context parallelism in the planner: activation memory per rank over cp, the K/V ring's volume per
// layer (only the key/value heads travel), the overlap of the p2p ring against the unoverlapped
// all-gather variant, the CP group's placement, the search choosing CP where nothing else fits (and
// saying so), and the layout text and the published-runs table with and without the cp column.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <set>

#include "plan/fixtures.h"
#include "triax/core/error.h"
#include "triax/plan/planner.h"
#include "triax/plan/published_runs.h"
#include "triax/plan/report.h"

using namespace triax::plan;
using Catch::Contains;
using triax::plan::test::round_cluster;
using triax::plan::test::ScratchDir;

namespace {

// A Llama-style block (SwiGLU, RMSNorm, RoPE, no biases) with grouped-query attention, sized so the
// sequence splits into 2 x 8 chunks and every tp below 8 divides the heads and kv heads.
ModelShape gqa_model() {
  ModelShape m;
  m.name = "gqa";
  m.layers = 8;
  m.hidden = 1024;
  m.heads = 16;
  m.kv_heads = 4;
  m.ffn = 2816;
  m.vocab = 4096;
  m.seq = 4096;
  m.global_batch = 16;
  m.swiglu = m.rmsnorm = m.rope = true;
  m.bias = m.learned_positions = false;
  return m;
}

Layout layout(int tp, int cp, int dp) {
  Layout l;
  l.tp = tp;
  l.cp = cp;
  l.dp = dp;
  return l;
}

}  // namespace

TEST_CASE("cp: a layer's stored activations per rank fall as 1/cp") {
  const ModelShape m = gqa_model();
  // Written out from the shape (Korthikanti et al.'s terms for a SwiGLU block, fused attention, no
  // dropout, no SP): per token the two norm inputs, QKV and fc1 inputs (4 e h), Q K V and the
  // projection input (e (h + 2 kv dh + h)), SwiGLU's input, gate-up and output (3 e f), and the fp32
  // log-sum-exp of every head (4 a); a CP rank holds seq / cp tokens.
  const double e = 2, h = m.hidden, f = m.ffn, a = m.heads, dh = h / a, kv = m.kv_heads;
  const double per_token = 4 * e * h + e * (h + 2 * kv * dh + h) + 3 * e * f + 4 * a;
  double one = 0;
  for (int cp : {1, 2, 4, 8}) {
    INFO("cp " << cp);
    const double bytes = layer_activation_bytes(m, layout(1, cp, 1));
    CHECK(bytes == Approx(per_token * m.seq / cp).epsilon(1e-12));
    if (cp == 1) one = bytes;
    CHECK(bytes / one == Approx(1.0 / cp).epsilon(1e-12));
  }
  // The whole estimate: the activations of a rank (layers in flight, the logits of the loss) halve too.
  const CollectiveModel net(round_cluster());
  const Estimate e1 = estimate(m, net, layout(1, 1, 4)), e2 = estimate(m, net, layout(1, 2, 2)),
                 e4 = estimate(m, net, layout(1, 4, 1));
  CHECK(e2.memory.activations / e1.memory.activations == Approx(0.5).epsilon(1e-9));
  CHECK(e4.memory.activations / e1.memory.activations == Approx(0.25).epsilon(1e-9));
  // The K/V receive buffers (two blocks in flight) are in the communication buffers.
  CHECK(e2.memory.comm_buffers > e1.memory.comm_buffers);
  // The same model FLOPs, spread over the same GPUs: the job's work does not change with cp.
  CHECK(e2.flops.model == e1.flops.model);
}

TEST_CASE("cp: the ring's bytes per layer are the rank's K/V block, cp - 1 times, twice over backward") {
  const ModelShape m = gqa_model();
  const CollectiveModel net(round_cluster());
  for (int tp : {1, 2, 4}) {
    for (int cp : {2, 4}) {
      INFO("tp " << tp << " cp " << cp);
      Layout l = layout(tp, cp, 1);
      l.micro_batch = 2;
      const CpExchange x = cp_exchange(m, l, net, 1e-3, 2.5e-3);
      // 2 (K and V) x kv_heads / tp x head_dim x seq / cp tokens x micro-batch x 2 bytes.
      const double block = 2.0 * (4 / tp) * 64 * (4096 / cp) * 2 * 2;
      CHECK(x.block_bytes == block);
      CHECK(x.fwd_bytes == (cp - 1) * block);
      CHECK(x.bwd_bytes == 2 * (cp - 1) * block);
      CHECK(x.ring.ranks == cp);
    }
  }
  // The step's total in the estimate: every layer of the rank, every micro-batch, forward and backward.
  const Layout l = layout(2, 2, 2);
  const Estimate e = estimate(m, net, l);
  const CpExchange x = e.cp_traffic.per_layer;
  CHECK(e.cp_traffic.bytes == Approx(double(e.micro_batches) * m.layers * (x.fwd_bytes + x.bwd_bytes)));
  // Nothing at cp 1.
  const Estimate e1 = estimate(m, net, layout(2, 1, 4));
  CHECK(e1.cp_traffic.bytes == 0);
  CHECK(e1.time.cp_comm == 0);
}

TEST_CASE("cp: with grouped-query attention only the key/value heads travel") {
  ModelShape gqa = gqa_model(), mha = gqa_model();
  mha.kv_heads = 0;  // as many as heads: 16
  const CollectiveModel net(round_cluster());
  const Layout l = layout(2, 4, 1);
  const CpExchange g = cp_exchange(gqa, l, net, 0, 0), a = cp_exchange(mha, l, net, 0, 0);
  CHECK(g.block_bytes / a.block_bytes == Approx(4.0 / 16));
  CHECK(g.fwd_bytes / a.fwd_bytes == Approx(4.0 / 16));
  CHECK(g.bwd_seconds < a.bwd_seconds);
}

TEST_CASE("cp: the p2p ring hides behind the block's attention, the all-gather variant does not") {
  const ModelShape m = gqa_model();
  const CollectiveModel net(round_cluster());
  Layout ring = layout(1, 4, 1), gather = ring;
  gather.cp_comm = CpComm::allgather;
  // Attention long enough to cover every step: the ring is hidden, the all-gather fully exposed.
  const CpExchange r = cp_exchange(m, ring, net, 10, 25), g = cp_exchange(m, gather, net, 10, 25);
  REQUIRE(r.fwd_seconds > 0);
  CHECK(r.fwd_exposed == 0);
  CHECK(r.bwd_exposed == 0);
  CHECK(g.fwd_seconds > 0);
  CHECK(g.fwd_exposed == g.fwd_seconds);
  CHECK(g.bwd_exposed == g.bwd_seconds);
  // No attention to hide behind: each of the cp - 1 steps is exposed whole.
  const CpExchange bare = cp_exchange(m, ring, net, 0, 0);
  CHECK(bare.fwd_exposed == Approx(bare.fwd_seconds));
  // Attention shorter than a step: each step exposed by the difference, (cp - 1) (step - attn / cp).
  const double step = bare.fwd_seconds / 3, attn = 2 * step;  // attn / cp = step / 2
  CHECK(cp_exchange(m, ring, net, attn, 0).fwd_exposed == Approx(3 * (step - attn / 4)));
  // Each rank sends cp - 1 blocks forward in both variants; the ring sends K/V and dK/dV backward.
  CHECK(g.fwd_bytes == r.fwd_bytes);
  CHECK(g.bwd_bytes == r.fwd_bytes);
  // In the estimate: the all-gather's time is all exposed, the ring's hidden share is reported.
  const Estimate er = estimate(m, net, ring), eg = estimate(m, net, gather);
  CHECK(eg.time.cp_comm == Approx(eg.cp_traffic.seconds));
  CHECK(eg.cp_traffic.hidden_share() == Approx(0).margin(1e-12));
  CHECK(er.time.cp_comm < er.cp_traffic.seconds);
  CHECK(er.cp_traffic.hidden_share() > 0);
  CHECK_THAT(format_estimate(er), Contains("cp4 p2p per step"));
  CHECK_THAT(describe(eg.layout), Contains("cp4 pp1 dp1 mbs1 1f1b rc=none cp-allgather"));
}

TEST_CASE("cp: the ring stays on NVLink while tp x cp fits in a node, else it crosses the network") {
  const ModelShape m = gqa_model();
  const CollectiveModel net(round_cluster());  // 8 GPUs per node
  CHECK(cp_exchange(m, layout(2, 4, 1), net, 0, 0).ring.nodes == 1);
  CHECK(cp_exchange(m, layout(1, 8, 1), net, 0, 0).ring.nodes == 1);
  const CpExchange cross = cp_exchange(m, layout(4, 4, 1), net, 0, 0);
  CHECK(cross.ring.nodes == 2);
  // Per byte, the crossing ring is slower (10 GB/s NICs against 100 GB/s links in the round cluster).
  const CpExchange inside = cp_exchange(m, layout(2, 4, 1), net, 0, 0);
  CHECK(cross.fwd_seconds / cross.fwd_bytes > inside.fwd_seconds / inside.fwd_bytes);
}

TEST_CASE("cp: weight gradients are reduced, and ZeRO shards taken, over dp x cp") {
  const ModelShape m = gqa_model();
  const CollectiveModel net(round_cluster());
  Layout l = layout(1, 4, 2);
  l.zero = 1;
  const Estimate e = estimate(m, net, l);
  CHECK(e.dp_traffic.shard_group.ranks == 8);
  CHECK(l.shard_size() == 8);
  // Optimizer state sharded over the 8 ranks: the same as dp 8 without cp.
  Layout flat = layout(1, 1, 8);
  flat.zero = 1;
  CHECK(e.memory.optimizer == Approx(estimate(m, net, flat).memory.optimizer));
  // HSDP shard groups must divide dp x cp.
  l.zero = 2;
  l.zero_shard = 4;
  CHECK_FALSE(layout_problem(m, net.cluster(), l));
  l.zero_shard = 3;
  REQUIRE(layout_problem(m, net.cluster(), l));
  CHECK_THAT(*layout_problem(m, net.cluster(), l), Contains("zero shard size 3 does not divide dp*cp 8"));
}

TEST_CASE("cp: layouts whose sequence 2 cp does not divide are refused with the numbers") {
  ModelShape m = gqa_model();
  m.seq = 4080;  // 2 x 16 = 32 does not divide 4080; 2 x 8 = 16 does
  const Cluster c = round_cluster();
  CHECK_FALSE(layout_problem(m, c, layout(1, 8, 1)));
  const auto why = layout_problem(m, c, layout(1, 16, 1));
  REQUIRE(why);
  CHECK_THAT(*why, Contains("cp 16: seq 4080 is not divisible by 2*cp = 32"));
  CHECK_THAT(*layout_problem(m, c, layout(1, 0, 1)), Contains("cp0"));
  Layout spl = layout(4, 8, 1);
  spl.sequence_parallel = true;
  m.seq = 4016;  // 2 x 8 divides it, but tp 4 does not divide the 502 tokens of a CP rank
  REQUIRE(layout_problem(m, c, spl));
  CHECK_THAT(*layout_problem(m, c, spl), Contains("tp 4 does not divide the 502 tokens"));
  CHECK(layout(2, 4, 3).gpus() == 24);
}

TEST_CASE("cp: the search tries CP sizes that divide the GPUs and the sequence, and can be pinned") {
  const ModelShape m = gqa_model();
  const CollectiveModel net(round_cluster());
  SearchSpace sp;
  sp.gpus = 8;
  sp.tp = {1};
  sp.pp = {1};
  sp.micro_batch = {1};
  sp.top_k = 100;
  const SearchResult r = search(m, net, sp);
  std::set<int> cps;
  for (const auto& e : r.best) cps.insert(e.layout.cp);
  CHECK(cps == std::set<int>{1, 2, 4, 8});
  sp.cp = {2};
  for (const auto& e : search(m, net, sp).best) CHECK(e.layout.cp == 2);
  // A CP size the sequence cannot be cut for is not tried by default.
  ModelShape odd = m;
  odd.seq = 4092;  // divisible by 2 x 2, not by 2 x 4 or 2 x 8
  sp.cp.clear();
  cps.clear();
  for (const auto& e : search(odd, net, sp).best) cps.insert(e.layout.cp);
  CHECK(cps == std::set<int>{1, 2});
}

TEST_CASE("cp: llama3-70b at seq 131072 on 64 H100s fits only with CP, and the search says so") {
  const CollectiveModel net(cluster_preset("dgx-h100"));
  ModelShape m = model_preset("llama3-70b");
  m.seq = 131072;
  m.global_batch = 64;
  SearchSpace sp;
  sp.gpus = 64;
  sp.recompute = {Recompute::none};
  sp.top_k = 3;
  const SearchResult r = search(m, net, sp);
  REQUIRE_FALSE(r.best.empty());
  for (const auto& e : r.best) CHECK(e.layout.cp > 1);
  CHECK(r.fitting_without_cp == 0);
  REQUIRE(r.leanest_without_cp);
  CHECK_FALSE(r.leanest_without_cp->memory.fits());
  const auto why = cp_explanation(r);
  REQUIRE(why);
  CHECK_THAT(*why, Contains("only CP fits: the leanest layout without context parallelism (tp"));
  CHECK_THAT(*why, Contains(fmt::format("needs {:.1f} GiB per GPU of 80.0 GiB",
                                        r.leanest_without_cp->memory.total() / (1024.0 * 1024 * 1024))));
  CHECK_THAT(format_search(r), Contains("only CP fits"));
  CHECK(nlohmann::json::parse(search_json(r)).at("search").at("cp_needed").get<std::string>().rfind("only CP fits", 0) ==
        0);
  // At seq 8192 layouts without CP fit: no line.
  m.seq = 8192;
  CHECK_FALSE(cp_explanation(search(m, net, sp)));
}

TEST_CASE("cp: the layout text names cp only when it is used") {
  Layout l = layout(2, 1, 8);
  l.pp = 4;
  CHECK(describe(l) == "tp2 pp4 dp8 mbs1 1f1b rc=none");
  l.cp = 2;
  CHECK(describe(l) == "tp2 cp2 pp4 dp8 mbs1 1f1b rc=none");
  CHECK(parse_cp_comm("allgather") == CpComm::allgather);
  CHECK(to_string(CpComm::p2p) == "p2p");
  CHECK_THROWS_AS(parse_cp_comm("a2a"), triax::ConfigError);
}

TEST_CASE("cp: published-runs tables with and without the cp and ffn columns") {
  const std::string old_header =
      "id,source,where,cluster,software,layers,hidden,heads,vocab,seq,tp,pp,dp,global_batch,micro_batch,vpp,"
      "recompute,sequence_parallel,metric,value,tied_embeddings,kv_heads,options";
  const std::string row = "a,src,w,dgx-h100,megatron-core-2024,32,4096,32,128256,8192,1,1,4,128,1,1,none,0,seconds,12.78,0,8,";
  ScratchDir dir;
  // A table written before the columns: cp 1, ffn 4h, the GPT block.
  const auto old = load_published_runs(dir.write("old.csv", old_header + "\n" + row + "\n"));
  REQUIRE(old.size() == 1);
  CHECK(old[0].cp == 1);
  CHECK(old[0].model.ffn_hidden() == 4 * 4096);
  CHECK(old[0].gpus() == 4);
  CHECK_FALSE(old[0].model.swiglu);
  // The new columns, empty (the defaults) or set; llama-block turns on the Llama block.
  const auto both = load_published_runs(
      dir.write("new.csv", old_header + ",cp,ffn\n" + row + ",,\n" + "b" + row.substr(1) + "llama-block,2,14336\n"));
  REQUIRE(both.size() == 2);
  CHECK(both[0].cp == 1);
  CHECK(both[1].cp == 2);
  CHECK(both[1].gpus() == 8);
  CHECK(both[1].model.ffn_hidden() == 14336);
  CHECK((both[1].model.swiglu && both[1].model.rmsnorm && both[1].model.rope && !both[1].model.bias &&
         !both[1].model.learned_positions));
  const RunPrediction p = predict_run(both[1], CollectiveModel(cluster_preset("dgx-h100")));
  CHECK(p.estimate.layout.cp == 2);
  CHECK(p.estimate.layout.gpus() == 8);
  // A row whose sequence 2 cp does not divide names the column; a short row still counts the header's columns.
  CHECK_THROWS_WITH(load_published_runs(dir.write("bad.csv", old_header + ",cp,ffn\n" + row + "llama-block,3,14336\n")),
                    Contains("bad.csv:2: column cp 3: seq 8192 is not divisible by 2*cp"));
  CHECK_THROWS_WITH(load_published_runs(dir.write("short.csv", old_header + ",cp,ffn\n" + row + "\n")),
                    Contains("short.csv:2: expected 25 columns, got 23"));
}
