// The SC21 table reader: a well-formed file round-trips, and each malformed line is rejected with
// the file, line and column named. Independent of the shared data folder.
#include <catch2/catch.hpp>

#include "plan/fixtures.h"
#include "triax/core/error.h"
#include "triax/plan/validation.h"

using namespace triax::plan;
using triax::plan::test::ScratchDir;

namespace {
const std::string kHeader =
    "params_billion,heads,hidden,layers,tp,pp,dp,gpus,global_batch,tflops_per_gpu,percent_of_peak,aggregate_pflops\n";
}

TEST_CASE("a well-formed table is read with comments and blank lines skipped") {
  ScratchDir dir;
  const auto p = dir.write("t.csv", "# comment\n" + kHeader + "\n1.7,24,2304,24,1,1,32,32,512,137,44,4.4\n"
                                    "145.6, 96, 12288, 80, 8, 8, 24, 1536, 2304, 148, 47, 227.1\r\n");
  const auto rows = load_sc21_table(p);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].params_billion == 1.7);
  CHECK(rows[0].dp == 32);
  CHECK(rows[1].hidden == 12288);
  CHECK(rows[1].global_batch == 2304);
  CHECK(rows[1].tflops_per_gpu == 148);
  CHECK(rows[1].aggregate_pflops == 227.1);
  const ModelShape m = sc21_model(rows[1]);
  CHECK((m.vocab == 51200 && m.seq == 2048 && m.ffn_hidden() == 4 * 12288 && m.global_batch == 2304));
  const Layout sw = sc21_software();
  CHECK((sw.precision == Precision::fp16 && sw.recompute == Recompute::full && !sw.dp_overlap &&
         sw.attention == AttentionKernel::unfused && sw.dropout && !sw.grad_reduce_fp32));
}

TEST_CASE("malformed tables name the file, line and problem") {
  ScratchDir dir;
  struct Case {
    std::string text, message;
  };
  const Case cases[] = {
      {"a,b,c\n1,2,3\n", "t.csv:1: header must be"},
      {kHeader + "1.7,24,2304,24,1,1,32,32,512,137,44\n", "t.csv:2: expected 12 columns, got 11"},
      {kHeader + "1.7,24,2304,24,1,1,32,32,512,fast,44,4.4\n", "t.csv:2: column tflops_per_gpu 'fast' is not a number"},
      {kHeader + "1.7,24,2304,24,1,1,32,32,512,,44,4.4\n", "column tflops_per_gpu '' is not a number"},
      {kHeader + "1.7,24,2304,24,2,1,32,32,512,137,44,4.4\n", "t.csv:2: tp*pp*dp = 64 but gpus = 32"},
      {kHeader, "t.csv: no data rows"},
      {"# only a comment\n", "t.csv: no header line"},
  };
  for (const auto& k : cases) {
    INFO(k.message);
    const auto p = dir.write("t.csv", k.text);
    CHECK_THROWS_AS(load_sc21_table(p), triax::IoError);
    CHECK_THROWS_WITH(load_sc21_table(p), Catch::Contains(k.message));
  }
  CHECK_THROWS_WITH(load_sc21_table(dir.path() / "absent.csv"), Catch::Contains("absent.csv: cannot open"));
}

TEST_CASE("a row no micro-batch size can fit is an error naming the row") {
  Sc21Row r;
  r.params_billion = 1008;
  r.heads = 160;
  r.hidden = 25600;
  r.layers = 128;
  r.tp = r.pp = r.dp = r.gpus = 1;
  r.global_batch = 8;
  r.tflops_per_gpu = 163;
  const CollectiveModel net(cluster_preset("selene-a100"));
  CHECK_THROWS_WITH(predict_sc21_row(r, net), Catch::Contains("1008B (tp1 pp1 dp1): no micro-batch size fits"));
}
