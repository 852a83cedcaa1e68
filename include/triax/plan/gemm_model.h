// GEMM time on one accelerator from its structure: the output is cut into tiles, one tile per SM
// at a time, so a GEMM runs in whole waves of `sm_count` tiles (wave and tile quantization), each
// tile pays a prologue/epilogue worth `k_overhead` elements of K, and the rest runs at the
// sustained tensor rate. A cluster without tile numbers (sm_count 0: CPUs) gets a flat rate.
#pragma once

namespace triax::plan {

struct Cluster;

struct GemmShape {
  double m = 0, n = 0, k = 0;  // C(m x n) = A(m x k) B(k x n)
  double batch = 1;            // independent GEMMs of this shape in one launch
};

class GemmModel {
 public:
  // `rate` is the sustained FLOP/s of full waves of large tiles (peak x gemm_efficiency).
  GemmModel(double rate, int sm_count, int tile_m, int tile_n, double k_overhead);
  static GemmModel for_cluster(const Cluster& c, double peak_flops);

  // Fraction of `rate` the shape reaches: waves, tile padding and the K overhead together.
  double efficiency(const GemmShape& g) const;
  // Compute-bound seconds of the shape (no memory roofline, no launch gap).
  double seconds(const GemmShape& g) const;
  double rate() const { return rate_; }
  bool structured() const { return sms_ > 0; }

 private:
  double tile_fraction(const GemmShape& g, double tm, double tn) const;
  double rate_;
  int sms_, tm_, tn_;
  double k_overhead_;
};

}  // namespace triax::plan
