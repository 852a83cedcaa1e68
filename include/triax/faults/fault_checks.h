// The trainer's checks on what a step produced: which rank and parameter a non-finite gradient
// came from, a loss far above its recent window (llm.c-style z-score), and ranks whose compute
// time stays above the median (stragglers). docs/FAULTS.md.
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "triax/distributed/comm/comm.h"
#include "triax/params/param_store.h"

namespace triax {

struct NonFiniteGrad {
  int rank = -1;          // lowest world rank where a non-finite gradient appeared; -1: none found
  std::string param;      // its first such parameter
  int64_t element = -1;   // element index inside that parameter
  std::vector<int> ranks; // every such world rank
  bool before_sync = false;  // found in the ranks' own gradients before the DP reduction
};

// Collective over world: each rank scans its gradients in parameter order for the first NaN/inf.
// presync_bad: this rank's count of non-finite gradient elements before the DP reduction
// (GradBuffer::presync_nonfinite). Where any rank has one, only those ranks are named (an
// all-reduce copies a NaN to every DP rank, at the same element, so the element found after it
// is the one the origin produced); otherwise every rank holding one after the sync is.
NonFiniteGrad locate_nonfinite_grad(const ParamStore& store, Communicator& world, double presync_bad = 0);

// z-score of each new loss against the mean and standard deviation of the previous `window`
// losses (NaN until `min_count` are there); spike() says whether it exceeds the threshold.
class LossSpikeDetector {
 public:
  explicit LossSpikeDetector(double zscore, size_t window = 128, size_t min_count = 16);
  // Returns the z-score of loss against the window (before adding it), NaN when not yet known.
  double update(double loss);
  bool spike(double z) const { return threshold_ > 0 && z == z && z > threshold_; }
  double mean() const;

 private:
  double threshold_;
  size_t window_, min_count_;
  std::deque<double> values_;
};

// A rank is a straggler once its compute time exceeded factor x the median of all ranks, and the
// median by more than min_excess_s (timer and scheduling noise of tiny steps), in `persist`
// consecutive iterations; it stops being one after an iteration below it.
class StragglerDetector {
 public:
  explicit StragglerDetector(double factor, int persist = 3, double min_excess_s = 0.02);
  // times[r]: rank r's compute seconds in this iteration. Returns the ranks that became stragglers now.
  std::vector<int> update(std::span<const double> times);
  const std::vector<int>& stragglers() const { return current_; }
  double last_median() const { return median_; }

 private:
  double factor_;
  int persist_;
  double min_excess_s_;
  std::vector<int> streak_;
  std::vector<int> current_;
  double median_ = 0;
};

// Heterogeneous clusters (docs/HETEROGENEOUS.md): when the stragglers are exactly the ranks of one
// device class and the job has another class, the class is slower than the split assumed, not a
// rank: ratio is its ranks' median compute time over the other ranks' median (the speed ratio to
// re-plan with). nullopt otherwise.
struct SlowClass {
  std::string name;
  std::vector<int> ranks;
  double ratio = 0;
};
std::optional<SlowClass> slow_device_class(std::span<const double> busy, std::span<const int> stragglers,
                                           const std::vector<std::string>& classes);

}  // namespace triax
