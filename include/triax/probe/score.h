// The deployment's node resource score: score = 0.4 compute + 0.3 memory bandwidth + 0.2 network
// latency + 0.1 storage IOPS, each term normalised to the cluster median (latency inverted, so
// lower is better), weights configurable. Pure arithmetic on measurements plus the renderers
// triax-probe writes (table, JSON, Prometheus text, a hostfile ordered for placement).
// A load forecast (triax-forecast predict --json) discounts each node by its predicted
// utilisation: placement = score x (1 - predicted).
#pragma once
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace triax::probe {

// One node's (one rank's) measurements.
struct NodeMeasure {
  std::string host;
  int rank = 0;
  double gemm_flops = 0;      // FLOP/s of a square fp32 GEMM (cuBLASLt on GPUs)
  double triad_bytes_s = 0;   // STREAM triad bandwidth, bytes/s
  double latency_s = 0;       // mean of: ping-pong half round trip to its peers, small all-reduce
  double read_iops = 0;       // random 4 KiB reads per second on the checkpoint directory
  int slots = 1;              // ranks this node may host (hostfile)
};

struct ScoreWeights {
  double compute = 0.4, memory = 0.3, latency = 0.2, iops = 0.1;
  // ConfigError unless every weight is >= 0 and they sum to more than 0.
  void validate() const;
};

struct NodeScore {
  NodeMeasure m;
  double compute = 0, memory = 0, latency = 0, iops = 0;  // normalised terms (1 = the median)
  double score = 0;       // sum of weight x term, divided by the sum of the weights
  bool straggler = false; // score < threshold
  // Predicted next-hour utilisation in [0, 1] from a forecast; NaN when none was applied.
  double predicted = std::numeric_limits<double>::quiet_NaN();
  double placement = 0;   // score x (1 - predicted); the score itself without a forecast
};

// host -> predicted utilisation in [0, 1].
using Forecast = std::map<std::string, double>;

// Median of the values (mean of the middle two for an even count); ConfigError when empty.
double median(std::vector<double> v);
// Scores every node; ConfigError for an empty list or a measurement <= 0 (naming host and field).
std::vector<NodeScore> score_nodes(const std::vector<NodeMeasure>& nodes, const ScoreWeights& w = {},
                                   double straggler_threshold = 0.8);

// Parses the JSON of `triax-forecast predict --json` ({"nodes": [{"node", "predicted_utilisation"}]});
// ConfigError naming the file for: not JSON, no "nodes" array, a node without a name or a number,
// a value outside [0, 1] or NaN, a node listed twice. IoError when it cannot be opened.
Forecast read_forecast(const std::string& path);
// Sets predicted and placement of every score. ConfigError naming every probed host the forecast
// lacks; hosts only in the forecast are ignored with a warning.
void apply_forecast(std::vector<NodeScore>& scores, const Forecast& forecast);

// Columns predicted and placement appear when a forecast was applied (to any node).
std::string render_table(const std::vector<NodeScore>& s);
std::string render_json(const std::vector<NodeScore>& s, const ScoreWeights& w, double threshold);
// Gauges triax_probe_{gemm_flops,triad_bytes_per_second,latency_seconds,read_iops,score,straggler}
// labelled {host, rank}: what the recording rules in clusters/prometheus/ score again; plus
// triax_probe_placement when a forecast was applied.
std::string render_prometheus(const std::vector<NodeScore>& s);
// "host slots=N" lines, best placement (the score without a forecast) first, one line per host
// (stragglers last, commented when exclude_stragglers).
std::string render_hostfile(const std::vector<NodeScore>& s, bool exclude_stragglers);

}  // namespace triax::probe
