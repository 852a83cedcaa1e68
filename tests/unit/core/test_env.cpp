// core/env.h, the one reader of environment variables: each parser on good values, both bounds,
// fractions, words, "inf"/"nan", the empty string, signs, huge values and whitespace; the readers'
// unset -> default and set-but-empty -> error rule; messages that name the variable, the value
// and what was expected. Then the readers of the tree that use it (TRIAX_COMM_TIMEOUT_S, TRIAX_COMM).
#include <catch2/catch.hpp>
#include <stdlib.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <thread>

#include "triax/core/clock.h"
#include "triax/core/env.h"
#include "triax/core/error.h"
#include "triax/distributed/comm/comm.h"
#include "triax/distributed/comm/host_comm.h"
#include "support/scoped_env.h"

using namespace triax;
using Catch::Matchers::Contains;

namespace {
constexpr const char* kVar = "TRIAX_TEST_ENV_VALUE";

using triax::testing::ScopedEnv;

// The ConfigError's message for f(), or "" when f() did not throw one.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("parse_env_int: whole decimal integers within both bounds, nothing else", "[env]") {
  CHECK(parse_env_int("V", "0", 0, 10) == 0);
  CHECK(parse_env_int("V", "10", 0, 10) == 10);
  CHECK(parse_env_int("V", "-3", -5, 5) == -3);
  CHECK(parse_env_int("V", "-0", -5, 5) == 0);
  CHECK(parse_env_int("V", "9223372036854775807", 0, INT64_MAX) == INT64_MAX);
  CHECK(parse_env_int("V", "-9223372036854775808", INT64_MIN, 0) == INT64_MIN);

  CHECK_THAT(error_of([] { parse_env_int("V", "11", 0, 10); }), Contains("V='11' is out of range; expected an integer in [0, 10]"));
  CHECK_THAT(error_of([] { parse_env_int("V", "-1", 0, 10); }), Contains("V='-1' is out of range; expected an integer in [0, 10]"));
  CHECK_THAT(error_of([] { parse_env_int("V", "99999999999999999999", 0, 10); }),
             Contains("V='99999999999999999999' is out of range"));
  CHECK_THAT(error_of([] { parse_env_int("V", "-99999999999999999999", INT64_MIN, 10); }), Contains("is out of range"));
  for (const char* bad : {"abc", "0.5", "1e3", "0x10", "+1", " 1", "1 ", "1\n", "\t1", "inf", "nan", "-", "1_000", "12s"}) {
    INFO(bad);
    CHECK_THAT(error_of([&] { parse_env_int("V", bad, 0, 10'000); }),
               Contains(std::string("V='") + bad + "' is not an integer; expected an integer in [0, 10000]"));
  }
  CHECK_THAT(error_of([] { parse_env_int("V", "", 0, 10); }), Contains("V='' is set but empty; expected an integer in [0, 10]"));
  // A caller's name for the range replaces the bounds in the message.
  CHECK_THAT(error_of([] { parse_env_int("RANK", "4", 0, 3, "0 <= RANK < WORLD_SIZE=4"); }),
             Contains("RANK='4' is out of range; expected 0 <= RANK < WORLD_SIZE=4"));
}

TEST_CASE("parse_env_seconds: finite decimal seconds within both bounds", "[env]") {
  CHECK(parse_env_seconds("T", "0.5", 0.001, 100) == 0.5);
  CHECK(parse_env_seconds("T", "30", 0.001, 100) == 30.0);
  CHECK(parse_env_seconds("T", ".25", 0.001, 100) == 0.25);
  CHECK(parse_env_seconds("T", "1e1", 0.001, 100) == 10.0);
  CHECK(parse_env_seconds("T", "0.001", 0.001, 100) == 0.001);
  CHECK(parse_env_seconds("T", "100", 0.001, 100) == 100.0);
  CHECK(parse_env_seconds("T", "0", 0, 100) == 0.0);

  for (const char* bad : {"inf", "-inf", "infinity", "nan", "NaN", "-nan"}) {
    INFO(bad);
    CHECK_THAT(error_of([&] { parse_env_seconds("T", bad, 0.001, 100); }),
               Contains(std::string("T='") + bad + "' is not a finite number of seconds; expected a number of seconds in [0.001, 100]"));
  }
  for (const char* bad : {"abc", "12s", "1,5", " 1", "1 ", "+1", "0x10", "1e", "--1"}) {
    INFO(bad);
    CHECK_THAT(error_of([&] { parse_env_seconds("T", bad, 0.001, 100); }),
               Contains(std::string("T='") + bad + "' is not a number of seconds"));
  }
  for (const char* bad : {"0", "-1", "0.0009", "100.5", "1e300", "1e999"}) {
    INFO(bad);
    CHECK_THAT(error_of([&] { parse_env_seconds("T", bad, 0.001, 100); }),
               Contains(std::string("T='") + bad + "' is out of range; expected a number of seconds in [0.001, 100]"));
  }
  CHECK_THAT(error_of([] { parse_env_seconds("T", "", 0.001, 100); }), Contains("T='' is set but empty"));
}

TEST_CASE("parse_env_bytes: integers with an optional KiB, MiB or GiB", "[env]") {
  CHECK(parse_env_bytes("B", "0", 0, UINT64_MAX) == 0);
  CHECK(parse_env_bytes("B", "65536", 0, UINT64_MAX) == 65536);
  CHECK(parse_env_bytes("B", "64KiB", 0, UINT64_MAX) == 65536);
  CHECK(parse_env_bytes("B", "3MiB", 0, UINT64_MAX) == 3u << 20);
  CHECK(parse_env_bytes("B", "2GiB", 0, UINT64_MAX) == uint64_t{2} << 30);
  CHECK(parse_env_bytes("B", "18446744073709551615", 0, UINT64_MAX) == UINT64_MAX);
  CHECK(parse_env_bytes("B", "1KiB", 1024, 1024) == 1024);

  for (const char* bad : {"abc", "-1", "0.5", "64K", "64 KiB", "64kib", "KiB", " 1", "1 ", "inf", "nan", "+1"}) {
    INFO(bad);
    CHECK_THAT(error_of([&] { parse_env_bytes("B", bad, 0, UINT64_MAX); }),
               Contains(std::string("B='") + bad + "' is not a byte count"));
  }
  CHECK_THAT(error_of([] { parse_env_bytes("B", "18446744073709551616", 0, UINT64_MAX); }), Contains("is out of range"));
  CHECK_THAT(error_of([] { parse_env_bytes("B", "17179869184GiB", 0, UINT64_MAX); }), Contains("is out of range"));  // 2^64
  CHECK_THAT(error_of([] { parse_env_bytes("B", "1025", 0, 1024); }), Contains("B='1025' is out of range; expected a byte count in [0, 1024]"));
  CHECK_THAT(error_of([] { parse_env_bytes("B", "2KiB", 0, 1024); }), Contains("B='2KiB' is out of range"));
  CHECK_THAT(error_of([] { parse_env_bytes("B", "", 0, 1024); }), Contains("B='' is set but empty"));
}

TEST_CASE("parse_env_flag: the listed spellings only", "[env]") {
  for (const char* yes : {"1", "true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"}) {
    INFO(yes);
    CHECK(parse_env_flag("F", yes));
  }
  for (const char* no : {"0", "false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"}) {
    INFO(no);
    CHECK_FALSE(parse_env_flag("F", no));
  }
  for (const char* bad : {"2", "-1", "tRuE", "y", "n", " 1", "1 ", "enable", "0.5", "abc", "inf", "nan"}) {
    INFO(bad);
    CHECK_THAT(error_of([&] { parse_env_flag("F", bad); }),
               Contains(std::string("F='") + bad + "' is not a flag; expected 1, true, yes, on, 0, false, no or off"));
  }
  CHECK_THAT(error_of([] { parse_env_flag("F", ""); }), Contains("F='' is set but empty"));
}

TEST_CASE("parse_env_choice: exact words, listed in the message", "[env]") {
  CHECK(parse_env_choice("C", "gloo", {"auto", "mpi", "gloo"}) == "gloo");
  for (const char* bad : {"GLOO", "nccl", " mpi", "mpi ", "", "auto,mpi"}) {
    INFO(bad);
    CHECK_THAT(error_of([&] { parse_env_choice("C", bad, {"auto", "mpi", "gloo"}); }),
               Contains(std::string("C='") + bad + "'") && Contains("expected auto, mpi or gloo"));
  }
}

TEST_CASE("the readers: unset gives the default, empty is an error, a value is parsed", "[env]") {
  {
    ScopedEnv e(kVar, std::nullopt);
    CHECK_FALSE(env_set(kVar));
    CHECK(env_int(kVar, 0, 10, 7) == 7);
    CHECK(env_int_opt(kVar, 0, 10) == std::nullopt);
    CHECK(env_seconds(kVar, 0.001, 10, 2.5) == 2.5);
    CHECK(env_bytes(kVar, 0, 100, 42) == 42);
    CHECK(env_flag(kVar, true));
    CHECK_FALSE(env_flag(kVar, false));
    CHECK(env_choice(kVar, {"a", "b"}, "b") == "b");
    CHECK(env_string(kVar, "fallback") == "fallback");
    CHECK(env_string_opt(kVar) == std::nullopt);
    CHECK(env_port_opt(kVar) == std::nullopt);
  }
  {
    ScopedEnv e(kVar, "");
    CHECK(env_set(kVar));  // present: launcher detection sees it
    const std::string empty = std::string(kVar) + "='' is set but empty";
    CHECK_THAT(error_of([] { env_int(kVar, 0, 10, 7); }), Contains(empty));
    CHECK_THAT(error_of([] { env_seconds(kVar, 0.001, 10, 2.5); }), Contains(empty));
    CHECK_THAT(error_of([] { env_bytes(kVar, 0, 100, 42); }), Contains(empty));
    CHECK_THAT(error_of([] { env_flag(kVar, true); }), Contains(empty));
    CHECK_THAT(error_of([] { env_choice(kVar, {"a", "b"}, "b"); }), Contains(empty));
    CHECK_THAT(error_of([] { env_string(kVar, "fallback"); }), Contains(empty));
    CHECK_THAT(error_of([] { env_string_opt(kVar, "a host name"); }), Contains(empty + "; expected a host name"));
    CHECK_THAT(error_of([] { env_port_opt(kVar); }), Contains(empty));
  }
  {
    ScopedEnv e(kVar, "5");
    CHECK(env_int(kVar, 0, 10, 7) == 5);
    CHECK(env_seconds(kVar, 0.001, 10, 2.5) == 5.0);
    CHECK(env_bytes(kVar, 0, 100, 42) == 5);
    CHECK(env_string(kVar, "fallback") == "5");
    CHECK(env_port_opt(kVar) == 5);
    CHECK_THAT(error_of([] { env_int(kVar, 6, 10, 7); }), Contains("TRIAX_TEST_ENV_VALUE='5' is out of range; expected an integer in [6, 10]"));
    CHECK_THAT(error_of([] { env_flag(kVar, true); }), Contains("TRIAX_TEST_ENV_VALUE='5' is not a flag"));
  }
  {
    ScopedEnv e(kVar, "65536");
    CHECK_THAT(error_of([] { env_port_opt(kVar); }),
               Contains("TRIAX_TEST_ENV_VALUE='65536' is out of range; expected a TCP port, 1 <= TRIAX_TEST_ENV_VALUE <= 65535"));
  }
  {
    ScopedEnv e(kVar, "inf");
    CHECK_THAT(error_of([] { env_seconds(kVar, 0.001, 10, 2.5); }), Contains("is not a finite number of seconds"));
    CHECK_THAT(error_of([] { env_int(kVar, 0, 10, 7); }), Contains("is not an integer"));
  }
  {
    ScopedEnv e(kVar, "yes");
    CHECK(env_flag(kVar, false));
  }
}

TEST_CASE("TRIAX_COMM_TIMEOUT_S: fractions count, words and non-finite values are refused", "[env][comm]") {
  {
    ScopedEnv e("TRIAX_COMM_TIMEOUT_S", "0.5");
    CHECK(default_comm_timeout() == std::chrono::milliseconds(500));  // atoi made this 1 s in checkpoint.cpp
  }
  {
    ScopedEnv e("TRIAX_COMM_TIMEOUT_S", "0.001");
    CHECK(default_comm_timeout() == std::chrono::milliseconds(1));
  }
  for (const char* bad : {"abc", "inf", "nan", "-1", "0", "0.0001", "1e300", "", " 5", "5 "}) {
    INFO(bad);
    ScopedEnv e("TRIAX_COMM_TIMEOUT_S", bad);
    CHECK_THAT(error_of([] { default_comm_timeout(); }), Contains(std::string("TRIAX_COMM_TIMEOUT_S='") + bad + "'") &&
                                                             Contains("expected a number of seconds in [0.001, 10000000]"));
  }
  ScopedEnv e("TRIAX_COMM_TIMEOUT_S", std::nullopt);
  CHECK(default_comm_timeout() == std::chrono::milliseconds(600'000));
}

TEST_CASE("TRIAX_COMM: auto, mpi or gloo; empty is an error like every other variable", "[env][comm]") {
  {
    ScopedEnv e("TRIAX_COMM", std::nullopt);
    CHECK(host_comm_choice() == HostComm::automatic);
  }
  {
    ScopedEnv e("TRIAX_COMM", "gloo");
    CHECK(host_comm_choice() == HostComm::gloo);
  }
  {
    ScopedEnv e("TRIAX_COMM", "");
    CHECK_THROWS_AS(host_comm_choice(), ConfigError);
  }
}

TEST_CASE("since: steady-clock seconds", "[clock]") {
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const double s = since(t0);
  CHECK(s >= 0.02);
  CHECK(s < 10.0);
}
