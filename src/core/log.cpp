// Rank-prefixed stderr logging (or JSON records); one fwrite per line so lines of different ranks
// do not tear.
#include "triax/core/log.h"

#include <unistd.h>

#include <chrono>

#include "triax/core/log_json.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace triax::log {
namespace {
Level initial_level() {
  const char* s = std::getenv("TRIAX_LOG_LEVEL");
  if (!s) return Level::info;
  const std::string v(s);
  if (v == "error") return Level::error;
  if (v == "warn") return Level::warn;
  if (v == "debug") return Level::debug;
  return Level::info;
}
std::atomic<int> g_level{static_cast<int>(initial_level())};
std::atomic<int> g_rank{-1};
std::atomic<bool> g_format_warned{false};
Format initial_format() {
  const char* s = std::getenv("TRIAX_LOG_FORMAT");
  if (!s || std::string(s) == "text" || !*s) return Format::text;
  if (std::string(s) == "json") return Format::json;
  g_format_warned = true;  // reported on the first line written
  return Format::text;
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
void warn_bad_format() {
  if (g_format_warned.exchange(false))
    put(stderr, fmt::format("[triax W] TRIAX_LOG_FORMAT='{}' is neither text nor json: using text\n",
                            std::getenv("TRIAX_LOG_FORMAT")));
}
constexpr const char* kNames[] = {"E", "W", "I", "D"};
}  // namespace

Level level() { return static_cast<Level>(g_level.load(std::memory_order_relaxed)); }
void set_level(Level l) { g_level = static_cast<int>(l); }
void set_rank(int rank) { g_rank = rank; }

Format format() { return static_cast<Format>(g_format.load(std::memory_order_relaxed)); }
void set_format(Format f) { g_format = static_cast<int>(f); }

void emit(std::FILE* out, Level l, std::string_view text, std::string_view fields_json) {
  warn_bad_format();
  if (format() == Format::json) {
    put(out, json_record(l, text, fields_json, std::max(0, g_rank.load()), host_name(), now_s()) + "\n");
  } else {
    put(out, fmt::format("{}\n", text));
  }
  std::fflush(out);
}

void write(Level l, std::string_view msg) {
  warn_bad_format();
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
