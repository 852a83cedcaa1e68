// The planner's CSV tables (published measurements): '#' comments and blank lines skipped, a
// fixed header, cells trimmed, every row with exactly the header's columns. IoError names the
// file and line.
#pragma once
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace triax::plan {

// Calls row(cells, line) for every data row of csv in order. what: the table's name in errors
// ("the SC21 table"). IoError when the file cannot be opened, the header differs from columns, a
// row has another number of cells, or there is no header or no data row.
// `optional_tail`: the last that many columns may be missing from a file's header (tables written
// before those columns existed); their cells are then handed to `row` empty.
void read_csv_table(const std::filesystem::path& csv, const std::vector<std::string>& columns, std::string_view what,
                    const std::function<void(const std::vector<std::string>& cells, int line)>& row,
                    size_t optional_tail = 0);

}  // namespace triax::plan
