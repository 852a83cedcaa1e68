// Device classes against --dp-microbatches and --stage-classes (config/hetero.h).
#include "triax/config/hetero.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "triax/core/error.h"

namespace triax {
namespace {

std::string ranks_text(const std::vector<int>& ranks) {
  // Consecutive runs as a-b: "0-3,8".
  std::vector<std::string> parts;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    parts.push_back(j == i ? std::to_string(ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]));
    i = j + 1;
  }
  return fmt::format("{}", fmt::join(parts, ","));
}

// The classes of a set of ranks, each with its ranks: "fast (ranks 0,2) and slow (ranks 1)".
std::string classes_of(const std::vector<int>& ranks, const std::vector<std::string>& cls) {
  std::map<std::string, std::vector<int>> by;
  for (int r : ranks) by[cls.at(static_cast<size_t>(r))].push_back(r);
  std::vector<std::string> parts;
  for (const auto& [c, rs] : by) parts.push_back(fmt::format("'{}' (ranks {})", c, ranks_text(rs)));
  return fmt::format("{}", fmt::join(parts, " and "));
}

std::vector<std::string> classes_or_default(const std::vector<std::string>& cls, int world) {
  if (!cls.empty()) return cls;
  return std::vector<std::string>(static_cast<size_t>(world), kDefaultDeviceClass);
}

// World ranks whose coordinate on `axis` is `index` (a pipeline stage, a DP replica).
std::vector<int> ranks_at(const GridLayout& layout, Axis axis, int index) {
  std::vector<int> out;
  for (int r = 0; r < layout.world_size(); ++r) {
    const GridCoord c = layout.coord(r);
    if ((axis == Axis::pp ? c.pp : c.dp) == index) out.push_back(r);
  }
  return out;
}

}  // namespace

std::string format_dp_microbatches(const std::vector<DpShare>& shares) {
  std::vector<std::string> parts;
  for (const auto& d : shares)
    parts.push_back(d.device_class.empty() ? std::to_string(d.count) : fmt::format("{}={}", d.device_class, d.count));
  return fmt::format("{}", fmt::join(parts, ","));
}

std::vector<int> replica_ranks(const GridLayout& layout, int d) { return ranks_at(layout, Axis::dp, d); }

std::vector<int64_t> resolve_dp_shares(const TrainConfig& cfg, const GridLayout& layout,
                                       const std::vector<std::string>& rank_classes) {
  const auto& given = cfg.dp_microbatches;
  if (given.empty()) return {};
  const int dp = layout.size(Axis::dp);
  std::vector<int64_t> out;
  if (given.front().device_class.empty()) {
    for (const auto& g : given) out.push_back(g.count);
    return out;  // the count per replica is checked by resolve_batch_shares
  }
  const auto cls = classes_or_default(rank_classes, layout.world_size());
  std::map<std::string, int64_t> per;
  for (const auto& g : given)
    if (!per.emplace(g.device_class, g.count).second)
      TRIAX_THROW(ConfigError, "--dp-microbatches {}: class '{}' is given twice", format_dp_microbatches(given),
                  g.device_class);
  std::set<std::string> used;
  for (int d = 0; d < dp; ++d) {
    const std::vector<int> ranks = replica_ranks(layout, d);
    const std::string& c = cls.at(static_cast<size_t>(ranks.front()));
    for (int r : ranks)
      if (cls.at(static_cast<size_t>(r)) != c)
        TRIAX_THROW(ConfigError, "--dp-microbatches {} gives micro-batches per device class, but data-parallel replica "
                    "{} (ranks {}) holds classes {}: give one count per replica instead (e.g. {})",
                    format_dp_microbatches(given), d, ranks_text(ranks), classes_of(ranks, cls),
                    fmt::join(std::vector<int>(static_cast<size_t>(dp), 4), ","));
    const auto it = per.find(c);
    if (it == per.end())
      TRIAX_THROW(ConfigError, "--dp-microbatches {} does not name class '{}' of data-parallel replica {} (ranks {}; "
                  "the class is each rank's TRIAX_DEVICE_CLASS)", format_dp_microbatches(given), c, d, ranks_text(ranks));
    used.insert(c);
    out.push_back(it->second);
  }
  for (const auto& [c, n] : per)
    if (!used.count(c))
      TRIAX_THROW(ConfigError, "--dp-microbatches {} names class '{}', but no data-parallel replica is of that class "
                  "(the ranks' classes: {})", format_dp_microbatches(given), c, describe_device_classes(cls));
  return out;
}

void check_shares_collectives(const TrainConfig& cfg, const std::vector<int64_t>& shares) {
  if (shares.empty()) return;
  const bool even = std::adjacent_find(shares.begin(), shares.end(), std::not_equal_to<>()) == shares.end();
  require(even || cfg.zero < 2,
          "--zero {} reduce-scatters{} each unit once per micro-batch over all data-parallel replicas together, so "
          "they must run the same number of micro-batches, but --dp-microbatches {} gives [{}]: use --zero 1 (one "
          "reduction per step) with uneven shares", cfg.zero, cfg.zero == 3 ? " (and gathers)" : "",
          format_dp_microbatches(cfg.dp_microbatches), fmt::join(shares, ", "));
  const size_t ep = static_cast<size_t>(std::max(cfg.ep, 1));
  for (size_t g = 0; g + ep <= shares.size(); g += ep) {
    const auto b = shares.begin() + static_cast<ptrdiff_t>(g), e = b + static_cast<ptrdiff_t>(ep);
    require(std::adjacent_find(b, e, std::not_equal_to<>()) == e,
            "--ep {}: data-parallel replicas {}-{} form an expert-parallel group whose all-to-alls run once per "
            "micro-batch, so they must run the same number of micro-batches, but --dp-microbatches {} gives them [{}]",
            cfg.ep, g, g + ep - 1, format_dp_microbatches(cfg.dp_microbatches), fmt::join(b, e, ", "));
  }
}

void check_stage_classes(const TrainConfig& cfg, const GridLayout& layout, const std::vector<std::string>& rank_classes) {
  if (cfg.stage_classes.empty()) return;
  const int P = layout.size(Axis::pp);
  require(static_cast<int>(cfg.stage_classes.size()) == P, "--stage-classes {} names {} classes for pp {} stages",
          fmt::join(cfg.stage_classes, ","), cfg.stage_classes.size(), P);
  const auto cls = classes_or_default(rank_classes, layout.world_size());
  std::vector<std::string> wrong;
  for (int s = 0; s < P; ++s) {
    std::vector<int> bad;
    for (int r : ranks_at(layout, Axis::pp, s))
      if (cls.at(static_cast<size_t>(r)) != cfg.stage_classes[static_cast<size_t>(s)]) bad.push_back(r);
    if (!bad.empty())
      wrong.push_back(fmt::format("stage {} should run on '{}' but holds {}", s, cfg.stage_classes[static_cast<size_t>(s)],
                                  classes_of(bad, cls)));
  }
  if (wrong.empty()) return;
  std::vector<std::string> stages;
  for (int s = 0; s < P; ++s) stages.push_back(fmt::format("stage {}: ranks {}", s, ranks_text(ranks_at(layout, Axis::pp, s))));
  TRIAX_THROW(ConfigError, "--stage-classes {}: {} (with --order {}, {}; launch each class's ranks in that order, "
              "e.g. with mpirun's app contexts: mpirun -np N -x TRIAX_DEVICE_CLASS=A prog ARGS : -np N -x "
              "TRIAX_DEVICE_CLASS=B prog ARGS)",
              fmt::join(cfg.stage_classes, ","), fmt::join(wrong, "; "), layout.shape().order, fmt::join(stages, ", "));
}

std::string describe_device_classes(const std::vector<std::string>& rank_classes) {
  std::map<std::string, std::vector<int>> by;
  for (size_t r = 0; r < rank_classes.size(); ++r) by[rank_classes[r]].push_back(static_cast<int>(r));
  if (by.size() <= 1 && (by.empty() || by.begin()->first == kDefaultDeviceClass)) return {};
  std::vector<std::string> parts;
  for (const auto& [c, rs] : by) parts.push_back(fmt::format("{}: ranks {}", c, ranks_text(rs)));
  return fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace triax
