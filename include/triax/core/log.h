// Rank-aware logging to stderr through fmt. Level from TRIAX_LOG_LEVEL (error|warn|info|debug);
// info by default. Lines carry the world rank so interleaved output of many ranks stays readable.
#pragma once
#include <fmt/format.h>

#include <string_view>

namespace triax::log {

enum class Level { error = 0, warn = 1, info = 2, debug = 3 };

Level level();
void set_level(Level l);
// The rank printed in front of every line; -1 prints none (single process).
void set_rank(int rank);
void write(Level l, std::string_view msg);

template <class... Args>
void info(fmt::format_string<Args...> f, Args&&... a) {
  if (level() >= Level::info) write(Level::info, fmt::format(f, std::forward<Args>(a)...));
}
template <class... Args>
void warn(fmt::format_string<Args...> f, Args&&... a) {
  if (level() >= Level::warn) write(Level::warn, fmt::format(f, std::forward<Args>(a)...));
}
template <class... Args>
void error(fmt::format_string<Args...> f, Args&&... a) {
  write(Level::error, fmt::format(f, std::forward<Args>(a)...));
}
template <class... Args>
void debug(fmt::format_string<Args...> f, Args&&... a) {
  if (level() >= Level::debug) write(Level::debug, fmt::format(f, std::forward<Args>(a)...));
}

}  // namespace triax::log
