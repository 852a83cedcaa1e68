// Wave-quantized GEMM rate: the better of the two tile orientations, whole waves, K overhead.
#include "triax/plan/gemm_model.h"

#include <algorithm>
#include <cmath>

#include "triax/core/error.h"
#include "triax/plan/cluster.h"

namespace triax::plan {

GemmModel::GemmModel(double rate, int sm_count, int tile_m, int tile_n, double k_overhead)
    : rate_(rate), sms_(sm_count), tm_(tile_m), tn_(tile_n), k_overhead_(k_overhead) {
  if (!(rate > 0)) TRIAX_THROW(ConfigError, "GEMM rate must be positive, got {}", rate);
  if (sm_count < 0 || (sm_count > 0 && (tile_m <= 0 || tile_n <= 0)))
    TRIAX_THROW(ConfigError, "GEMM model: sm_count {} needs positive tile sizes, got {} x {}", sm_count, tile_m,
                tile_n);
  if (!(k_overhead >= 0)) TRIAX_THROW(ConfigError, "GEMM model: k_overhead must be >= 0, got {}", k_overhead);
}

GemmModel GemmModel::for_cluster(const Cluster& c, double peak_flops) {
  return GemmModel(peak_flops * c.gemm_efficiency, c.sm_count, c.gemm_tile_m, c.gemm_tile_n, c.gemm_k_overhead);
}

// Useful work over the work of the waves actually run, for tiles of tm x tn.
double GemmModel::tile_fraction(const GemmShape& g, double tm, double tn) const {
  const double tiles = std::ceil(g.m / tm) * std::ceil(g.n / tn) * g.batch;
  const double waves = std::ceil(tiles / sms_);
  return (g.m * g.n * g.batch) / (waves * sms_ * tm * tn);
}

double GemmModel::efficiency(const GemmShape& g) const {
  if (g.m <= 0 || g.n <= 0 || g.k <= 0 || g.batch <= 0) return 1;
  double eff = 1;
  if (sms_ > 0) {
    // A library picks the better orientation of its tile for the shape.
    eff = std::min(1.0, std::max(tile_fraction(g, tm_, tn_), tile_fraction(g, tn_, tm_)));
  }
  return eff * g.k / (g.k + k_overhead_);
}

double GemmModel::seconds(const GemmShape& g) const {
  return 2 * g.m * g.n * g.k * g.batch / (rate_ * efficiency(g));
}

}  // namespace triax::plan
