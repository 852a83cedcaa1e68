// Rank-prefixed stderr logging; one fwrite per line so lines of different ranks do not tear.
#include "triax/core/log.h"

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
constexpr const char* kNames[] = {"E", "W", "I", "D"};
}  // namespace

Level level() { return static_cast<Level>(g_level.load(std::memory_order_relaxed)); }
void set_level(Level l) { g_level = static_cast<int>(l); }
void set_rank(int rank) { g_rank = rank; }

void write(Level l, std::string_view msg) {
  std::string line;
  const int r = g_rank.load();
  if (r >= 0)
    line = fmt::format("[triax {} r{}] {}\n", kNames[static_cast<int>(l)], r, msg);
  else
    line = fmt::format("[triax {}] {}\n", kNames[static_cast<int>(l)], msg);
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace triax::log
