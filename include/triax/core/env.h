// The one reader of environment variables: every variable triax reads goes through these
// functions (docs/ENVIRONMENT.md lists them all; tests/house/env_test.sh refuses getenv elsewhere).
// The rules, the same for every variable:
//   - unset: the default (or nullopt from the *_opt readers);
//   - set but empty: a ConfigError (an empty value is never a default in disguise: unset the
//     variable to get the default; presence checks, env_set, count it as set);
//   - a bad value: a ConfigError naming the variable, the value as given and what was expected.
// Values are taken exactly as written: no surrounding whitespace, no '+', decimal integers only,
// and no "inf"/"nan" where a number is expected (so no value ever reaches an undefined cast).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

namespace triax {

// Whether `name` is in the environment at all, even as "" (launcher detection, "did the user
// choose": OMP_NUM_THREADS, NCCL's variables).
bool env_set(const char* name);

// The text of `name`: nullopt when unset, ConfigError when empty. `expected` says what the
// value is for in that message ("a host name or IP address").
std::optional<std::string> env_string_opt(const char* name, std::string_view expected = "a non-empty value");
std::string env_string(const char* name, std::string_view fallback);

// A decimal integer in [lo, hi]. `expected` replaces "an integer in [lo, hi]" in the messages
// where the range has a better name ("0 <= RANK < WORLD_SIZE=4").
std::optional<int64_t> env_int_opt(const char* name, int64_t lo, int64_t hi, std::string_view expected = {});
int64_t env_int(const char* name, int64_t lo, int64_t hi, int64_t fallback);

// A TCP port, 1..65535.
std::optional<int> env_port_opt(const char* name);

// A finite decimal number of seconds in [lo, hi] ("0.5", "30", "1e3"); nan, inf, "12s" and
// values outside the range are ConfigErrors.
std::optional<double> env_seconds_opt(const char* name, double lo, double hi);
double env_seconds(const char* name, double lo, double hi, double fallback);

// A byte count in [lo, hi]: a decimal integer, optionally followed by KiB, MiB or GiB ("64KiB").
std::optional<uint64_t> env_bytes_opt(const char* name, uint64_t lo, uint64_t hi);
uint64_t env_bytes(const char* name, uint64_t lo, uint64_t hi, uint64_t fallback);

// A yes/no switch. Accepted, exactly: 1 true yes on / 0 false no off, each word in lower,
// Capitalised or UPPER case (Python's str(True) is "True", what torchrun writes).
bool env_flag(const char* name, bool fallback);

// One of a fixed set of words, spelled exactly; the messages list them ("auto, mpi or gloo").
std::string env_choice(const char* name, std::initializer_list<std::string_view> choices, std::string_view fallback);

// The parsers behind the readers, for a value already in hand (a piece of a variable, a test):
// `name` is the variable the value came from, for the message.
int64_t parse_env_int(std::string_view name, std::string_view value, int64_t lo, int64_t hi,
                      std::string_view expected = {});
double parse_env_seconds(std::string_view name, std::string_view value, double lo, double hi);
uint64_t parse_env_bytes(std::string_view name, std::string_view value, uint64_t lo, uint64_t hi);
bool parse_env_flag(std::string_view name, std::string_view value);
std::string parse_env_choice(std::string_view name, std::string_view value, std::initializer_list<std::string_view> choices);

// ---- variables read in more than one place: one accessor each ----

// OMP_NUM_THREADS is set (the user chose the OpenMP pool's size; OpenMP itself parses it).
bool omp_threads_chosen_by_user();

}  // namespace triax
