// The planner against published runs it was not fitted to (data/validation/published_runs.csv):
// leave-one-out within 5% mean / 10% worst; the table reader's errors; the GEMM wave model.
#include <catch2/catch.hpp>

#include <cmath>
#include <set>

#include "plan/fixtures.h"
#include "triax/core/error.h"
#include "triax/plan/gemm_model.h"
#include "triax/plan/published_runs.h"

using namespace triax::plan;
using triax::plan::test::ScratchDir;

namespace {
const std::string kHeader =
    "id,source,where,cluster,software,layers,hidden,heads,vocab,seq,tp,pp,dp,global_batch,micro_batch,vpp,"
    "recompute,sequence_parallel,metric,value,tied_embeddings,kv_heads,options\n";
const std::string kRow =
    "a,src,Table 1 row 1,selene-a100,megatron-sc21,24,2304,24,51200,2048,1,1,32,512,0,0,full,0,tflops_eq3,137,1,0,\n";
}  // namespace

TEST_CASE("published runs: every row loads with a source and lies on a real cluster") {
  const auto rows = load_published_runs(TRIAX_RUNS_CSV);
  REQUIRE(rows.size() >= 18);
  std::set<std::string> sources;
  for (const auto& r : rows) {
    INFO(r.id);
    CHECK(!r.where.empty());
    sources.insert(r.source);
    CHECK_NOTHROW(cluster_preset(r.cluster));
    CHECK(measured_seconds(r) > 0);
  }
  CHECK(sources.size() >= 2);
  // Eq. 3 turns 137 TFLOP/s of the 1.7B row into its iteration time: 3.53 s.
  CHECK(measured_seconds(rows.front()) == Approx(3.528).epsilon(0.002));
}

namespace {
std::vector<PublishedRun> rows_on(const std::string& cluster, bool on) {
  std::vector<PublishedRun> out;
  for (auto& r : load_published_runs(TRIAX_RUNS_CSV))
    if ((r.cluster == cluster) == on) out.push_back(std::move(r));
  return out;
}
}  // namespace

TEST_CASE("published runs: leave-one-out and held-out-by-source errors within 5% mean and 10% worst on selene-a100") {
  const auto rows = rows_on("selene-a100", true);
  REQUIRE(rows.size() == 18);
  const ValidationReport rep = validate_runs(cluster_preset("selene-a100"), rows);
  INFO(format_validation(rep));
  CHECK(rep.leave_one_out.mean <= 0.05);
  CHECK(rep.leave_one_out.worst <= 0.10);
  CHECK(rep.held_out_source.mean <= 0.05);
  CHECK(rep.held_out_source.worst <= 0.10);
  // The fitted constants are inside their bounds, not stuck on one, and the preset carries them.
  CHECK(rep.fit.gemm_efficiency > 0.5);
  CHECK(rep.fit.gemm_efficiency < 0.95);
  CHECK(rep.fit.gemm_k_overhead > 0);
  CHECK(rep.fit.gemm_k_overhead < 500);
  const Cluster preset = cluster_preset("selene-a100");
  CHECK(preset.gemm_efficiency == Approx(rep.fit.gemm_efficiency).margin(0.02));
  CHECK(preset.gemm_k_overhead == Approx(rep.fit.gemm_k_overhead).margin(30));
  // Each left-out row was really predicted without itself: its fit differs from the full fit for some row.
  bool any_differs = false;
  for (const auto& v : rep.rows)
    any_differs |= v.leave_one_out_fit.gemm_efficiency != rep.fit.gemm_efficiency ||
                   v.leave_one_out_fit.gemm_k_overhead != rep.fit.gemm_k_overhead;
  CHECK(any_differs);
}

TEST_CASE("published runs: the H100 rows of seven sources, held out one row and one source at a time") {
  const auto h100 = rows_on("dgx-h100", true), a100 = rows_on("dgx-h100", false);
  REQUIRE(h100.size() == 44);
  std::set<std::string> sources;
  int gqa = 0, cp = 0;
  for (const auto& r : h100) {
    sources.insert(r.source);
    gqa += r.model.kv_heads > 0;
    cp += r.cp > 1;
  }
  CHECK(sources.size() == 7);
  CHECK(gqa == 30);  // the Nemotron-4 and Llama 3.1 rows
  CHECK(cp == 17);   // the Llama 3.1 rows: context parallel 2
  // Megatron-LM's model FLOPs of the 1.7B row (72 B s l h^2 + 12 B s^2 l h + 6 B s h V) at 408.8
  // TFLOP/s on 48 GPUs: 0.452 s.
  const auto& first = h100.front();
  REQUIRE(first.id == "mcore24-1.7b");
  CHECK(first.metric == RunMetric::tflops_model);
  CHECK(!first.model.tied_embeddings);
  const double B = 192, s = 4096, l = 24, h = 2048, V = 131072;
  const double flops = 72 * B * s * l * h * h + 12 * B * s * s * l * h + 6 * B * s * h * V;
  CHECK(measured_seconds(first) == Approx(flops / (48 * 408.8e12)).epsilon(1e-9));
  // The options column reaches the priced layout: Nemotron-4 has no dropout and a fused loss.
  for (const auto& r : h100) {
    if (r.source != "dgxc-nemotron4-15b") continue;
    CHECK(r.no_dropout);
    CHECK(r.fused_cross_entropy);
    CHECK(!predict_run(r, CollectiveModel(cluster_preset("dgx-h100"))).estimate.layout.dropout);
  }
  // Megatron-LM's training loop reduces bf16 runs' gradients in fp32 (arguments.py forces
  // accumulate_allreduce_grads_in_fp32), and so does NeMo when a config names no grad_sync_dtype
  // (Nemotron-4 15B); NeMo's GPT-3 175B and Nemotron-4 340B configs sync them in bf16.
  for (const auto& r : h100) {
    const bool fp32 = r.source == "megatron-lm-readme" || r.source == "dgxc-nemotron4-15b";
    CHECK(r.fp32_grad_reduce == fp32);
    CHECK(predict_run(r, CollectiveModel(cluster_preset("dgx-h100"))).estimate.layout.grad_reduce_fp32 == fp32);
  }
  PublishedRun half = first;
  half.fp32_grad_reduce = false;
  const CollectiveModel net(cluster_preset("dgx-h100"));
  CHECK(predict_run(first, net).estimate.time.dp_comm > predict_run(half, net).estimate.time.dp_comm);

  const ValidationReport rep = validate_runs(cluster_preset("dgx-h100"), h100, a100);
  INFO(format_validation(rep));
  CHECK(!rep.transferred_from_elsewhere);  // every source is held out by fitting on the other six
  // Held out by source really fitted without the source: for some source the fit differs from the
  // fit on every row (the grid can land on the same point without a source that agrees with the rest).
  bool any_differs = false;
  for (const auto& v : rep.rows)
    any_differs |= v.held_out_source_fit.gemm_efficiency != rep.fit.gemm_efficiency ||
                   v.held_out_source_fit.gemm_k_overhead != rep.fit.gemm_k_overhead;
  CHECK(any_differs);
  const Cluster preset = cluster_preset("dgx-h100");
  CHECK(preset.gemm_efficiency == Approx(rep.fit.gemm_efficiency).margin(0.02));
  CHECK(preset.gemm_k_overhead == Approx(rep.fit.gemm_k_overhead).margin(30));
  CHECK(preset.attention_efficiency == Approx(0.51));  // cuDNN's published H100 rate, not fitted
  CHECK(preset.memory_efficiency == Approx(0.60));     // the QuACK post's PyTorch kernels, not fitted
  CHECK(preset.comm_sm_fraction == Approx(16.0 / 132));  // NCCL's 16 SMs on a DGX, not fitted
  // docs/PLANNER.md: the H100 rows are NOT within the 3.5% / 8% goal (the means are). Limits as
  // measured with fp32 gradient reduction where the software says so, the README rows' 1F1B sends on
  // the critical path, memory-bound kernels at 0.60 of HBM3 and NCCL's SMs taken from the kernels
  // beside a DP collective (leave-one-out 3.38% / 11.08%, held out by source 3.41% / 10.69% before the
  // Llama 3.1 CP rows; 2.81% / 11.16% and 2.91% / 11.08% with them: the worst rows are still the
  // README's), with a little room: a change that makes the rows worse fails here.
  CHECK(rep.leave_one_out.mean <= 0.035);
  CHECK(rep.leave_one_out.worst <= 0.116);
  CHECK(rep.held_out_source.mean <= 0.035);
  CHECK(rep.held_out_source.worst <= 0.112);
  // The worst rows are the README's, whose micro-batch and schedule are not published; the GPT-3 and
  // Nemotron-4 DGX Cloud sources publish the whole layout and stay within 4.3% leave-one-out and 4.5%
  // held out by source (limits with a little room). The Llama 3.1 rows (context parallel 2) do not all
  // meet that: the 8B rows are predicted 2.5-5.7% slow (measured faster), the 70B and 405B rows within
  // 3.7% (docs/PLANNER.md "Context parallelism"); their limit is what was measured, with a little room.
  for (const auto& v : rep.rows) {
    if (v.in_sample.run.source.rfind("dgxc-", 0) != 0) continue;
    INFO(v.in_sample.run.id);
    const bool llama = v.in_sample.run.source.rfind("dgxc-llama3.1", 0) == 0;
    CHECK(std::abs(v.leave_one_out_error) <= (llama ? 0.06 : 0.044));
    CHECK(std::abs(v.held_out_source_error) <= (llama ? 0.06 : 0.047));
  }
}

TEST_CASE("published runs: the options column sets the ZeRO level and HSDP shard size") {
  ScratchDir dir;
  const std::string row = "a,src,w,selene-a100,megatron-sc21,24,2304,24,51200,2048,1,1,32,512,1,1,full,0,seconds,1,1,0,";
  const auto runs = load_published_runs(dir.write("t.csv", kHeader + row + "zero3;hsdp8\n"));
  REQUIRE(runs.size() == 1);
  CHECK(runs[0].zero == 3);
  CHECK(runs[0].zero_shard == 8);
  const CollectiveModel net(cluster_preset("selene-a100"));
  const Layout l = predict_run(runs[0], net).estimate.layout;
  CHECK(l.zero == 3);
  CHECK(l.zero_shard == 8);
  // The old spelling, and no option: the software's level (megatron-sc21: none).
  const auto old = load_published_runs(dir.write("u.csv", kHeader + row + "zero1\n"));
  CHECK(predict_run(old[0], net).estimate.layout.zero == 1);
  const auto none = load_published_runs(dir.write("v.csv", kHeader + row + "\n"));
  CHECK(none[0].zero == -1);
  CHECK(predict_run(none[0], net).estimate.layout.zero == 0);
}

TEST_CASE("published runs: malformed tables name the file, line and problem") {
  ScratchDir dir;
  struct Case {
    std::string text, message;
  };
  const Case cases[] = {
      {"a,b\n" + kRow, "t.csv:1: header must be"},
      {kHeader + "a,src,w,selene-a100,megatron-sc21,24,2304\n", "t.csv:2: expected 23 columns, got 7"},
      {kHeader + kRow + kRow, "t.csv:3: id 'a' appears twice"},
      {kHeader + "a,src,w,selene-a100,pytorch,24,2304,24,51200,2048,1,1,32,512,0,0,full,0,tflops_eq3,137,1,0,\n",
       "t.csv:2: unknown software 'pytorch'"},
      {kHeader + "a,src,w,selene-a100,megatron-sc21,24,2304,24,51200,2048,1,1,32,512,0,0,half,0,tflops_eq3,137,1,0,\n",
       "t.csv:2:"},
      {kHeader + "a,src,w,selene-a100,megatron-sc21,24,2304,24,51200,2048,0,1,32,512,0,0,full,0,tflops_eq3,137,1,0,\n",
       "t.csv:2: column tp is 0, must be >= 1"},
      {kHeader + "a,src,w,selene-a100,megatron-sc21,24,2304,24,51200,2048,1,1,32,512,0,0,full,0,mfu,0.5,1,0,\n",
       "column metric 'mfu' must be tflops_eq3, tflops_model or seconds"},
      {kHeader + "a,src,w,selene-a100,megatron-sc21,24,2304,24,51200,2048,1,1,32,512,0,0,full,0,seconds,fast,1,0,\n",
       "column value 'fast' is not a number"},
      {kHeader + "a,src,w,selene-a100,megatron-sc21,24,2304,24,51200,2048,1,1,3,512,0,0,full,0,seconds,1,1,0,\n",
       "dp 3 does not divide global_batch 512"},
      {kHeader + "a,src,w,selene-a100,megatron-sc21,24,2304,24,51200,2048,1,1,32,512,0,0,full,0,seconds,1,1,5,\n",
       "column kv_heads 5 must divide heads 24"},
      {kHeader + "a,src,w,selene-a100,megatron-sc21,24,2304,24,51200,2048,1,1,32,512,0,0,full,0,seconds,1,1,0,fp8\n",
       "column options: unknown option 'fp8'"},
      {kHeader + "a,src,w,selene-a100,megatron-sc21,24,2304,24,51200,2048,1,1,32,512,0,0,full,0,seconds,1,1,0,zero9\n",
       "t.csv:2: column options: 'zero9': expected zeroN with N from 0 to 3"},
      {kHeader, "t.csv: no data rows"},
  };
  for (const auto& k : cases) {
    INFO(k.message);
    const auto p = dir.write("t.csv", k.text);
    CHECK_THROWS_AS(load_published_runs(p), triax::IoError);
    CHECK_THROWS_WITH(load_published_runs(p), Catch::Contains(k.message));
  }
  CHECK_THROWS_WITH(load_published_runs(dir.path() / "none.csv"), Catch::Contains("none.csv: cannot open"));
}

TEST_CASE("published runs: validation refuses rows of another cluster and a single source") {
  ScratchDir dir;
  const auto p = dir.write("t.csv", kHeader + kRow);
  const auto rows = load_published_runs(p);
  CHECK_THROWS_WITH(validate_runs(cluster_preset("dgx-h100"), rows), Catch::Contains("measured on 'selene-a100'"));
  CHECK_THROWS_WITH(validate_runs(cluster_preset("selene-a100"), rows), Catch::Contains("every row is from source 'src'"));
}

TEST_CASE("GEMM model: whole waves, the better tile orientation, and the K overhead") {
  // 4 SMs, 128 x 64 tiles, no K overhead: a 256 x 128 output is 4 tiles, one full wave.
  const GemmModel g(100e12, 4, 128, 64, 0);
  CHECK(g.efficiency({256, 128, 1024, 1}) == Approx(1.0));
  // One more row of tiles: 5 or 6 tiles -> 2 waves of 4.
  CHECK(g.efficiency({384, 128, 1024, 1}) == Approx(384.0 * 128 / (2 * 4 * 128 * 64)));
  // Orientation: 64 x 512 fits the transposed tile (64 x 128) in 4 tiles, one wave.
  CHECK(g.efficiency({64, 512, 1024, 1}) == Approx(1.0));
  // Padding: 100 x 100 in one 128 x 64 tile pair -> 2 tiles, 1 wave of 4 slots.
  CHECK(g.efficiency({100, 100, 64, 1}) == Approx(100.0 * 100 / (4 * 128 * 64)));
  // Batched: 8 GEMMs of one tile each are 2 waves of 4.
  CHECK(g.efficiency({128, 64, 64, 8}) == Approx(1.0));
  // K overhead of 64: K = 64 runs at half the rate, K = 192 at 3/4.
  const GemmModel k(100e12, 4, 128, 64, 64);
  CHECK(k.efficiency({256, 128, 64, 1}) == Approx(0.5));
  CHECK(k.efficiency({256, 128, 192, 1}) == Approx(0.75));
  CHECK(k.seconds({256, 128, 64, 1}) == Approx(2.0 * 256 * 128 * 64 / 50e12));
  // No structure (CPUs): the flat rate.
  const GemmModel flat(1e11, 0, 0, 0, 0);
  CHECK(flat.efficiency({7, 13, 5, 3}) == Approx(1.0));
  CHECK_THROWS_AS(GemmModel(1e12, 8, 0, 64, 0), triax::ConfigError);
  CHECK_THROWS_AS(GemmModel(0, 0, 0, 0, 0), triax::ConfigError);
}
