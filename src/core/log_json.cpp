// JSON log records through nlohmann-json (escaping, UTF-8 replacement of invalid bytes).
#include "triax/core/log_json.h"

#include <fmt/chrono.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <ctime>

namespace triax::log {

const char* level_name(Level l) {
  constexpr const char* kNames[] = {"error", "warn", "info", "debug"};
  return kNames[static_cast<int>(l)];
}

std::string json_record(Level l, std::string_view message, std::string_view fields_json, int rank,
                        std::string_view host, double time_unix_s) {
  const double whole = std::floor(time_unix_s);
  const auto secs = static_cast<std::time_t>(whole);
  const int ms = std::min(999, static_cast<int>((time_unix_s - whole) * 1000.0));
  std::tm tm{};
  gmtime_r(&secs, &tm);
  nlohmann::ordered_json j;
  j["time"] = fmt::format("{:%Y-%m-%dT%H:%M:%S}.{:03d}Z", tm, ms);
  j["rank"] = rank;
  j["host"] = std::string(host);
  j["level"] = level_name(l);
  j["message"] = std::string(message);
  if (!fields_json.empty()) {
    auto f = nlohmann::ordered_json::parse(fields_json, nullptr, /*allow_exceptions=*/false);
    if (f.is_discarded() || !f.is_object()) f = nlohmann::ordered_json{{"raw", std::string(fields_json)}};
    j["fields"] = std::move(f);
  } else {
    j["fields"] = nlohmann::ordered_json::object();
  }
  // Invalid UTF-8 in a message must not make the line unparseable (or throw from a logger).
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace triax::log
