// Slurm's compact host-list syntax, expanded without Slurm's library (which a worker image may
// not carry): entries split on commas outside brackets, each bracket a list of numbers/ranges.
#include <fmt/format.h>

#include <charconv>

#include "triax/core/error.h"
#include "triax/distributed/bootstrap/slurm.h"

namespace triax {
namespace {

constexpr size_t kMaxHosts = 1 << 20;

[[noreturn]] void bad(std::string_view list, size_t pos, std::string_view why) {
  TRIAX_THROW(ConfigError, "Slurm host list '{}': {} at position {} (expected e.g. 'node[01-04,07],login1')", list,
              why, pos);
}

// "01-03,7" -> {"01","02","03","7"}
std::vector<std::string> expand_ranges(std::string_view list, std::string_view body, size_t at) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= body.size()) {
    const size_t comma = std::min(body.find(',', i), body.size());
    const std::string_view part = body.substr(i, comma - i);
    if (part.empty()) bad(list, at + i, "an empty range");
    const size_t dash = part.find('-');
    const std::string_view lo_s = part.substr(0, dash);
    const std::string_view hi_s = dash == std::string_view::npos ? lo_s : part.substr(dash + 1);
    auto num = [&](std::string_view s, size_t off) {
      unsigned long long v = 0;
      const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      if (s.empty() || ec != std::errc() || p != s.data() + s.size()) bad(list, at + i + off, fmt::format("'{}' is not a number", s));
      return v;
    };
    const auto lo = num(lo_s, 0);
    const auto hi = num(hi_s, dash == std::string_view::npos ? 0 : dash + 1);
    if (hi < lo) bad(list, at + i, fmt::format("range {}-{} runs backwards", lo_s, hi_s));
    if (hi - lo >= kMaxHosts) bad(list, at + i, fmt::format("range {}-{} is larger than {} hosts", lo_s, hi_s, kMaxHosts));
    const size_t width = lo_s.size() > 1 && lo_s[0] == '0' ? lo_s.size() : 0;
    for (auto v = lo; v <= hi; ++v) out.push_back(fmt::format("{:0{}}", v, width));
    i = comma + 1;
  }
  return out;
}

}  // namespace

std::vector<std::string> expand_slurm_hostlist(std::string_view list) {
  std::vector<std::string> hosts;
  size_t i = 0;
  if (list.empty()) bad(list, 0, "an empty list");
  while (i <= list.size()) {
    // One entry: text and bracket groups up to a comma outside brackets.
    std::vector<std::string> partial{""};
    const size_t start = i;
    while (i < list.size() && list[i] != ',') {
      if (list[i] == '[') {
        const size_t close = list.find(']', i);
        if (close == std::string_view::npos) bad(list, i, "an unclosed '['");
        const std::string_view body = list.substr(i + 1, close - i - 1);
        if (body.find('[') != std::string_view::npos) bad(list, i, "a nested '['");
        const auto nums = expand_ranges(list, body, i + 1);
        std::vector<std::string> next;
        if (partial.size() * nums.size() > kMaxHosts) bad(list, i, fmt::format("more than {} hosts", kMaxHosts));
        for (const auto& p : partial)
          for (const auto& n : nums) next.push_back(p + n);
        partial = std::move(next);
        i = close + 1;
      } else if (list[i] == ']') {
        bad(list, i, "a ']' without '['");
      } else if (list[i] == ' ' || list[i] == '\t' || list[i] == '\n') {
        bad(list, i, "white space");
      } else {
        for (auto& p : partial) p += list[i];
        ++i;
      }
    }
    if (i == start) bad(list, i, "an empty entry");
    // Slurm (22.05) accepts text after a range only when another range follows ('r[1-2]-n[1-2]'),
    // not 'n[1-2]-ib': refuse it too, so triax never expands a list Slurm would not have given.
    const std::string_view entry = list.substr(start, i - start);
    const size_t last_close = entry.rfind(']');
    if (last_close != std::string_view::npos && last_close + 1 < entry.size())
      bad(list, start + last_close + 1, "text after the last range");
    hosts.insert(hosts.end(), partial.begin(), partial.end());
    if (hosts.size() > kMaxHosts) bad(list, i, fmt::format("more than {} hosts", kMaxHosts));
    ++i;  // past the comma (or the end)
  }
  return hosts;
}

}  // namespace triax
