// ZeRO-2/3 and HSDP in the planner: memory per rank from the formulas (parameter counts worked
// out here from the model shape), communication bytes against ZeRO-1, HSDP's groups inside a node,
// the search's ZeRO knobs and its "only ZeRO-3 fits" line, and the parsing of old and new spellings.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <array>

#include "plan/fixtures.h"
#include "triax/core/error.h"
#include "triax/plan/planner.h"
#include "triax/plan/report.h"
#include "triax/plan/tune.h"

using namespace triax::plan;
using Catch::Matchers::Contains;
using triax::plan::test::round_cluster;
using triax::plan::test::small_model;

namespace {

// small_model() is GPT-2 style: LayerNorm (weight, bias), biases, ffn 4h, learned positions, tied head.
struct GptCounts {
  double layer, embedding, head, total;
};
GptCounts gpt_counts(const ModelShape& m) {
  const double h = m.hidden;
  GptCounts n{};
  n.layer = 12 * h * h + 13 * h;          // QKV 3h^2+3h, proj h^2+h, fc1 4h^2+4h, fc2 4h^2+h, 2 LN 4h
  n.embedding = double(m.vocab) * h + double(m.seq) * h;  // token and position tables
  n.head = 2 * h;                         // tied: only the final LayerNorm
  n.total = m.layers * n.layer + n.embedding + n.head;
  return n;
}

// A llama-style block on tp ranks: SwiGLU, RMSNorm, RoPE, no biases, untied head, 2 kv heads.
ModelShape llama_small() {
  ModelShape m;
  m.name = "llama-small";
  m.layers = 4;
  m.hidden = 256;
  m.heads = 8;
  m.kv_heads = 2;
  m.ffn = 512;
  m.vocab = 1000;
  m.seq = 128;
  m.global_batch = 64;
  m.swiglu = m.rmsnorm = m.rope = true;
  m.bias = m.learned_positions = m.tied_embeddings = false;
  return m;
}

Layout one_micro_batch(const ModelShape& m, int dp, int zero) {
  Layout l;
  l.dp = dp;
  l.micro_batch = int(m.global_batch / dp);  // one micro-batch per step
  l.zero = zero;
  return l;
}

}  // namespace

TEST_CASE("zero 3 memory per rank: params / d plus two gathered units, gradients alike, optimizer / d") {
  const CollectiveModel net(round_cluster());
  const ModelShape m = small_model();
  const GptCounts n = gpt_counts(m);
  REQUIRE(n.total == Approx(total_parameters(m)).epsilon(1e-12));
  // The largest two neighbouring units: embedding + layer 1, or two layers (here: two layers).
  const double pair = std::max(n.embedding + n.layer, 2 * n.layer);
  Layout l;
  l.dp = 4;
  l.zero = 3;
  Estimate e = estimate(m, net, l);
  CHECK(e.memory.weights == Approx(2 * n.total / 4 + 2 * pair).epsilon(1e-12));
  CHECK(e.memory.gradients == Approx(4 * n.total / 4 + 4 * pair).epsilon(1e-12));
  CHECK(e.memory.optimizer == Approx(12 * n.total / 4).epsilon(1e-12));
  l.zero = 2;  // weights whole again
  e = estimate(m, net, l);
  CHECK(e.memory.weights == Approx(2 * n.total).epsilon(1e-12));
  CHECK(e.memory.gradients == Approx(4 * n.total / 4 + 4 * pair).epsilon(1e-12));
  l.zero = 1;
  e = estimate(m, net, l);
  CHECK(e.memory.gradients == Approx(4 * n.total).epsilon(1e-12));
  CHECK(e.memory.optimizer == Approx(12 * n.total / 4).epsilon(1e-12));
  // HSDP: dp 8 in groups of 4 shards over d = 4.
  l.dp = 8;
  l.zero = 3;
  l.zero_shard = 4;
  e = estimate(m, net, l);
  CHECK(e.memory.weights == Approx(2 * n.total / 4 + 2 * pair).epsilon(1e-12));
  CHECK(e.memory.optimizer == Approx(12 * n.total / 4).epsilon(1e-12));
  l.zero_shard = 0;
  CHECK(estimate(m, net, l).memory.optimizer == Approx(12 * n.total / 8).epsilon(1e-12));
  // A large vocabulary: the embedding outweighs a layer, the pair in flight is embedding + layer 1.
  ModelShape big_vocab = m;
  big_vocab.vocab = 8192;
  const GptCounts nv = gpt_counts(big_vocab);
  REQUIRE(nv.embedding > nv.layer);
  CHECK(estimate(big_vocab, net, l).memory.weights == Approx(2 * nv.total / 8 + 2 * (nv.embedding + nv.layer)).epsilon(1e-12));
}

TEST_CASE("zero 3 memory with tp and pp: each stage shards its own tp-local units") {
  const CollectiveModel net(round_cluster());
  const ModelShape m = llama_small();
  const double h = m.hidden, f = m.ffn, t = 2, V = m.vocab;
  const double qkv = h + 2 * m.kv_heads * (h / m.heads);
  const double layer = (h * qkv + h * h + 3 * h * f) / t + 2 * h;  // matrices split, 2 RMSNorm weights whole
  const double emb = V * h / t, head = V * h / t + h;              // untied head + final RMSNorm
  const double stage0 = 2 * layer + emb, stage1 = 2 * layer + head;
  Layout l;
  l.tp = 2;
  l.pp = 2;
  l.dp = 4;
  l.zero = 3;
  const Estimate e = estimate(m, net, l);
  const bool first = e.memory.stage == 0;
  const double P = first ? stage0 : stage1;
  const double pair = std::max(2 * layer, first ? emb + layer : layer + head);
  CHECK(e.memory.weights == Approx(2 * P / 4 + 2 * pair).epsilon(1e-12));
  CHECK(e.memory.gradients == Approx(4 * P / 4 + 4 * pair).epsilon(1e-12));
  CHECK(e.memory.optimizer == Approx(12 * P / 4).epsilon(1e-12));
}

TEST_CASE("zero 2 and 3 move more bytes than zero 1: 2 gathers + 1 reduce-scatter per micro-batch") {
  const CollectiveModel net(round_cluster());
  const ModelShape m = small_model();
  const double P = gpt_counts(m).total;
  Layout l = one_micro_batch(m, 4, 1);
  l.grad_reduce_fp32 = false;  // gradients and weights both 2 bytes: the ratio is the count of collectives
  const DpTraffic z1 = estimate(m, net, l).dp_traffic;
  CHECK(z1.reduce_scatter == Approx(2 * P).epsilon(1e-12));
  CHECK(z1.all_gather == Approx(2 * P).epsilon(1e-12));
  l.zero = 3;
  const DpTraffic z3 = estimate(m, net, l).dp_traffic;
  CHECK(z3.total() / z1.total() == Approx(1.5).epsilon(1e-12));
  CHECK(z3.all_gather == Approx(2 * 2 * P).epsilon(1e-12));
  l.recompute = Recompute::full;  // the recomputation gathers every unit a third time
  CHECK(estimate(m, net, l).dp_traffic.all_gather == Approx(3 * 2 * P).epsilon(1e-12));
  l.recompute = Recompute::none;
  l.zero = 2;
  CHECK(estimate(m, net, l).dp_traffic.total() / z1.total() == Approx(1.0).epsilon(1e-12));
  // fp32 gradients: ZeRO-3 (2 x 2 + 4) against ZeRO-1 (2 + 4) bytes per parameter.
  l.grad_reduce_fp32 = true;
  l.zero = 3;
  const double z3_fp32 = estimate(m, net, l).dp_traffic.total();
  l.zero = 1;
  CHECK(z3_fp32 / estimate(m, net, l).dp_traffic.total() == Approx(8.0 / 6).epsilon(1e-12));
  // m micro-batches: ZeRO-2 reduce-scatters m times and gathers once; ZeRO-1 once each.
  l.micro_batch = 1;
  const long mb = micro_batches(m, l);
  REQUIRE(mb == m.global_batch / 4);
  l.zero = 2;
  const DpTraffic z2m = estimate(m, net, l).dp_traffic;
  CHECK(z2m.reduce_scatter == Approx(mb * 4 * P).epsilon(1e-12));
  CHECK(z2m.all_gather == Approx(2 * P).epsilon(1e-12));
  l.zero = 3;
  CHECK(estimate(m, net, l).dp_traffic.all_gather == Approx(mb * 2 * 2 * P).epsilon(1e-12));
  l.zero = 0;
  CHECK(estimate(m, net, l).dp_traffic.all_reduce == Approx(4 * P).epsilon(1e-12));
}

TEST_CASE("zero 3 exposes its gathers per micro-batch; zero 1 once per step") {
  Cluster c = round_cluster();
  c.intra_gbps = 1;  // a slow link: the gathers outlast every unit's compute
  const CollectiveModel net(c);
  const ModelShape m = small_model();
  Layout l = one_micro_batch(m, 4, 3);
  const double z3_one = estimate(m, net, l).time.dp_comm;
  l.micro_batch /= 4;  // four micro-batches
  const double z3_four = estimate(m, net, l).time.dp_comm;
  CHECK(z3_four == Approx(4 * z3_one).epsilon(0.1));
  l.zero = 1;
  const double z1_four = estimate(m, net, l).time.dp_comm;
  CHECK(z1_four < z3_four / 3);
}

TEST_CASE("HSDP: reduce-scatters and gathers inside the node, the shards all-reduced across nodes") {
  const Cluster c = round_cluster();  // 8 GPUs per node
  const CollectiveModel net(c);
  const ModelShape m = small_model();
  const double P = gpt_counts(m).total;
  Layout l = one_micro_batch(m, 16, 2);
  l.tp = 2;  // 32 GPUs: dp 16 over 4 nodes, 4 dp ranks per node
  l.dp_overlap = false;
  l.zero_shard = 4;
  const Estimate e = estimate(m, net, l);
  const DpTraffic& tr = e.dp_traffic;
  CHECK(tr.shard_group.ranks == 4);
  CHECK(tr.shard_group.nodes == 1);
  CHECK(tr.replica_group.ranks == 4);
  CHECK(tr.replica_group.nodes == 4);
  const double layer = gpt_counts(m).layer, h = m.hidden;
  const double P2 = P - m.layers * layer + m.layers * ((12 * h * h + 7 * h) / 2 + 6 * h) -
                    double(m.vocab) * h / 2;  // tp 2: matrices and column biases split, the table too
  CHECK(tr.all_reduce == Approx(4 * P2 / 4).epsilon(1e-12));
  // Exposed without overlap: reduce-scatter in the node + all-reduce of the 1/4 shard across nodes +
  // the gather after the step, + the gradient-norm all-reduces over the world.
  const double norm = 2 * net.seconds(CollectiveOp::all_reduce, place_group(c, 32, 1), 4);
  CHECK(e.time.dp_comm == Approx(net.seconds(CollectiveOp::reduce_scatter, tr.shard_group, 4 * P2) +
                                 net.seconds(CollectiveOp::all_reduce, tr.replica_group, 4 * P2 / 4) +
                                 net.seconds(CollectiveOp::all_gather, tr.shard_group, 2 * P2) + norm)
                              .epsilon(1e-9));
  l.zero_shard = 0;  // one group of all 16: across the 4 nodes
  CHECK(estimate(m, net, l).dp_traffic.shard_group.nodes == 4);
  CHECK(estimate(m, net, l).dp_traffic.all_reduce == 0);
}

TEST_CASE("layout rules and spellings of the ZeRO level") {
  Layout l;
  l.dp = 8;
  parse_zero_spec("zero1", l);
  CHECK(l.zero == 1);
  CHECK(describe(l).ends_with(" zero1"));
  parse_zero_spec("zero3 hsdp4", l);
  CHECK(l.zero == 3);
  CHECK(l.zero_shard == 4);
  CHECK(describe(l).ends_with(" zero3 hsdp4"));
  parse_zero_spec("2", l);
  CHECK(l.zero == 2);
  CHECK_FALSE(zero_problem(l));
  CHECK_THROWS_WITH(parse_zero_spec("zero7", l), Contains("'zero7': expected zeroN with N from 0 to 3"));
  CHECK_THROWS_WITH(parse_zero_spec("zero3 fsdp", l), Contains("unknown token 'fsdp'"));
  l.zero = 1;
  CHECK_THAT(zero_problem(l).value_or(""), Contains("zero shard size 4 < dp 8) needs zero 2 or 3"));
  l.zero = 3;
  l.zero_shard = 3;
  CHECK_THAT(zero_problem(l).value_or(""), Contains("zero shard size 3 does not divide dp 8"));
  l.zero_shard = 8;  // a group of all dp: plain ZeRO-3, no hsdp in the summary
  CHECK_FALSE(zero_problem(l));
  CHECK(describe(l).ends_with(" zero3"));
}

TEST_CASE("search: ZeRO levels and HSDP sizes in the space, restricted by zero or the old zero1 knob") {
  const CollectiveModel net(round_cluster());
  ModelShape m = small_model();
  m.global_batch = 16;
  SearchSpace sp;
  sp.gpus = 16;  // 2 nodes: HSDP groups of one node's dp ranks exist
  sp.top_k = 1000;
  const SearchResult all = search(m, net, sp);
  bool hsdp = false;
  std::array<bool, 4> seen{};
  for (const auto& e : all.best) {
    seen[e.layout.zero] = true;
    hsdp = hsdp || (e.layout.zero_shard > 0 && e.layout.zero_shard < e.layout.dp);
    if (e.layout.zero_shard > 0) CHECK(e.layout.zero >= 2);
  }
  CHECK((seen[0] && seen[1] && seen[2] && seen[3]));
  CHECK(hsdp);
  sp.zero1 = {true};
  for (const auto& e : search(m, net, sp).best) CHECK(e.layout.zero == 1);
  sp.zero = {3};
  sp.zero_shard = {0};
  const SearchResult z3 = search(m, net, sp);
  REQUIRE_FALSE(z3.best.empty());
  for (const auto& e : z3.best) CHECK((e.layout.zero == 3 && e.layout.zero_shard == 0));
}

TEST_CASE("search: a model that fits only with ZeRO-3 gets a ZeRO-3 layout and the reason") {
  const CollectiveModel net(cluster_preset("dgx-h100"));
  const ModelShape m = model_preset("llama3-70b");
  SearchSpace sp;
  sp.gpus = 64;
  sp.tp = {1};
  sp.cp = {1};  // the sequence whole on every rank (with CP the leanest ZeRO-2 layout is cp64)
  sp.pp = {1};
  const SearchResult r = search(m, net, sp);
  REQUIRE_FALSE(r.best.empty());
  CHECK(r.best.front().layout.zero == 3);
  CHECK(r.fitting_by_zero[0] + r.fitting_by_zero[1] + r.fitting_by_zero[2] == 0);
  const auto why = zero_explanation(r);
  REQUIRE(why);
  CHECK_THAT(*why, Contains("only ZeRO-3 fits: the leanest layout below ZeRO-3 (tp1 pp1 dp64"));
  CHECK_THAT(*why, Contains("GiB per GPU of 80.0 GiB (parameters"));
  CHECK_THAT(format_search(r), Contains("only ZeRO-3 fits"));
  // The leanest layout below ZeRO-3 indeed does not fit, and its numbers are the line's.
  const Estimate& lean = *r.leanest_by_zero[2];
  CHECK_FALSE(lean.memory.fits());
  CHECK_THAT(*why, Contains(fmt::format("needs {:.1f} GiB", lean.memory.total() / (1024.0 * 1024 * 1024))));
  // A search at ZeRO-3 alone has nothing below to compare with: no line.
  sp.zero = {3};
  CHECK_FALSE(zero_explanation(search(m, net, sp)));
}

TEST_CASE("tune: a layout over memory is offered the ZeRO level that fits") {
  const CollectiveModel net(cluster_preset("dgx-h100"));
  const ModelShape m = model_preset("llama3-8b");
  Layout cur;
  cur.dp = 8;
  cur.micro_batch = 1;
  REQUIRE_FALSE(estimate(m, net, cur).memory.fits());
  const TuneResult r = tune(m, net, cur);
  bool offered = false;
  for (const auto& c : r.options) {
    if (!c.change.starts_with("ZeRO 0 -> ")) continue;
    offered = true;
    CHECK(c.estimate.layout.zero >= 2);
    CHECK(c.estimate.memory.fits());
  }
  CHECK(offered);
}
