// Prometheus text exposition: validation of metric and label names, escaping, value spelling.
#include "triax/io/prometheus_text.h"

#include <fmt/format.h>

#include <cmath>

#include "triax/core/error.h"

namespace triax::prom {
namespace {

bool valid_name(const std::string& s, bool allow_colon) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (allow_colon && c == ':');
    if (!(alpha || (i > 0 && c >= '0' && c <= '9'))) return false;
  }
  return true;
}

std::string escape_help(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

}  // namespace

std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);  // shortest representation that round-trips
}

std::string escape_label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string render(const std::vector<Family>& families) {
  std::string out;
  for (const auto& f : families) {
    if (!valid_name(f.name, true))
      throw ConfigError(fmt::format("prometheus: '{}' is not a valid metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)", f.name));
    if (f.type != "gauge" && f.type != "counter" && f.type != "untyped")
      throw ConfigError(fmt::format("prometheus: metric {} has type '{}' (valid: gauge, counter, untyped)", f.name, f.type));
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", f.name, escape_help(f.help), f.name, f.type);
    for (const auto& s : f.samples) {
      out += f.name;
      if (!s.labels.empty()) {
        out += '{';
        for (size_t i = 0; i < s.labels.size(); ++i) {
          const auto& [k, v] = s.labels[i];
          if (!valid_name(k, false) || k.rfind("__", 0) == 0)
            throw ConfigError(fmt::format("prometheus: '{}' (metric {}) is not a valid label name", k, f.name));
          out += fmt::format("{}{}=\"{}\"", i ? "," : "", k, escape_label_value(v));
        }
        out += '}';
      }
      out += ' ';
      out += format_value(s.value);
      out += '\n';
    }
  }
  return out;
}

}  // namespace triax::prom
