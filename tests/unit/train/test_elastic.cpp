// The elastic worker's pieces (include/triax/train/elastic.h, issue 30): what torchrun's
// environment says and how a bad value is refused, the largest world, the progress record and
// its round trip, the line at a (re)start, and an ElasticRun over one rank that writes the record
// a second run reads, the first-wins interruption record and torchrun's error file.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "support/scoped_env.h"
#include "unit/io_test_util.h"
#include "triax/core/error.h"
#include "triax/distributed/comm/self_comm.h"
#include "triax/train/elastic.h"

using namespace triax;
using Catch::Matchers::Contains;
using Catch::Matchers::EndsWith;
using Catch::Matchers::StartsWith;

namespace {

// Every variable the module reads, unset for the test's scope and put back after it.
class CleanEnv {
 public:
  CleanEnv() {
    for (const char* n : {"TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                          "LOCAL_WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_ERROR_FILE", "TRIAX_MAX_WORLD_SIZE",
                          "PET_NNODES"})
      saved_.push_back(std::make_unique<testing::ScopedEnv>(n, std::nullopt));
  }
  void set(const char* name, const std::string& value) { ::setenv(name, value.c_str(), 1); }

 private:
  std::vector<std::unique_ptr<testing::ScopedEnv>> saved_;
};

ElasticLaunch launch_of(const std::string& run_id, int restart, int max_restarts) {
  ElasticLaunch l;
  l.run_id = run_id;
  l.restart_count = restart;
  l.max_restarts = max_restarts;
  return l;
}

// Attempt 1 of 'job7' at world 4: iteration 12 ended at 1000.5; saves of 5 and 10 began at 990 and 999.
ElasticState attempt1() {
  ElasticState s;
  s.run_id = "job7";
  s.attempt = 1;
  s.world = 4;
  s.layout = "tp 2 x pp 1 x dp 2";
  s.attempt_start_unix_s = 980.0;
  s.iteration = 12;
  s.iteration_unix_s = 1000.5;
  s.mean_iteration_s = 0.25;
  s.saves = {{5, 990.0}, {10, 999.0}};
  return s;
}

ElasticState read_state(const test::TempDir& dir) {
  const std::string path = (dir.path() / "elastic" / "state.json").string();
  return parse_elastic_state(test::read_bytes(path), path);
}

}  // namespace

TEST_CASE("elastic_launch_from_env: nullopt without torchrun, the variables it sets", "[elastic]") {
  CleanEnv env;
  CHECK_FALSE(elastic_launch_from_env(0, 4).has_value());
  env.set("TORCHELASTIC_RUN_ID", "job7");
  env.set("TORCHELASTIC_RESTART_COUNT", "2");
  env.set("TORCHELASTIC_MAX_RESTARTS", "3");
  env.set("LOCAL_WORLD_SIZE", "2");
  env.set("GROUP_RANK", "1");
  env.set("PET_NNODES", "1:3");
  const auto l = elastic_launch_from_env(2, 4);
  REQUIRE(l.has_value());
  CHECK(l->run_id == "job7");
  CHECK(l->restart_count == 2);
  CHECK(l->max_restarts == 3);
  CHECK(l->local_world_size == 2);
  CHECK(l->group_rank == 1);
  CHECK(l->max_world_size == 6);
  CHECK(l->error_file.empty());
}

TEST_CASE("elastic_launch_from_env: a malformed or inconsistent variable is named", "[elastic]") {
  CleanEnv env;
  env.set("TORCHELASTIC_RUN_ID", "job7");
  env.set("TORCHELASTIC_MAX_RESTARTS", "3");
  SECTION("restart count not a number") {
    env.set("TORCHELASTIC_RESTART_COUNT", "one");
    CHECK_THAT(test::config_error_of([] { elastic_launch_from_env(0, 4); }), Contains("TORCHELASTIC_RESTART_COUNT"));
  }
  SECTION("restart count above the maximum") {
    env.set("TORCHELASTIC_RESTART_COUNT", "4");
    CHECK_THAT(test::config_error_of([] { elastic_launch_from_env(0, 4); }),
               Contains("TORCHELASTIC_RESTART_COUNT=4 exceeds TORCHELASTIC_MAX_RESTARTS=3"));
  }
  SECTION("more local workers than the world") {
    env.set("LOCAL_WORLD_SIZE", "5");
    CHECK_THAT(test::config_error_of([] { elastic_launch_from_env(0, 4); }), Contains("LOCAL_WORLD_SIZE"));
  }
  SECTION("local world size not a number") {
    env.set("LOCAL_WORLD_SIZE", "2x");
    CHECK_THAT(test::config_error_of([] { elastic_launch_from_env(0, 4); }), Contains("LOCAL_WORLD_SIZE"));
  }
  SECTION("group rank outside the world") {
    env.set("GROUP_RANK", "4");
    CHECK_THAT(test::config_error_of([] { elastic_launch_from_env(0, 4); }), Contains("GROUP_RANK"));
  }
  SECTION("negative group rank") {
    env.set("GROUP_RANK", "-1");
    CHECK_THAT(test::config_error_of([] { elastic_launch_from_env(0, 4); }), Contains("GROUP_RANK"));
  }
}

TEST_CASE("max_world_size_from_env: TRIAX_MAX_WORLD_SIZE, else PET_NNODES's maximum x local, else the world",
          "[elastic]") {
  CleanEnv env;
  CHECK(max_world_size_from_env(4, 2) == 4);
  env.set("PET_NNODES", "2:4");
  CHECK(max_world_size_from_env(4, 2) == 8);
  env.set("PET_NNODES", "4");
  CHECK(max_world_size_from_env(2, 1) == 4);
  CHECK(max_world_size_from_env(4, 2) == 8);
  env.set("PET_NNODES", "1");  // below the world: the world it has is the most it knows of
  CHECK(max_world_size_from_env(4, 2) == 4);
  env.set("TRIAX_MAX_WORLD_SIZE", "16");  // wins over PET_NNODES
  CHECK(max_world_size_from_env(4, 2) == 16);
  env.set("TRIAX_MAX_WORLD_SIZE", "3");
  CHECK_THAT(test::config_error_of([] { max_world_size_from_env(4, 2); }),
             Contains("TRIAX_MAX_WORLD_SIZE=3 is below the world size 4"));
  env.set("TRIAX_MAX_WORLD_SIZE", "many");
  CHECK_THAT(test::config_error_of([] { max_world_size_from_env(4, 2); }), Contains("TRIAX_MAX_WORLD_SIZE"));
  ::unsetenv("TRIAX_MAX_WORLD_SIZE");
  for (const char* bad : {"2:x", "x:4", "3:2", "0", "", "2:4:6"}) {
    CAPTURE(bad);
    env.set("PET_NNODES", bad);
    CHECK_THAT(test::config_error_of([] { max_world_size_from_env(4, 2); }), Contains("PET_NNODES"));
  }
}

TEST_CASE("describe_layout", "[elastic]") {
  CHECK(describe_layout(2, 1, 2) == "tp 2 x pp 1 x dp 2");
  CHECK(describe_layout(4, 2, 1, 1) == "tp 4 x pp 2 x dp 1");
  CHECK(describe_layout(2, 2, 3, 2) == "tp 2 x cp 2 x pp 2 x dp 3");
}

TEST_CASE("the progress record: round trip, a malformed record names its file", "[elastic]") {
  const ElasticState s = attempt1();
  const ElasticState r = parse_elastic_state(elastic_state_json(s), "state.json");
  CHECK(r.run_id == s.run_id);
  CHECK(r.attempt == s.attempt);
  CHECK(r.world == s.world);
  CHECK(r.layout == s.layout);
  CHECK(r.attempt_start_unix_s == s.attempt_start_unix_s);
  CHECK(r.iteration == s.iteration);
  CHECK(r.iteration_unix_s == s.iteration_unix_s);
  CHECK(r.mean_iteration_s == s.mean_iteration_s);
  CHECK(r.saves == s.saves);
  const std::string file = "/ck/elastic/state.json";
  CHECK_THAT(test::io_error_of([&] { parse_elastic_state("{\"run_id\": \"job7\", \"attempt\": 1", file); }),
             Contains(file));
  CHECK_THAT(test::io_error_of([&] { parse_elastic_state("{\"run_id\": 7}", file); }), Contains(file));
  ElasticState zero = s;
  zero.attempt = 0;
  CHECK_THAT(test::io_error_of([&] { parse_elastic_state(elastic_state_json(zero), file); }),
             Contains(file) && Contains("attempt 0"));
}

TEST_CASE("describe_elastic_start: a first start", "[elastic]") {
  const ElasticStart s = describe_elastic_start(launch_of("job7", 0, 3), std::nullopt, std::nullopt,
                                                "tp 2 x pp 1 x dp 2", 4, -1);
  CHECK(s.attempt == 1);
  CHECK(s.lost_iterations == 0);
  CHECK(s.line ==
        "elastic: attempt 1 of run 'job7' (restart 0 of 3): tp 2 x pp 1 x dp 2 (world 4); no checkpoint: starting at "
        "iteration 0");
}

TEST_CASE("describe_elastic_start: the same run at a new layout, the work lost since the save", "[elastic]") {
  const ElasticState prev = attempt1();
  SECTION("seconds from the save's start time") {
    const ElasticStart s =
        describe_elastic_start(launch_of("job7", 1, 3), prev, std::nullopt, "tp 2 x pp 1 x dp 1", 2, 10);
    CHECK(s.attempt == 2);
    CHECK(s.lost_iterations == 2);
    CHECK(s.lost_s == Approx(1.5));
    CHECK(s.line ==
          "elastic: attempt 2 of run 'job7' (restart 1 of 3): tp 2 x pp 1 x dp 2 (world 4) -> tp 2 x pp 1 x dp 1 "
          "(world 2); resumed from iteration 10; lost 2 iterations (1.5 s of training) done after the last save");
  }
  SECTION("no record of the save: an estimate from the mean iteration time") {
    ElasticState p = prev;
    p.saves.clear();
    p.mean_iteration_s = 0.2;
    const ElasticStart s = describe_elastic_start(launch_of("job7", 1, 3), p, std::nullopt, "tp 2 x pp 1 x dp 1", 2, 9);
    CHECK(s.lost_iterations == 3);
    CHECK(s.lost_s == Approx(0.6));
    CHECK_THAT(s.line, Contains("lost 3 iterations (about 0.6 s of training)"));
  }
  SECTION("no checkpoint: the whole first attempt is lost") {
    const ElasticStart s =
        describe_elastic_start(launch_of("job7", 1, 3), prev, std::nullopt, "tp 2 x pp 1 x dp 1", 2, -1);
    CHECK(s.lost_iterations == 12);
    CHECK(s.lost_s == Approx(20.5));
    CHECK_THAT(s.line, Contains("no checkpoint: starting at iteration 0; lost 12 iterations (20.5 s of training)"));
  }
  SECTION("with the report of how the attempt ended") {
    const Interruption why{1, 3, 1000.0, "peer failure: rank 2 closed the connection"};
    const ElasticStart s = describe_elastic_start(launch_of("job7", 1, 3), prev, why, "tp 2 x pp 1 x dp 1", 2, 10);
    CHECK_THAT(s.line, EndsWith("; attempt 1 ended at 00:16:40 UTC: rank 3: peer failure: rank 2 closed the connection"));
  }
}

TEST_CASE("describe_elastic_start: another run's record starts at attempt 1", "[elastic]") {
  const ElasticStart s =
      describe_elastic_start(launch_of("job8", 0, 3), attempt1(), std::nullopt, "tp 2 x pp 1 x dp 2", 4, 10);
  CHECK(s.attempt == 1);
  CHECK(s.lost_iterations == 0);
  CHECK_THAT(s.line, StartsWith("elastic: attempt 1 of run 'job8' (restart 0 of 3): tp 2 x pp 1 x dp 2 (world 4); "
                                "resumed from iteration 10") &&
                         Contains("the progress record under --save is of run 'job7', not this one"));
}

namespace {

// Attempt 1 of 'jobR' on one rank: iterations 1 and 2, a save of 1 before iteration 2.
void run_attempt1(const ElasticLaunch& launch, const test::TempDir& dir, Communicator& world) {
  ElasticRun run(launch, dir.path().string(), world, "tp 1 x pp 1 x dp 1", -1, 0.0);
  CHECK(run.start().attempt == 1);
  CHECK_THAT(run.start().line, StartsWith("elastic: attempt 1 of run 'jobR'"));
  const ElasticState s0 = read_state(dir);
  CHECK(s0.attempt == 1);
  CHECK(s0.world == 1);
  CHECK(s0.iteration == -1);
  CHECK(run.iteration_done(1).empty());
  run.save_started(1);
  CHECK(run.iteration_done(2).empty());
  const ElasticState s = read_state(dir);
  CHECK(s.run_id == "jobR");
  CHECK(s.iteration == 2);
  CHECK(s.layout == "tp 1 x pp 1 x dp 1");
  REQUIRE(s.saves.size() == 1);
  CHECK(s.saves[0].first == 1);
  CHECK(run.recovery_s() < 0);
}

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(test::read_bytes(path)); }

}  // namespace

TEST_CASE("ElasticRun over one rank: the record, the next attempt, the interruption and torchrun's error file",
          "[elastic]") {
  CleanEnv env;
  test::TempDir dir;
  const std::string error_file = dir.file("torch_error.json");
  env.set("TORCHELASTIC_RUN_ID", "jobR");
  env.set("TORCHELASTIC_MAX_RESTARTS", "3");
  env.set("TORCHELASTIC_ERROR_FILE", error_file);
  auto world = make_self_communicator();
  const auto launch = elastic_launch_from_env(0, 1);
  REQUIRE(launch.has_value());
  CHECK(launch->error_file == error_file);
  run_attempt1(*launch, dir, *world);

  ElasticLaunch again = *launch;
  again.restart_count = 1;
  {
    ElasticRun run(again, dir.path().string(), *world, "tp 1 x pp 1 x dp 1", 1, 0.0);
    CHECK(run.start().attempt == 2);
    CHECK(run.start().lost_iterations == 1);
    CHECK_THAT(run.start().line, Contains("attempt 2 of run 'jobR' (restart 1 of 3): tp 1 x pp 1 x dp 1 (world 1) -> "
                                          "tp 1 x pp 1 x dp 1 (world 1); resumed from iteration 1; lost 1 iteration "));
    CHECK(read_state(dir).attempt == 2);
    CHECK_THAT(run.iteration_done(2), StartsWith("elastic: training resumed ") && Contains("at world 1"));
    CHECK(run.recovery_s() >= 0);

    // Another process of attempt 2 reports first; this one's report must not replace it.
    const std::string record = (dir.path() / "elastic" / "interrupted.2.json").string();
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      elastic_note_interruption("peer failure: the first report");
      ::_exit(0);
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    REQUIRE(std::filesystem::exists(record));
    elastic_note_interruption("stop signal: the second report");
    const auto rec = read_json(record);
    CHECK(rec.at("attempt").get<int>() == 2);
    CHECK(rec.at("rank").get<int>() == 0);
    CHECK(rec.at("what").get<std::string>() == "peer failure: the first report");

    REQUIRE(std::filesystem::exists(error_file));
    const auto err = read_json(error_file);
    CHECK(err.at("message").get<std::string>() == "triax rank 0: stop signal: the second report");
    CHECK(err.at("timestamp").is_number_integer());
    // Only the first call of a process writes.
    elastic_note_interruption("a third report");
    CHECK(read_json(error_file).at("message").get<std::string>() == "triax rank 0: stop signal: the second report");
  }
  // Attempt 3 reads how attempt 2 ended.
  again.restart_count = 2;
  ElasticRun third(again, dir.path().string(), *world, "tp 1 x pp 1 x dp 1", 1, 0.0);
  CHECK(third.start().attempt == 3);
  CHECK_THAT(third.start().line, Contains("; attempt 2 ended at ") && EndsWith(": rank 0: peer failure: the first report"));
}
