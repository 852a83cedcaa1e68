// Prometheus text exposition format (version 0.0.4): families of gauges and counters with
// # HELP / # TYPE lines, escaped label values and Go-compatible float spellings (NaN, +Inf).
// Pure formatting, no I/O: what /metrics serves and what node exporter's textfile collector reads.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace triax::prom {

using Labels = std::vector<std::pair<std::string, std::string>>;

struct Sample {
  Labels labels;
  double value = 0;
};

struct Family {
  std::string name;  // [a-zA-Z_:][a-zA-Z0-9_:]*; ConfigError otherwise
  std::string help;
  std::string type;  // gauge | counter | untyped
  std::vector<Sample> samples;
};

// A value as Prometheus parses it back exactly: shortest round-trip decimal, NaN, +Inf, -Inf.
std::string format_value(double v);
// Backslash, double quote and newline escaped as the format requires.
std::string escape_label_value(const std::string& v);
// All families, in order, each with its HELP and TYPE lines; validates names and types.
std::string render(const std::vector<Family>& families);

}  // namespace triax::prom
