// The order samples are visited in: global sample g of the run is sample order(g) of the dataset.
// A seeded pseudo-random permutation of [0, n) per epoch (epoch = g / n), computed by a Feistel
// network with cycle walking: O(1) memory however large n is, and a pure function of
// (seed, epoch, g), so every TP x PP x DP layout and every rank agrees without communication.
#pragma once
#include <cstdint>

namespace triax {

class SampleOrder {
 public:
  // n >= 1 samples per epoch; shuffle false: the identity (file order), epoch after epoch.
  SampleOrder(int64_t n, uint64_t seed, bool shuffle);
  int64_t size() const { return n_; }
  // The dataset sample visited at global position g >= 0.
  int64_t operator()(int64_t g) const;
  // The permutation of epoch e applied to r in [0, n).
  int64_t permute(uint64_t epoch, int64_t r) const;

 private:
  int64_t n_;
  uint64_t seed_;
  bool shuffle_;
  int half_bits_ = 1;  // the Feistel domain is 2^(2 * half_bits) >= n
};

}  // namespace triax
