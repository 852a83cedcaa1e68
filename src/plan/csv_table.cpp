// One reader for the planner's CSV tables (see csv_table.h).
#include "triax/plan/csv_table.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "triax/core/error.h"

namespace triax::plan {

namespace {
std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  std::string cell;
  while (std::getline(ss, cell, ',')) {
    const auto b = cell.find_first_not_of(" \t\r");
    const auto e = cell.find_last_not_of(" \t\r");
    out.push_back(b == std::string::npos ? "" : cell.substr(b, e - b + 1));
  }
  if (!line.empty() && line.back() == ',') out.push_back("");
  return out;
}
}  // namespace

void read_csv_table(const std::filesystem::path& csv, const std::vector<std::string>& columns, std::string_view what,
                    const std::function<void(const std::vector<std::string>& cells, int line)>& row,
                    size_t optional_tail) {
  const std::string file = csv.string();
  std::ifstream in(csv);
  if (!in) TRIAX_THROW(IoError, "{}: cannot open {}: {}", file, what, std::strerror(errno));
  std::string line;
  int lineno = 0, rows = 0;
  bool header = false;
  size_t width = columns.size();  // the columns this file's header has
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty() || line[0] == '#' || line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto cells = split_csv(line);
    if (!header) {
      const bool prefix = cells.size() <= columns.size() && cells.size() + optional_tail >= columns.size() &&
                          std::equal(cells.begin(), cells.end(), columns.begin());
      if (!prefix) TRIAX_THROW(IoError, "{}:{}: header must be '{}'", file, lineno, fmt::join(columns, ","));
      width = cells.size();
      header = true;
      continue;
    }
    if (cells.size() != width)
      TRIAX_THROW(IoError, "{}:{}: expected {} columns, got {}", file, lineno, width, cells.size());
    std::vector<std::string> full = cells;
    full.resize(columns.size());
    row(full, lineno);
    ++rows;
  }
  if (!header) TRIAX_THROW(IoError, "{}: no header line", file);
  if (rows == 0) TRIAX_THROW(IoError, "{}: no data rows", file);
}

}  // namespace triax::plan
