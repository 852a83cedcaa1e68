// Text and JSON renderings of estimates and search results for triax-plan and for tests.
#pragma once
#include <string>
#include <vector>

#include "triax/plan/planner.h"

namespace triax::plan {

std::string format_estimate(const Estimate& e);
// One JSON object: seconds_per_iteration, tflops_per_gpu, mfu, memory_gib, fits, and breakdowns.
std::string estimate_json(const Estimate& e, int indent = 2);
std::string format_search(const SearchResult& r);
// The best layout's keys at the top level (same contract as estimate_json) plus "search".
std::string search_json(const SearchResult& r, int indent = 2);
// The step-time breakdown (compute, bubble, exposed TP/PP/DP communication, optimizer, core
// sharing) of the layouts, fastest first, as a stacked bar chart in SVG: one <g class="layout">
// per layout with a <rect class="compute|bubble|..." data-seconds="..."> per non-zero term
// (triax-plan --plot, docs/PLANNER.md). Throws ConfigError for no layout.
std::string breakdown_svg(const std::vector<Estimate>& layouts);
// breakdown_svg written to path (IoError naming --plot and the path when it cannot be written).
void write_breakdown_svg(const std::string& path, const std::vector<Estimate>& layouts);

}  // namespace triax::plan
