// triax-plan's heterogeneous mode: the search over placements, layer splits and shares, its table
// (or JSON), and the train_gpt config of the best plan.
#include "hetero_mode.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "triax/core/error.h"
#include "triax/model/config.h"

namespace triax::plan {
namespace {
// train_gpt's preset of the planner's model, when one of that name has the same shape and block
// (its RoPE base, scaling and norm epsilon then come with it); "" otherwise.
std::string runtime_preset_of(const ModelShape& m) {
  const auto names = GptConfig::preset_names();
  if (std::find(names.begin(), names.end(), m.name) == names.end()) return {};
  const GptConfig g = GptConfig::preset(m.name);
  const bool same = g.n_layer == m.layers && g.n_embd == m.hidden && g.n_head == m.heads && g.vocab == m.vocab &&
                    g.kv_heads() == m.kv_head_count() && g.swiglu == m.swiglu &&
                    (g.norm == Norm::rmsnorm) == m.rmsnorm && (g.positions == PositionEmbedding::rope) == m.rope;
  return same ? m.name : std::string();
}
}  // namespace

int run_hetero(const ModelShape& m, HeteroOptions opt) {
  const HeteroCluster hc = resolve_hetero_cluster(opt.cluster);
  for (const auto& name : opt.stage_classes) opt.space.stage_classes.push_back(hc.class_index(name));
  // A pinned list fixes its axis: --pp (--dp) must agree when given.
  auto pin = [](std::vector<int>& axis, size_t n, const char* flag, const char* list) {
    if (n == 0) return;
    if (!axis.empty() && axis.front() != int(n))
      TRIAX_THROW(ConfigError, "{} {} but {} names {} entries", flag, axis.front(), list, n);
    axis = {int(n)};
  };
  pin(opt.space.pp, opt.space.pipeline_layers.size(), "--pp", "--pipeline-layers");
  pin(opt.space.pp, opt.space.stage_classes.size(), "--pp", "--stage-classes");
  pin(opt.space.dp, opt.space.dp_microbatches.size(), "--dp", "--dp-microbatches");
  int layers = 0;
  for (int n : opt.space.pipeline_layers) layers += n;
  if (layers && layers != m.layers)
    TRIAX_THROW(ConfigError, "--pipeline-layers sum to {}, the model has {} layers", layers, m.layers);
  const HeteroSearchResult r = search_hetero(m, hc, opt.space);
  fmt::print("{}\n", opt.json ? hetero_json(r, hc) : format_hetero(r, hc));
  if (r.best.empty()) {
    std::fprintf(stderr, "triax-plan: no plan of %s fits on cluster %s\n", m.name.c_str(), hc.name.c_str());
    return 3;
  }
  if (!opt.emit_config.empty()) {
    std::ofstream out(opt.emit_config);
    out << train_config_toml(m, r.best.front(), hc, opt.emit_config, runtime_preset_of(m));
    if (!out) TRIAX_THROW(IoError, "--emit-config {}: cannot write the file", opt.emit_config);
    if (!opt.json) fmt::print("wrote {} (the plan above as a train_gpt --config file)\n", opt.emit_config);
  }
  return 0;
}

}  // namespace triax::plan
