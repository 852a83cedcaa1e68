// triax-plan on a cluster of device classes (docs/PLANNER.md "Heterogeneous clusters").
#pragma once
#include <string>
#include <vector>

#include "triax/plan/hetero.h"

namespace triax::plan {

struct HeteroOptions {
  std::string cluster;                  // the cluster file
  HeteroSearchSpace space;              // pins and the base layout
  std::vector<std::string> stage_classes;  // --stage-classes, by name
  std::string emit_config;              // --emit-config FILE ("": none)
  bool json = false;
};

// Searches (or prices the pinned plan), prints the result, writes --emit-config. Exit code: 0, or
// 3 when no plan fits.
int run_hetero(const ModelShape& m, HeteroOptions opt);

}  // namespace triax::plan
