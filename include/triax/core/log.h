// Rank-aware logging to stderr through fmt. Level from TRIAX_LOG_LEVEL (error|warn|info|debug);
// info by default. Lines carry the world rank so interleaved output of many ranks stays readable;
// TRIAX_LOG_FORMAT=json makes each line one JSON object (log_json.h).
#pragma once
#include <fmt/format.h>

#include <cstdio>
#include <string_view>

namespace triax::log {

enum class Level { error = 0, warn = 1, info = 2, debug = 3 };

Level level();
void set_level(Level l);
// The rank printed in front of every line; -1 prints none (single process).
void set_rank(int rank);
void write(Level l, std::string_view msg);
// A program's own output line (an iteration line, an error report) to `out`: verbatim in the
// text format; in the json format one record with `fields` (a JSON object's text, or "").
void emit(std::FILE* out, Level l, std::string_view text, std::string_view fields_json = {});

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
