// Seeded per-epoch sample permutation (see sample_order.h).
#include "triax/data/sample_order.h"

#include "triax/core/error.h"
#include "triax/core/hash.h"

namespace triax {
namespace {
constexpr int kRounds = 6;
}  // namespace

SampleOrder::SampleOrder(int64_t n, uint64_t seed, bool shuffle) : n_(n), seed_(seed), shuffle_(shuffle) {
  require(n >= 1, "a sample order needs at least one sample, got {}", n);
  while ((int64_t{1} << (2 * half_bits_)) < n) ++half_bits_;
}

int64_t SampleOrder::permute(uint64_t epoch, int64_t r) const {
  if (!shuffle_ || n_ == 1) return r;
  const uint64_t mask = (uint64_t{1} << half_bits_) - 1;
  const uint64_t key = splitmix64(seed_ ^ splitmix64(epoch + 0x5851f42d4c957f2dull));
  uint64_t x = static_cast<uint64_t>(r);
  // Cycle walking: the Feistel network permutes [0, 4^half_bits); re-apply it until the value
  // lands inside [0, n). The domain is below 4n, so a few rounds on average.
  do {
    uint64_t L = x >> half_bits_, R = x & mask;
    for (int i = 0; i < kRounds; ++i) {
      const uint64_t F = splitmix64(key ^ (R * 0x100000001b3ull) ^ static_cast<uint64_t>(i)) & mask;
      const uint64_t nl = R;
      R = L ^ F;
      L = nl;
    }
    x = (L << half_bits_) | R;
  } while (x >= static_cast<uint64_t>(n_));
  return static_cast<int64_t>(x);
}

int64_t SampleOrder::operator()(int64_t g) const {
  require(g >= 0, "sample position {} is negative", g);
  return permute(static_cast<uint64_t>(g / n_), g % n_);
}

}  // namespace triax
