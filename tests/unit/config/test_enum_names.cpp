// Enum names are written once (core/enum_names.h and the EnumNames specialisations next to each
// enum): every table names each value once, parsing is the inverse of printing, and every user
// (the pipeline, the model, the planner, the option table) spells a value the same way.
#include <catch2/catch.hpp>

#include <set>
#include <type_traits>

#include "triax/config/train_config.h"
#include "triax/plan/layout.h"

using namespace triax;
using Catch::Contains;

namespace {

// Each value of E (0 .. count-1) is in the table exactly once, under a distinct name that parses
// back to it; an unknown name is a ConfigError listing every choice.
template <class E>
void check_table(int count) {
  const auto& t = EnumNames<E>::table;
  CHECK(static_cast<int>(t.size()) == count);
  std::set<std::string_view> names;
  std::set<int> values;
  for (const auto& e : t) {
    INFO(e.name);
    names.insert(e.name);
    values.insert(static_cast<int>(e.value));
    CHECK(enum_name(e.value) == e.name);
    CHECK(parse_enum<E>(e.name) == e.value);
  }
  CHECK(names.size() == t.size());
  CHECK(values.size() == t.size());
  CHECK(*values.begin() == 0);
  CHECK(*values.rbegin() == count - 1);
  CHECK_THROWS_WITH(parse_enum<E>("no-such-name"),
                    Contains(fmt::format("unknown {} 'no-such-name'; expected one of: {}", EnumNames<E>::what,
                                         enum_choices<E>())));
}

}  // namespace

TEST_CASE("enum names: one table per enum, printing and parsing are inverses", "[config]") {
  check_table<ScheduleKind>(4);
  check_table<Recompute>(3);
  check_table<LrDecay>(3);
  check_table<BackendKind>(4);
  check_table<ConfigSection>(8);
  CHECK(enum_choices<ScheduleKind>() == "gpipe, 1f1b, interleaved, zb-h1");
}

TEST_CASE("enum names: the planner, the runtime and the option table spell values alike", "[config]") {
  // The planner prices the runtime's schedules and recomputation modes: the same types, one table.
  STATIC_REQUIRE(std::is_same_v<plan::Schedule, ScheduleKind>);
  STATIC_REQUIRE(std::is_same_v<plan::Recompute, Recompute>);
  for (const auto& e : EnumNames<ScheduleKind>::table) {
    CHECK(plan::to_string(e.value) == e.name);
    CHECK(schedule_kind_name(e.value) == e.name);
    CHECK(plan::parse_schedule(e.name) == e.value);
    CHECK(parse_schedule_kind(e.name) == e.value);
  }
  for (const auto& e : EnumNames<Recompute>::table) {
    CHECK(plan::to_string(e.value) == e.name);
    CHECK(recompute_name(e.value) == e.name);
    CHECK(plan::parse_recompute(e.name) == e.value);
    CHECK(parse_recompute(e.name) == e.value);
  }
  // The options' valid ranges (--help, error messages) are the tables' names.
  CHECK(find_train_option("schedule")->range == "one of " + enum_choices<ScheduleKind>());
  CHECK(find_train_option("recompute")->range == "one of " + enum_choices<Recompute>());
  CHECK(find_train_option("lr-decay-style")->range == "one of " + enum_choices<LrDecay>());
  CHECK(find_train_option("backend")->range == "one of " + enum_choices<BackendKind>());
  // Every name the table holds is accepted by the option (and printed back the same).
  for (const auto& e : EnumNames<ScheduleKind>::table) {
    TrainConfig c;
    apply_config_text(c, fmt::format("[parallel]\nschedule = \"{}\"\n", e.name), "s.toml");
    CHECK(c.schedule == e.value);
    CHECK(*find_train_option("schedule")->toml(c) == fmt::format("\"{}\"", e.name));
  }
}
