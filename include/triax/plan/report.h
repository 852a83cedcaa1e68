// Text and JSON renderings of estimates and search results for triax-plan and for tests.
#pragma once
#include <string>

#include "triax/plan/planner.h"

namespace triax::plan {

std::string format_estimate(const Estimate& e);
// One JSON object: seconds_per_iteration, tflops_per_gpu, mfu, memory_gib, fits, and breakdowns.
std::string estimate_json(const Estimate& e, int indent = 2);
std::string format_search(const SearchResult& r);
// The best layout's keys at the top level (same contract as estimate_json) plus "search".
std::string search_json(const SearchResult& r, int indent = 2);

}  // namespace triax::plan
