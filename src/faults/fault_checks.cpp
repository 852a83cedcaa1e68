// Non-finite gradient attribution, the loss spike detector and the straggler detector.
#include "triax/faults/fault_checks.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace triax {

NonFiniteGrad locate_nonfinite_grad(const ParamStore& store, Communicator& world, double presync_bad) {
  constexpr size_t kName = 128;
  int64_t mine[3] = {-1, -1, presync_bad > 0 ? 1 : 0};
  std::vector<uint8_t> name(kName, 0);
  // A host copy of the gradients (on a device or checking backend they are not host memory).
  std::vector<float> grads(store.numel());
  if (!grads.empty()) store.backend().copy_to_host(grads.data(), store.grads_range(0, grads.size()), grads.size() * sizeof(float));
  for (size_t i = 0; i < store.size() && mine[0] < 0; ++i) {
    const ParamInfo& p = store.info(i);
    for (size_t k = 0; k < p.numel; ++k)
      if (!std::isfinite(grads[p.offset + k])) {
        mine[0] = static_cast<int64_t>(i);
        mine[1] = static_cast<int64_t>(k);
        std::memcpy(name.data(), p.spec.name.data(), std::min(kName - 1, p.spec.name.size()));
        break;
      }
  }
  const size_t n = static_cast<size_t>(world.size());
  std::vector<int64_t> all(3 * n);
  std::vector<uint8_t> names(kName * n);
  world.all_gather(std::span<const int64_t>(mine), std::span<int64_t>(all)).wait();
  world.all_gather(std::span<const uint8_t>(name), std::span<uint8_t>(names)).wait();
  NonFiniteGrad out;
  for (size_t r = 0; r < n; ++r) out.before_sync |= all[3 * r + 2] > 0;
  for (size_t r = 0; r < n; ++r) {
    if (out.before_sync ? all[3 * r + 2] == 0 : all[3 * r] < 0) continue;
    out.ranks.push_back(world.world_ranks()[r]);
    if (out.rank >= 0) continue;
    out.rank = world.world_ranks()[r];
    out.element = all[3 * r + 1];
    if (all[3 * r] >= 0) out.param.assign(reinterpret_cast<const char*>(&names[kName * r]));
  }
  return out;
}

LossSpikeDetector::LossSpikeDetector(double zscore, size_t window, size_t min_count)
    : threshold_(zscore), window_(window), min_count_(min_count) {}

double LossSpikeDetector::mean() const {
  double s = 0;
  for (double v : values_) s += v;
  return values_.empty() ? 0.0 : s / static_cast<double>(values_.size());
}

double LossSpikeDetector::update(double loss) {
  double z = std::numeric_limits<double>::quiet_NaN();
  if (!std::isfinite(loss)) return z;
  if (values_.size() >= min_count_) {
    const double m = mean();
    double var = 0;
    for (double v : values_) var += (v - m) * (v - m);
    const double sd = std::sqrt(var / static_cast<double>(values_.size()));
    if (sd > 0) z = (loss - m) / sd;
  }
  values_.push_back(loss);
  if (values_.size() > window_) values_.pop_front();
  return z;
}

StragglerDetector::StragglerDetector(double factor, int persist, double min_excess_s)
    : factor_(factor), persist_(persist), min_excess_s_(min_excess_s) {}

namespace {
// The median (of an even count: the mean of the middle two); 0 for none.
double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}
}  // namespace

std::vector<int> StragglerDetector::update(std::span<const double> times) {
  const size_t n = times.size();
  if (streak_.size() != n) streak_.assign(n, 0);
  median_ = median_of(std::vector<double>(times.begin(), times.end()));
  std::vector<int> fresh;
  current_.clear();
  for (size_t r = 0; r < n; ++r) {
    streak_[r] = times[r] > factor_ * median_ && times[r] - median_ > min_excess_s_ ? streak_[r] + 1 : 0;
    if (streak_[r] >= persist_) current_.push_back(static_cast<int>(r));
    if (streak_[r] == persist_) fresh.push_back(static_cast<int>(r));
  }
  return fresh;
}

std::optional<SlowClass> slow_device_class(std::span<const double> busy, std::span<const int> stragglers,
                                           const std::vector<std::string>& classes) {
  if (stragglers.empty() || classes.size() != busy.size()) return std::nullopt;
  SlowClass out;
  out.name = classes.at(static_cast<size_t>(stragglers.front()));
  std::vector<double> mine, others;
  for (size_t r = 0; r < classes.size(); ++r) {
    if (classes[r] == out.name) {
      out.ranks.push_back(static_cast<int>(r));
      mine.push_back(busy[r]);
    } else {
      others.push_back(busy[r]);
    }
  }
  // Exactly the class's ranks, and something to compare them with.
  if (others.empty() || !std::equal(out.ranks.begin(), out.ranks.end(), stragglers.begin(), stragglers.end()))
    return std::nullopt;
  const double base = median_of(others);
  if (base <= 0) return std::nullopt;
  out.ratio = median_of(mine) / base;
  return out;
}

}  // namespace triax

