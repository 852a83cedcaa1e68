// Shared by the multi-rank optimizer tests: a grid over the test world with a short timeout (a
// failing rank then turns into a TimeoutError on the others instead of a hang).
#pragma once
#include <chrono>
#include <memory>
#include <vector>

#include "support/multirank.h"
#include "triax/distributed/grid.h"

namespace triax::test {

inline std::unique_ptr<ProcessGrid> make_grid(GridShape shape) {
  world().set_timeout(std::chrono::seconds(60));
  return std::make_unique<ProcessGrid>(world_ptr(), shape);
}

// Every tp x pp x dp factorisation of the world size (default order).
inline std::vector<GridShape> all_shapes() {
  const int w = world().size();
  std::vector<GridShape> out;
  for (int tp = 1; tp <= w; ++tp)
    for (int pp = 1; pp <= w; ++pp)
      if (w % (tp * pp) == 0) out.push_back(GridShape{tp, pp, w / (tp * pp)});
  return out;
}

}  // namespace triax::test
