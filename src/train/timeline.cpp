// The trainer's timeline (include/triax/train/timeline.h): recording window, per-rank files, the
// merge on rank 0 and the bubble of each recorded step next to the schedule simulator's.
#include "triax/train/timeline.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>
#include <tuple>

#include "triax/config/train_config.h"
#include "triax/core/log.h"
#include "triax/core/trace.h"
#include "triax/pipeline/schedule_sim.h"

namespace triax {
namespace {

std::string rank_file(const std::string& dir, int rank) {
  return (std::filesystem::path(dir) / fmt::format("trace_rank{}.json", rank)).string();
}

std::optional<PipeOp> compute_op(std::string_view name) {
  for (PipeOp op : {PipeOp::forward, PipeOp::backward, PipeOp::backward_input, PipeOp::backward_weight})
    if (name.substr(0, name.find(' ')) == pipe_op_name(op)) return op;
  return std::nullopt;
}

// The compute spans of each recorded step of the pipeline tp 0 dp 0, read back from the merged
// trace (the same events a user sees).
std::map<int64_t, std::vector<ComputeSpan>> compute_spans(const nlohmann::json& doc, const GridLayout& layout) {
  std::map<int64_t, std::vector<ComputeSpan>> out;
  for (const auto& e : doc.at("traceEvents")) {
    if (e.value("ph", "") != "X" || e.value("cat", "") != "compute") continue;
    const GridCoord c = layout.coord(e.at("pid").get<int>());
    if (c.tp != 0 || c.dp != 0) continue;
    const auto op = compute_op(e.at("name").get<std::string>());
    const auto& a = e.at("args");
    if (!op || !a.contains("step")) continue;
    out[a.at("step").get<int64_t>()].push_back(
        {c.pp, a.value("mb", 0), a.value("chunk", 0), *op, e.at("ts").get<double>(), e.at("dur").get<double>()});
  }
  return out;
}

std::vector<ComputeSpan> spans_of(const Schedule& schedule, const SimResult& sim) {
  std::vector<ComputeSpan> out;
  for (int st = 0; st < schedule.stages; ++st)
    for (const auto& t : sim.timeline.at(static_cast<size_t>(st)))
      out.push_back({st, t.instr.mb, t.instr.chunk, t.instr.op, t.start, t.end - t.start});
  return out;
}

}  // namespace

double window_bubble(const std::vector<ComputeSpan>& spans, int stages) {
  std::vector<double> lo(static_cast<size_t>(stages), std::numeric_limits<double>::infinity());
  std::vector<double> hi(static_cast<size_t>(stages), -std::numeric_limits<double>::infinity());
  std::vector<double> busy(static_cast<size_t>(stages), 0.0);
  for (const auto& s : spans) {
    if (s.stage < 0 || s.stage >= stages)
      TRIAX_THROW(ConfigError, "window_bubble: stage {} out of range for {} stages", s.stage, stages);
    const auto i = static_cast<size_t>(s.stage);
    lo[i] = std::min(lo[i], s.ts);
    hi[i] = std::max(hi[i], s.ts + s.dur);
    busy[i] += s.dur;
  }
  double idle = 0, work = 0;
  for (size_t i = 0; i < busy.size(); ++i) {
    if (busy[i] <= 0) continue;
    idle += std::max(0.0, hi[i] - lo[i] - busy[i]);
    work += busy[i];
  }
  return work > 0 ? idle / work : 0.0;
}

StepBubble step_bubble(const Schedule& schedule, const std::vector<ComputeSpan>& spans, int64_t step) {
  StepBubble b;
  b.step = step;
  b.measured = window_bubble(spans, schedule.stages);
  std::map<std::tuple<int, int, PipeOp>, std::pair<double, int>> sum;
  for (const auto& s : spans) {
    auto& v = sum[{s.stage, s.chunk, s.op}];
    v.first += s.dur;
    ++v.second;
  }
  const ComputeCostFn cost = [&](int stage, const PipeInstr& in) {
    auto it = sum.find({stage, in.chunk, in.op});
    return it == sum.end() ? 0.0 : it->second.first / it->second.second;
  };
  b.simulated = window_bubble(spans_of(schedule, simulate_schedule(schedule, cost, 0.0)), schedule.stages);
  b.theory = window_bubble(spans_of(schedule, simulate_schedule(schedule)), schedule.stages);
  return b;
}

Timeline::Timeline(const std::string& steps, std::string dir) : dir_(std::move(dir)) {
  if (const auto r = parse_profile_steps(steps)) std::tie(first_, last_) = *r;
}

void Timeline::before_step(int64_t it, ProcessGrid& grid) {
  if (!enabled() || done_) return;
  if (it >= first_ && it <= last_ && !trace::on()) {
    // A resumed run that starts inside A..B records from its first iteration.
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) TRIAX_THROW(IoError, "--profile-dir {}: cannot create it: {}", dir_, ec.message());
    // One time axis: rank 0's origin for the ranks on its host (one steady clock), each rank's own
    // right after the barrier elsewhere (off by the barrier's exit skew).
    grid.world().barrier().wait();
    double origin[1] = {grid.world().rank() == 0 ? trace::steady_now_s() : 0.0};
    grid.world().all_reduce(std::span<double>(origin), ReduceOp::sum).wait();
    const auto& hosts = grid.hosts();
    const bool same_host = hosts.size() > static_cast<size_t>(grid.world().rank()) && !hosts.empty() &&
                           hosts[static_cast<size_t>(grid.world().rank())] == hosts[0];
    if (same_host) trace::start_at(origin[0]);
    else trace::start();
  }
  if (trace::on()) {
    trace::set_step(it);
    step_t0_ = trace::now_us();
  }
}

void Timeline::after_step(int64_t it, bool last, ProcessGrid& grid, const Schedule& schedule) {
  if (!trace::on() || done_) return;
  if (step_t0_ >= 0) trace::record(trace::Lane::step, fmt::format("iteration {}", it), step_t0_, trace::now_us());
  step_t0_ = -1;
  if (it < last_ && !last) return;
  trace::stop();
  done_ = true;
  const int rank = grid.world().rank(), W = grid.world().size();
  const GridCoord c = grid.coord();
  trace::write_file(rank_file(dir_, rank),
                    trace::to_json(trace::events(), rank, fmt::format("rank {} (tp {}, pp {}, dp {})", rank, c.tp, c.pp, c.dp)));
  grid.world().barrier().wait();
  if (rank != 0) return;
  std::vector<std::string> files;
  for (int r = 0; r < W; ++r) files.push_back(rank_file(dir_, r));
  const std::string merged = trace::merge_files(files, "");
  nlohmann::json doc = nlohmann::json::parse(merged);
  nlohmann::json steps = nlohmann::json::array();
  std::string summary;
  for (const auto& [step, spans] : compute_spans(doc, grid.layout())) {
    const StepBubble b = step_bubble(schedule, spans, step);
    steps.push_back({{"step", step}, {"measured_bubble", b.measured}, {"simulated_bubble", b.simulated},
                     {"uniform_bubble", b.theory}});
    summary += fmt::format(" {}: {:.3f} (simulated {:.3f})", step, b.measured, b.simulated);
  }
  doc["otherData"] = {{"schedule", schedule.label()}, {"pp", schedule.stages}, {"vpp", schedule.chunks},
                      {"micro_batches", schedule.micro_batches}, {"world", W},
                      {"clock", "steady clock; origin: rank 0's at the first step for the ranks on its host, each rank's own "
                                "right after a world barrier elsewhere"},
                      {"bubble_definition", "idle/compute of pipeline tp 0 dp 0; idle of a stage = its first-to-last "
                                            "compute window minus its compute"},
                      {"steps", steps}};
  const std::string out = (std::filesystem::path(dir_) / "trace.json").string();
  trace::write_file(out, doc.dump());
  log::info("timeline of iterations {}..{} ({} ranks) written to {} (open it in https://ui.perfetto.dev or "
            "chrome://tracing); pipeline bubble idle/compute per step:{}", first_, it, W, out, summary);
}

}  // namespace triax
