// Rank-prefixed stderr logging (or JSON records); one fwrite per line so lines of different ranks
// do not tear.
#include "triax/core/log.h"

#include <unistd.h>

#include <chrono>

#include "triax/core/env.h"
#include "triax/core/error.h"
#include "triax/core/log_json.h"

#include <atomic>
#include <cstdio>
#include <string>

namespace triax::log {
namespace {
// The log's variables are read while statics are initialised, where nobody could catch: a bad
// value (core/env.h's rules) becomes a warning on the first line written, and the default.
std::atomic<bool> g_env_warned{false};
std::string& env_warnings() {
  static std::string w;
  return w;
}
std::string choice_or_warn(const char* name, std::initializer_list<std::string_view> choices, std::string_view fallback) {
  try {
    return env_choice(name, choices, fallback);
  } catch (const ConfigError& e) {
    env_warnings() += fmt::format("[triax W] {}: using {}\n", e.what(), fallback);
    g_env_warned = true;
    return std::string(fallback);
  }
}
Level initial_level() {
  const std::string v = choice_or_warn("TRIAX_LOG_LEVEL", {"error", "warn", "info", "debug"}, "info");
  return v == "error" ? Level::error : v == "warn" ? Level::warn : v == "debug" ? Level::debug : Level::info;
}
std::atomic<int> g_level{static_cast<int>(initial_level())};
std::atomic<int> g_rank{-1};
Format initial_format() {
  return choice_or_warn("TRIAX_LOG_FORMAT", {"text", "json"}, "text") == "json" ? Format::json : Format::text;
}
std::atomic<int> g_format{static_cast<int>(initial_format())};
const std::string& host_name() {
  static const std::string h = [] {
    char buf[256] = {};
    return gethostname(buf, sizeof(buf) - 1) == 0 ? std::string(buf) : std::string("unknown");
  }();
  return h;
}
double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
void put(std::FILE* out, const std::string& line) { std::fwrite(line.data(), 1, line.size(), out); }
void warn_bad_env() {
  if (g_env_warned.exchange(false)) put(stderr, env_warnings());
}
constexpr const char* kNames[] = {"E", "W", "I", "D"};
}  // namespace

Level level() { return static_cast<Level>(g_level.load(std::memory_order_relaxed)); }
void set_level(Level l) { g_level = static_cast<int>(l); }
void set_rank(int rank) {
  g_rank = rank;
  warn_bad_env();  // programs set the rank first thing: a bad TRIAX_LOG_* shows even if nothing logs
}

Format format() { return static_cast<Format>(g_format.load(std::memory_order_relaxed)); }
void set_format(Format f) { g_format = static_cast<int>(f); }

void emit(std::FILE* out, Level l, std::string_view text, std::string_view fields_json) {
  warn_bad_env();
  if (format() == Format::json) {
    put(out, json_record(l, text, fields_json, std::max(0, g_rank.load()), host_name(), now_s()) + "\n");
  } else {
    put(out, fmt::format("{}\n", text));
  }
  std::fflush(out);
}

void write(Level l, std::string_view msg) {
  warn_bad_env();
  if (format() == Format::json) {
    put(stderr, json_record(l, msg, {}, std::max(0, g_rank.load()), host_name(), now_s()) + "\n");
    return;
  }
  std::string line;
  const int r = g_rank.load();
  if (r >= 0)
    line = fmt::format("[triax {} r{}] {}\n", kNames[static_cast<int>(l)], r, msg);
  else
    line = fmt::format("[triax {}] {}\n", kNames[static_cast<int>(l)], msg);
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace triax::log
