// The one reader of environment variables (core/env.h): the only getenv in triax, and the only
// place that turns an environment value into a number. The log reads its variables during static
// initialisation, so nothing here may depend on a static object of this file.
#include "triax/core/env.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "triax/core/error.h"

namespace triax {
namespace {

[[noreturn]] void refuse(std::string_view name, std::string_view value, std::string_view problem,
                         std::string_view expected) {
  TRIAX_THROW(ConfigError, "{}='{}' {}; expected {}", name, value, problem, expected);
}

// The whole value as one T (std::from_chars: decimal, no blanks, no '+'), refused when empty,
// malformed (`not_a`) or beyond T.
template <class T, class... Format>
T whole_number(std::string_view name, std::string_view value, const std::string& exp, std::string_view not_a,
               Format... format) {
  if (value.empty()) refuse(name, value, "is set but empty", exp);
  T v{};
  const char* end = value.data() + value.size();
  const auto [ptr, ec] = std::from_chars(value.data(), end, v, format...);
  if (ec == std::errc::result_out_of_range) refuse(name, value, "is out of range", exp);
  if (ec != std::errc() || ptr != end) refuse(name, value, not_a, exp);
  return v;
}

std::string int_range(int64_t lo, int64_t hi) { return fmt::format("an integer in [{}, {}]", lo, hi); }
std::string seconds_range(double lo, double hi) { return fmt::format("a number of seconds in [{}, {}]", lo, hi); }
std::string bytes_range(uint64_t lo, uint64_t hi) {
  return fmt::format("a byte count in [{}, {}] (an integer, optionally followed by KiB, MiB or GiB)", lo, hi);
}

// "a, b or c"
std::string listed(std::initializer_list<std::string_view> words) {
  std::string out;
  size_t i = 0;
  for (std::string_view w : words) {
    if (i > 0) out += i + 1 == words.size() ? " or " : ", ";
    out += w;
    ++i;
  }
  return out;
}

constexpr std::string_view kTrue[] = {"1", "true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
constexpr std::string_view kFalse[] = {"0", "false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"};
constexpr std::string_view kFlagWords = "1, true, yes, on, 0, false, no or off (lower, Capitalised or UPPER case)";

}  // namespace

int64_t parse_env_int(std::string_view name, std::string_view value, int64_t lo, int64_t hi, std::string_view expected) {
  const std::string exp = expected.empty() ? int_range(lo, hi) : std::string(expected);
  const auto v = whole_number<int64_t>(name, value, exp, "is not an integer");
  if (v < lo || v > hi) refuse(name, value, "is out of range", exp);
  return v;
}

double parse_env_seconds(std::string_view name, std::string_view value, double lo, double hi) {
  const std::string exp = seconds_range(lo, hi);
  const auto v = whole_number<double>(name, value, exp, "is not a number of seconds", std::chars_format::general);
  // from_chars reads "inf" and "nan": neither is a duration (and inf would reach an int cast).
  if (!std::isfinite(v)) refuse(name, value, "is not a finite number of seconds", exp);
  if (!(v >= lo && v <= hi)) refuse(name, value, "is out of range", exp);
  return v;
}

uint64_t parse_env_bytes(std::string_view name, std::string_view value, uint64_t lo, uint64_t hi) {
  const std::string exp = bytes_range(lo, hi);
  if (value.empty()) refuse(name, value, "is set but empty", exp);
  uint64_t v = 0;
  const char* end = value.data() + value.size();
  const auto [ptr, ec] = std::from_chars(value.data(), end, v);
  if (ec == std::errc::result_out_of_range) refuse(name, value, "is out of range", exp);
  if (ec != std::errc()) refuse(name, value, "is not a byte count", exp);
  const std::string_view unit(ptr, static_cast<size_t>(end - ptr));
  uint64_t scale = 1;
  if (unit == "KiB") scale = uint64_t{1} << 10;
  else if (unit == "MiB") scale = uint64_t{1} << 20;
  else if (unit == "GiB") scale = uint64_t{1} << 30;
  else if (!unit.empty()) refuse(name, value, "is not a byte count", exp);
  if (v > std::numeric_limits<uint64_t>::max() / scale) refuse(name, value, "is out of range", exp);
  v *= scale;
  if (v < lo || v > hi) refuse(name, value, "is out of range", exp);
  return v;
}

bool parse_env_flag(std::string_view name, std::string_view value) {
  for (std::string_view t : kTrue)
    if (value == t) return true;
  for (std::string_view f : kFalse)
    if (value == f) return false;
  refuse(name, value, value.empty() ? "is set but empty" : "is not a flag", kFlagWords);
}

std::string parse_env_choice(std::string_view name, std::string_view value, std::initializer_list<std::string_view> choices) {
  for (std::string_view c : choices)
    if (value == c) return std::string(c);
  refuse(name, value, value.empty() ? "is set but empty" : "is not a choice", listed(choices));
}

bool env_set(const char* name) { return std::getenv(name) != nullptr; }

namespace {
// Unset: nullopt; set: the value through `parse` (which refuses "" like any bad value).
template <class Parse>
auto if_set(const char* name, Parse parse) -> std::optional<decltype(parse(std::string_view{}))> {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  return parse(std::string_view(v));
}
}  // namespace

std::optional<std::string> env_string_opt(const char* name, std::string_view expected) {
  return if_set(name, [&](std::string_view v) {
    if (v.empty()) refuse(name, v, "is set but empty", expected);
    return std::string(v);
  });
}

std::string env_string(const char* name, std::string_view fallback) {
  return env_string_opt(name).value_or(std::string(fallback));
}

std::optional<int64_t> env_int_opt(const char* name, int64_t lo, int64_t hi, std::string_view expected) {
  return if_set(name, [&](std::string_view v) { return parse_env_int(name, v, lo, hi, expected); });
}

int64_t env_int(const char* name, int64_t lo, int64_t hi, int64_t fallback) {
  return env_int_opt(name, lo, hi).value_or(fallback);
}

std::optional<int> env_port_opt(const char* name) {
  const std::string expected = fmt::format("a TCP port, 1 <= {} <= 65535", name);
  return if_set(name, [&](std::string_view v) { return static_cast<int>(parse_env_int(name, v, 1, 65535, expected)); });
}

std::optional<double> env_seconds_opt(const char* name, double lo, double hi) {
  return if_set(name, [&](std::string_view v) { return parse_env_seconds(name, v, lo, hi); });
}

double env_seconds(const char* name, double lo, double hi, double fallback) {
  return env_seconds_opt(name, lo, hi).value_or(fallback);
}

std::optional<uint64_t> env_bytes_opt(const char* name, uint64_t lo, uint64_t hi) {
  return if_set(name, [&](std::string_view v) { return parse_env_bytes(name, v, lo, hi); });
}

uint64_t env_bytes(const char* name, uint64_t lo, uint64_t hi, uint64_t fallback) {
  return env_bytes_opt(name, lo, hi).value_or(fallback);
}

bool env_flag(const char* name, bool fallback) {
  return if_set(name, [&](std::string_view v) { return parse_env_flag(name, v); }).value_or(fallback);
}

std::string env_choice(const char* name, std::initializer_list<std::string_view> choices, std::string_view fallback) {
  return if_set(name, [&](std::string_view v) { return parse_env_choice(name, v, choices); })
      .value_or(std::string(fallback));
}

bool omp_threads_chosen_by_user() { return env_set("OMP_NUM_THREADS"); }

}  // namespace triax
