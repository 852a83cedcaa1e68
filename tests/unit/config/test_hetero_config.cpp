// Heterogeneous clusters' configuration (issue 29, docs/HETEROGENEOUS.md): --dp-microbatches (per
// replica or per device class) and --stage-classes resolve against every rank's class into the batch
// plan's shares, and each mistake is one ConfigError naming the bad value: a count per replica that
// is not dp counts, a 0 count, per-replica counts mixed with per-class ones, a replica spanning two
// classes, a class no replica holds, a replica's class left unnamed, --num-micro-batches or a ramp-up
// with shares, a global batch that is not micro-batch x the sum, a stage list of the wrong length, a
// stage whose ranks are of another class (the message lists them), a bad TRIAX_DEVICE_CLASS, uneven
// shares under ZeRO 2/3 or within an expert-parallel group; and a
// checkpoint manifest whose batch.dp_microbatches do not fit its batch.
#include <catch2/catch.hpp>
#include <stdlib.h>

#include <functional>

#include "triax/config/hetero.h"
#include "triax/config/train_config.h"
#include "triax/distributed/grid.h"
#include "unit/checkpoint/manifest_sample.h"

using namespace triax;
using Catch::Contains;

namespace {
using Classes = std::vector<std::string>;

// The nano model (4 layers, 8-token samples), micro-batch 2, the given layout; shares (and stage
// classes) set through the option table as the flags and config files set them.
TrainConfig het(int tp, int pp, int dp, const char* shares, const char* stages = nullptr) {
  TrainConfig c;
  c.model = "nano";
  c.layers = 4;
  c.seq = 8;
  c.micro_batch = 2;
  c.tp = tp, c.pp = pp, c.dp = dp;
  if (shares) find_train_option("dp-microbatches")->set(c, OptionInput{{shares}, nullptr, "--dp-microbatches"});
  if (stages) find_train_option("stage-classes")->set(c, OptionInput{{stages}, nullptr, "--stage-classes"});
  return c;
}

// The ConfigError message of resolving cfg on W ranks of these classes, or "" when it resolves.
std::string resolve_error(const TrainConfig& cfg, int W, const Classes& classes = {}) {
  try {
    resolve_train_config(cfg, W, classes);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

std::string flag_error(const char* key, const char* value) {
  try {
    TrainConfig c;
    find_train_option(key)->set(c, OptionInput{{value}, nullptr, fmt::format("--{}", key)});
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// TRIAX_DEVICE_CLASS set for a scope (unset again after it).
struct ClassEnv {
  explicit ClassEnv(const char* v) { ::setenv("TRIAX_DEVICE_CLASS", v, 1); }
  ~ClassEnv() { ::unsetenv("TRIAX_DEVICE_CLASS"); }
};
}  // namespace

TEST_CASE("dp-microbatches resolve into the batch plan's shares, per replica and per class", "[config][hetero]") {
  const ResolvedTrainConfig r = resolve_train_config(het(1, 1, 2, "3,1"), 2);
  CHECK(r.batch.shares == std::vector<int64_t>{3, 1});
  CHECK(r.batch.global_batch == 8);  // micro-batch 2 x (3 + 1)
  CHECK(r.batch.num_micro_batches == 3);
  CHECK(r.batch.first_micro_batch_of(1) == 3);
  CHECK(r.batch.micro_batches_of(1) == 1);
  CHECK(r.batch.describe() == "global batch 8 = micro-batch 2 x micro-batches [3, 1] over dp 2");
  // The explicit configuration resolves to itself (shares, no --num-micro-batches).
  CHECK(!r.explicit_cfg.num_micro_batches);
  CHECK(to_toml(resolve_train_config(r.explicit_cfg, 2).explicit_cfg) == to_toml(r.explicit_cfg));
  // A sum dp does not divide; the micro-batch from the global batch.
  CHECK(resolve_train_config(het(1, 1, 2, "5,2"), 2).batch.global_batch == 14);
  TrainConfig g = het(1, 1, 2, "3,1");
  g.micro_batch.reset();
  g.global_batch = 12;
  CHECK(resolve_train_config(g, 2).batch.micro_batch == 3);
  // Per class: the replica's class picks its count, whatever the launch order.
  CHECK(resolve_train_config(het(1, 1, 2, "fast=3,slow=1"), 2, {"fast", "slow"}).batch.shares == std::vector<int64_t>{3, 1});
  CHECK(resolve_train_config(het(1, 1, 2, "fast=3,slow=1"), 2, {"slow", "fast"}).batch.shares == std::vector<int64_t>{1, 3});
  // tp 2 x pp 2 x dp 2 (order tp-dp-pp): replica 1 is ranks 2, 3, 6, 7.
  const Classes tpd = {"a", "a", "b", "b", "a", "a", "b", "b"};
  CHECK(resolve_train_config(het(2, 2, 2, "a=1,b=3"), 8, tpd).batch.shares == std::vector<int64_t>{1, 3});
  // Stage classes that match the ranks resolve.
  CHECK(resolve_error(het(1, 2, 1, nullptr, "fast,slow"), 2, {"fast", "slow"}).empty());
}

TEST_CASE("dp-microbatches mistakes are refused naming the values", "[config][hetero]") {
  CHECK_THAT(resolve_error(het(1, 1, 2, "3,1,1"), 2), Contains("--dp-microbatches [3, 1, 1] gives 3 counts for dp 2"));
  CHECK_THAT(resolve_error(het(1, 1, 4, "3,1"), 4), Contains("gives 2 counts for dp 4"));
  CHECK_THAT(flag_error("dp-microbatches", "3,0"), Contains("--dp-microbatches") && Contains("0"));
  CHECK_THAT(flag_error("dp-microbatches", "fast=0,slow=1"), Contains("--dp-microbatches") && Contains("0"));
  CHECK_THAT(flag_error("dp-microbatches", "3,slow=1"), Contains("counts per replica mixed with counts per class"));
  CHECK_THAT(flag_error("dp-microbatches", "fast=3,1"), Contains("counts per replica mixed with counts per class"));
  CHECK_THAT(flag_error("dp-microbatches", "3,,1"), Contains("an empty entry"));
  CHECK_THAT(flag_error("dp-microbatches", "f st=3"), Contains("not a device class name"));
  // Built in code: the same checks as the flags.
  TrainConfig zero = het(1, 1, 2, nullptr);
  zero.dp_microbatches = {{"", 3}, {"", 0}};
  CHECK_THAT(resolve_error(zero, 2), Contains("dp-microbatches = \"3,0\": out of range"));
  TrainConfig mixed = het(1, 1, 2, nullptr);
  mixed.dp_microbatches = {{"", 3}, {"slow", 1}};
  CHECK_THAT(resolve_error(mixed, 2, {"fast", "slow"}), Contains("dp-microbatches = \"3,slow=1\"") &&
                                                             Contains("counts per replica mixed with counts per class"));
  // Per class: a replica of two classes, a class nobody holds, a replica's class not named, a class twice.
  CHECK_THAT(resolve_error(het(2, 1, 2, "fast=3,slow=1"), 4, {"fast", "slow", "fast", "slow"}),
             Contains("data-parallel replica 0 (ranks 0-1) holds classes 'fast' (ranks 0) and 'slow' (ranks 1)"));
  CHECK_THAT(resolve_error(het(1, 1, 2, "fast=3,slow=1,mid=2"), 2, {"fast", "slow"}),
             Contains("names class 'mid', but no data-parallel replica is of that class"));
  CHECK_THAT(resolve_error(het(1, 1, 2, "fast=3"), 2, {"fast", "slow"}),
             Contains("does not name class 'slow' of data-parallel replica 1 (ranks 1"));
  CHECK_THAT(resolve_error(het(1, 1, 2, "fast=3"), 2), Contains("does not name class 'default'"));
  CHECK_THAT(resolve_error(het(1, 1, 2, "fast=3,fast=1"), 2, {"fast", "fast"}), Contains("class 'fast' is given twice"));
  // Batch knobs that contradict the shares.
  TrainConfig nmb = het(1, 1, 2, "3,1");
  nmb.num_micro_batches = 2;
  CHECK_THAT(resolve_error(nmb, 2), Contains("drop --num-micro-batches 2"));
  TrainConfig ramp = het(1, 1, 2, "3,1");
  ramp.rampup = BatchRampup{4, 4, 16};
  CHECK_THAT(resolve_error(ramp, 2), Contains("--dp-microbatches 3,1 cannot be combined with a batch ramp-up"));
  TrainConfig gb = het(1, 1, 2, "3,1");
  gb.global_batch = 10;
  CHECK_THAT(resolve_error(gb, 2),
             Contains("global batch 10 != micro-batch 2 x the 4 micro-batches of --dp-microbatches [3, 1] = 8"));
  gb.micro_batch.reset();
  CHECK_THAT(resolve_error(gb, 2), Contains("global batch 10 is not divisible by the 4 micro-batches"));
  // Collectives once per micro-batch across replicas: ZeRO 2/3 need equal shares, ep equal ones per ep group.
  for (int zero : {2, 3}) {
    TrainConfig z = het(1, 1, 2, "3,1");
    z.zero = zero;
    CHECK_THAT(resolve_error(z, 2), Contains(fmt::format("--zero {} reduce-scatters", zero)) &&
                                        Contains("--dp-microbatches 3,1 gives [3, 1]: use --zero 1"));
    z.dp_microbatches = {{"", 2}, {"", 2}};
    CHECK(resolve_error(z, 2).empty());
  }
  TrainConfig ep = het(1, 1, 4, "3,3,1,2");
  ep.moe_every = 2, ep.experts = 4, ep.ep = 2;
  CHECK_THAT(resolve_error(ep, 4), Contains("--ep 2: data-parallel replicas 2-3 form an expert-parallel group") &&
                                       Contains("--dp-microbatches 3,3,1,2 gives them [1, 2]"));
  ep.dp_microbatches = {{"", 3}, {"", 3}, {"", 1}, {"", 1}};
  CHECK(resolve_error(ep, 4).empty());
  // The interleaved schedule needs every replica's micro-batches to be a multiple of pp.
  TrainConfig il = het(1, 2, 2, "3,1");
  il.vpp = 2, il.schedule = ScheduleKind::interleaved;
  CHECK_THAT(resolve_error(il, 4), Contains("multiple of pp"));
  il.dp_microbatches = {{"", 4}, {"", 2}};
  CHECK(resolve_error(il, 4).empty());
}

TEST_CASE("stage-classes mistakes and bad device class names are refused naming them", "[config][hetero]") {
  CHECK_THAT(resolve_error(het(1, 2, 1, nullptr, "fast,slow,slow"), 2, {"fast", "slow"}),
             Contains("--stage-classes fast,slow,slow names 3 classes for pp 2 stages"));
  // pp 2 x dp 2: stage 0 is ranks 0-1, stage 1 ranks 2-3; the message lists every misplaced rank.
  const std::string e = resolve_error(het(1, 2, 2, nullptr, "fast,slow"), 4, {"fast", "slow", "fast", "slow"});
  CHECK_THAT(e, Contains("stage 0 should run on 'fast' but holds 'slow' (ranks 1)"));
  CHECK_THAT(e, Contains("stage 1 should run on 'slow' but holds 'fast' (ranks 2)"));
  CHECK_THAT(e, Contains("stage 0: ranks 0-1, stage 1: ranks 2-3"));
  // Unset classes are "default": naming a class no rank has is refused.
  CHECK_THAT(resolve_error(het(1, 2, 1, nullptr, "fast,slow"), 2), Contains("holds 'default' (ranks 0)"));
  CHECK_THAT(flag_error("stage-classes", "fast,a b"), Contains("not a device class name"));
  CHECK_THAT(flag_error("stage-classes", "fast,"), Contains("an empty entry"));
  {
    ClassEnv bad("a b");
    CHECK_THROWS_WITH(device_class_from_env(), Contains("TRIAX_DEVICE_CLASS='a b': the character ' '"));
  }
  {
    ClassEnv good("h100.80g");
    CHECK(device_class_from_env() == "h100.80g");
  }
  CHECK(device_class_from_env() == kDefaultDeviceClass);
}

TEST_CASE("a manifest's batch.dp_microbatches must fit its batch", "[config][hetero][checkpoint]") {
  const test::ManifestSample s = test::manifest_sample();  // dp 1, global batch 8 = micro-batch 2 x 4
  auto text = [&](const std::function<void(CheckpointManifest&)>& f) {
    CheckpointManifest m = s.m;
    f(m);
    return checkpoint_manifest_json(m);
  };
  const CheckpointManifest ok = parse_checkpoint_manifest(text([](auto& m) { m.batch->dp_microbatches = {4}; }), "m.json");
  CHECK(ok.batch->dp_microbatches == std::vector<int64_t>{4});
  CHECK_THROWS_WITH(parse_checkpoint_manifest(text([](auto& m) { m.batch->dp_microbatches = {3, 1}; }), "m.json"),
                    Contains("m.json: ") && Contains("dp_microbatches [3, 1] are not dp 1 counts"));
  CHECK_THROWS_WITH(parse_checkpoint_manifest(text([](auto& m) { m.batch->dp_microbatches = {3}; }), "m.json"),
                    Contains("dp_microbatches [3] are not dp 1 counts with micro_batch 2 x their sum = global_batch 8"));
  CHECK_THROWS_WITH(parse_checkpoint_manifest(text([](auto& m) { m.batch->dp_microbatches = {0}; }), "m.json"),
                    Contains("batch.dp_microbatches: 0 is not a micro-batch count"));
}
