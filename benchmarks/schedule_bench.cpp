// schedule_bench: the pipeline bubble of the real trainer, measured, next to its closed form and a
// simulation with the measured costs. Runs Trainer steps with per-instruction events, gathers
// every rank's compute intervals on one time axis, prints each stage's ASCII time line, writes a
// Chrome trace (one row per rank) and the bubble (idle / compute) per stage and overall.
//
//   mpirun -np 2 schedule_bench --pp 2 --schedule all --micro-batches 8 --trace sched.json
// (default model: the tiny preset widened to 16 layers x 128 channels, 128 tokens, vocabulary 64)
//
// Measured bubble: per pipeline, makespan = first compute start to last compute end over its
// stages; idle = makespan - busy; ratio = sum idle / sum busy (warm-up iterations ignored, median
// over the timed ones). Theory: (p-1)/m for GPipe and 1F1B, (p-1)/(v m) interleaved, ZB-H1
// (p-1)(F+B-W)/(m(F+B+W)) with the measured mean F, B, W. Simulated: simulate_schedule with the
// measured mean cost of every (stage, chunk, instruction kind) and the measured one-way latency
// of an activation message.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <tuple>

#include "bench_common.h"
#include "triax/distributed/bootstrap/bootstrap.h"
#include "triax/pipeline/schedule_sim.h"
#include "triax/pipeline/schedule_trace.h"
#include "triax/train/trainer.h"

#if defined(TRIAX_HAVE_MPI)

using namespace triax;

namespace {

using Clock = std::chrono::steady_clock;
double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

// One gathered compute event: who ran it, what, and when (seconds on the common axis).
struct Rec {
  int world_rank, stage, tp, dp;
  PipeOp op;
  int mb, chunk;
  double start, end, wait, cpu;
};
constexpr size_t kRecDoubles = 11;

std::string kind_letter(PipeOp op) {
  switch (op) {
    case PipeOp::forward: return "F";
    case PipeOp::backward: return "BW";
    case PipeOp::backward_input: return "B";
    case PipeOp::backward_weight: return "W";
    default: return "?";
  }
}

// Gathers every rank's events of the last step onto every rank (offsets: per-rank clock offset).
std::vector<Rec> gather_events(Communicator& world, const Trainer& tr, const GridCoord& me,
                               const std::vector<double>& offsets) {
  const StepResult& st = tr.last_step();
  const double base = st.origin_s - offsets.at(static_cast<size_t>(world.rank()));
  std::vector<double> mine;
  for (const auto& e : st.events) {
    const double v[kRecDoubles] = {double(world.rank()), double(me.pp), double(me.tp), double(me.dp),
                                   double(static_cast<int>(e.instr.op)), double(e.instr.mb), double(e.instr.chunk),
                                   base + e.start, base + e.end, e.wait, e.cpu};
    mine.insert(mine.end(), v, v + kRecDoubles);
  }
  std::vector<int64_t> count{static_cast<int64_t>(st.events.size())}, counts(static_cast<size_t>(world.size()));
  world.all_gather(std::span<const int64_t>(count), std::span<int64_t>(counts)).wait();
  const int64_t most = *std::max_element(counts.begin(), counts.end());
  mine.resize(static_cast<size_t>(most) * kRecDoubles, -1.0);
  std::vector<double> all(mine.size() * static_cast<size_t>(world.size()));
  world.all_gather(std::span<const double>(mine), std::span<double>(all)).wait();
  std::vector<Rec> out;
  for (int r = 0; r < world.size(); ++r)
    for (int64_t i = 0; i < counts[static_cast<size_t>(r)]; ++i) {
      const double* v = &all[(static_cast<size_t>(r) * static_cast<size_t>(most) + static_cast<size_t>(i)) * kRecDoubles];
      out.push_back(Rec{int(v[0]), int(v[1]), int(v[2]), int(v[3]), static_cast<PipeOp>(int(v[4])), int(v[5]),
                        int(v[6]), v[7], v[8], v[9], v[10]});
    }
  return out;
}

// One-way time of an activation-sized message between pipeline stages 0 and 1 (ping-pong / 2).
double p2p_latency(Communicator& pp, size_t floats) {
  double lat[1] = {0};
  if (pp.size() > 1 && pp.rank() < 2) {
    std::vector<float> buf(floats, 1.0f);
    std::vector<double> times;
    const int peer = 1 - pp.rank();
    constexpr int kTag = 30001;
    for (int i = 0; i < 12; ++i) {
      const double t0 = now_s();
      if (pp.rank() == 0) {
        pp.send(std::span<const float>(buf), peer, kTag).wait();
        pp.recv(std::span<float>(buf), peer, kTag).wait();
      } else {
        pp.recv(std::span<float>(buf), peer, kTag).wait();
        pp.send(std::span<const float>(buf), peer, kTag).wait();
      }
      if (i >= 2) times.push_back((now_s() - t0) / 2);
    }
    lat[0] = bench::median(times);
  }
  pp.all_reduce(std::span<double>(lat), ReduceOp::max).wait();
  return lat[0];
}

struct Result {
  std::string schedule;
  int p = 1, v = 1, m = 1;
  double measured = 0, theory = NAN, simulated = 0, simulated_no_comm = 0;
  double simulated_cpu = 0;  // simulation with the CPU-time costs: the bubble of an idle machine
  std::vector<double> stage_measured, stage_simulated;
  double of_makespan = 0, step_ms = 0, p2p_ms = 0;
  double cpu_share = 0;  // CPU time / wall time of the compute intervals (1: never descheduled)
  std::map<std::pair<int, std::string>, double> cost_ms;  // (stage, kind) mean over chunks
  std::map<std::pair<int, std::string>, double> cpu_ms;   // the same in CPU time
  std::string theory_note;
  bool ok = true;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"schedule_bench: measured pipeline bubble of the trainer vs theory and simulation"};
  bench::ModelFlags mf;
  // 16 layers and a 64-token vocabulary: 8 layers per stage (4 per chunk interleaved), so the
  // embedding and the fused LM head + loss on the end stages weigh little against the layers and
  // the stages are nearly equal, as the closed forms assume.
  mf.layers = 16;
  mf.vocab = 64;
  mf.add(app);
  int tp = 1, pp = 0, dp = 1, vpp = 2, m = 8, mbs = 4, iters = 5, warmup = 2, width = 120;
  std::string schedules = "1f1b", trace, json_path;
  double tolerance = 0.03;
  app.add_option("--tp", tp, "tensor-parallel size")->capture_default_str();
  app.add_option("--pp", pp, "pipeline stages (default: world / (tp dp))");
  app.add_option("--dp", dp, "data-parallel size")->capture_default_str();
  app.add_option("--vpp", vpp, "chunks per stage for the interleaved schedule")->capture_default_str();
  app.add_option("--schedule", schedules, "gpipe, 1f1b, interleaved, zb-h1, a comma list, or all")
      ->capture_default_str();
  app.add_option("--micro-batches", m, "micro-batches per step (m)")->capture_default_str();
  app.add_option("--micro-batch-size", mbs, "samples per micro-batch")->capture_default_str();
  app.add_option("--iters", iters, "timed iterations per schedule")->capture_default_str();
  app.add_option("--warmup", warmup, "untimed iterations first")->capture_default_str();
  app.add_option("--trace", trace, "Chrome trace of the median iteration (one row per rank; schedule name "
                                   "inserted before .json when several schedules run)");
  app.add_option("--json", json_path, "write the results as JSON (rank 0)");
  app.add_option("--width", width, "characters per ASCII time line")->capture_default_str();
  app.add_option("--tolerance", tolerance, "target |measured - theory| (fraction; reported, not enforced)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  int rc = 0;
  // Created outside the try: if one rank throws, unwinding must not run the bootstrap's
  // MPI_Finalize (it would wait for the other ranks forever) before the catch aborts the job.
  std::unique_ptr<Bootstrap> boot;
  try {
    boot = Bootstrap::create();
    auto world = boot->world();
    const int W = world->size();
    if (pp == 0) pp = std::max(1, W / (tp * dp));
    std::vector<std::string> kinds;
    if (schedules == "all") {
      kinds = {"gpipe", "1f1b", "interleaved", "zb-h1"};
    } else {
      std::string cur;
      for (char ch : schedules + ",") {
        if (ch == ',') {
          if (!cur.empty()) kinds.push_back(cur);
          cur.clear();
        } else {
          cur += ch;
        }
      }
    }
    std::vector<Result> results;
    bool header = false;
    for (const auto& kname : kinds) {
      const ScheduleKind kind = parse_schedule_kind(kname);
      TrainConfig c;
      mf.apply(c);
      c.tp = tp;
      c.pp = pp;
      c.dp = dp;
      c.vpp = kind == ScheduleKind::interleaved ? std::max(2, vpp) : 1;
      c.schedule = kind;
      c.micro_batch = mbs;
      c.num_micro_batches = m;
      c.train_iters = warmup + iters;
      c.lr = 1e-3;
      Trainer tr(world, c);
      ProcessGrid& grid = tr.grid();
      const GridCoord me = grid.coord();
      const int P = c.pp, V = c.vpp;

      // One host shares one steady clock; across hosts estimate offsets after a barrier.
      bool one_host = true;
      for (const auto& h : grid.hosts()) one_host = one_host && h == grid.hosts().front();
      std::vector<double> offsets(static_cast<size_t>(W), 0.0);
      if (!one_host) {
        world->barrier().wait();
        std::vector<double> t{now_s()};
        world->all_gather(std::span<const double>(t), std::span<double>(offsets)).wait();
        const double t0 = offsets[0];
        for (auto& o : offsets) o -= t0;
      }
      const auto& gc = tr.model_config();
      const size_t act_floats = static_cast<size_t>(mbs) * tr.config().seq.value() * gc.n_embd;
      const double lat = p2p_latency(grid.pp(), act_floats);

      if (world->rank() == 0 && !header) {
        header = true;
        fmt::print("# schedule_bench: {} | tp {} pp {} dp {} | m {} micro-batches of {} x {} tokens | {} timed "
                   "iterations after {} warm-up\n# {}\n",
                   gc.describe(), tp, P, dp, m, mbs, tr.config().seq.value(), iters, warmup, bench::machine_line(grid.local_size()));
      }

      Result res;
      res.schedule = kname;
      res.p = P;
      res.v = V;
      res.m = m;
      res.p2p_ms = lat * 1e3;
      std::vector<double> overall, makespan_frac, steps;
      std::vector<std::vector<double>> per_stage(static_cast<size_t>(P));
      std::map<std::tuple<int, int, PipeOp>, std::vector<double>> durations, cpu_durations;
      std::vector<std::vector<Rec>> kept;
      double cpu_sum = 0, wall_sum = 0;
      const Schedule* sched = nullptr;
      for (int it = 0; it < warmup + iters; ++it) {
        const IterationMetrics mt = tr.step(true);
        sched = &tr.last_schedule();
        // Check: this rank ran exactly its list's compute instructions, in order, with sane times.
        const auto& list = sched->lists.at(static_cast<size_t>(me.pp));
        size_t k = 0;
        bool good = std::isfinite(mt.loss);
        for (const auto& in : list) {
          if (!is_compute(in.op)) continue;
          const auto& evs = tr.last_step().events;
          good = good && k < evs.size() && evs[k].instr == in && evs[k].end >= evs[k].start &&
                 (k == 0 || evs[k].start >= evs[k - 1].end);
          ++k;
        }
        good = good && k == tr.last_step().events.size();
        int bad[1] = {good ? 0 : 1};
        world->all_reduce(std::span<int>(bad), ReduceOp::max).wait();
        if (bad[0]) {
          res.ok = false;
          if (world->rank() == 0)
            fmt::print(stderr, "schedule_bench: iteration {} of {}: recorded events do not match the schedule or the "
                       "loss is not finite\n", it + 1, kname);
        }
        auto recs = gather_events(*world, tr, me, offsets);
        if (it < warmup) continue;
        steps.push_back(mt.elapsed_ms);
        if (world->rank() != 0) continue;
        // Bubble per pipeline (tp, dp coordinates), then the mean over pipelines.
        std::map<std::pair<int, int>, std::vector<TimedEvent>> pipes;
        for (const auto& r : recs) {
          pipes[{r.tp, r.dp}].push_back(TimedEvent{r.stage, "", kind_letter(r.op), r.start, r.end - r.start, r.mb,
                                                    r.chunk, true});
          durations[{r.stage, r.chunk, r.op}].push_back(r.end - r.start);
          cpu_durations[{r.stage, r.chunk, r.op}].push_back(r.cpu);
          cpu_sum += r.cpu;
          wall_sum += r.end - r.start;
        }
        double o = 0, om = 0;
        std::vector<double> ps(static_cast<size_t>(P), 0.0);
        for (auto& [key, evs] : pipes) {
          const BubbleStats b = bubble_stats(evs, P);
          o += b.ratio() / pipes.size();
          om += b.of_makespan() / pipes.size();
          for (int s = 0; s < P; ++s) ps[static_cast<size_t>(s)] += b.ratio(s) / pipes.size();
        }
        overall.push_back(o);
        makespan_frac.push_back(om);
        for (int s = 0; s < P; ++s) per_stage[static_cast<size_t>(s)].push_back(ps[static_cast<size_t>(s)]);
        kept.push_back(std::move(recs));
      }
      res.step_ms = bench::median(steps);

      if (world->rank() == 0) {
        res.measured = bench::median(overall);
        res.of_makespan = bench::median(makespan_frac);
        res.cpu_share = wall_sum > 0 ? cpu_sum / wall_sum : 0;
        for (int s = 0; s < P; ++s) res.stage_measured.push_back(bench::median(per_stage[static_cast<size_t>(s)]));
        // Mean cost per (stage, chunk, kind); overall means for the closed forms.
        std::map<std::tuple<int, int, PipeOp>, double> cost;
        std::map<PipeOp, std::vector<double>> by_kind;
        std::map<std::pair<int, PipeOp>, std::vector<double>> by_stage_kind;
        for (const auto& [key, d] : durations) {
          cost[key] = bench::mean(d);
          by_kind[std::get<2>(key)].insert(by_kind[std::get<2>(key)].end(), d.begin(), d.end());
          auto& v = by_stage_kind[{std::get<0>(key), std::get<2>(key)}];
          v.insert(v.end(), d.begin(), d.end());
        }
        for (const auto& [key, d] : by_stage_kind) res.cost_ms[{key.first, kind_letter(key.second)}] = bench::mean(d) * 1e3;
        std::map<std::tuple<int, int, PipeOp>, double> cpu_cost;
        std::map<std::pair<int, PipeOp>, std::vector<double>> cpu_by_stage_kind;
        for (const auto& [key, d] : cpu_durations) {
          cpu_cost[key] = bench::mean(d);
          auto& v = cpu_by_stage_kind[{std::get<0>(key), std::get<2>(key)}];
          v.insert(v.end(), d.begin(), d.end());
        }
        for (const auto& [key, d] : cpu_by_stage_kind) res.cpu_ms[{key.first, kind_letter(key.second)}] = bench::mean(d) * 1e3;
        auto kmean = [&](PipeOp op) { return by_kind.count(op) ? bench::mean(by_kind[op]) : 0.0; };
        SimCosts sc;
        sc.forward = kmean(PipeOp::forward);
        sc.backward = kmean(PipeOp::backward);
        sc.backward_input = kmean(PipeOp::backward_input);
        sc.backward_weight = kmean(PipeOp::backward_weight);
        try {
          res.theory = theoretical_bubble(kind, P, V, m, sc);
        } catch (const ConfigError& e) {
          res.theory_note = e.what();
        }
        const ComputeCostFn fn = [&](int stage, const PipeInstr& in) {
          auto it = cost.find({stage, in.chunk, in.op});
          return it == cost.end() ? 0.0 : it->second;
        };
        const SimResult sim = simulate_schedule(*sched, fn, lat);
        const SimResult sim0 = simulate_schedule(*sched, fn, 0.0);
        res.simulated = sim.bubble.ratio();
        res.simulated_no_comm = sim0.bubble.ratio();
        const ComputeCostFn cpu_fn = [&](int stage, const PipeInstr& in) {
          auto it = cpu_cost.find({stage, in.chunk, in.op});
          return it == cpu_cost.end() ? 0.0 : it->second;
        };
        res.simulated_cpu = simulate_schedule(*sched, cpu_fn, lat).bubble.ratio();
        for (int s = 0; s < P; ++s) res.stage_simulated.push_back(sim.bubble.ratio(s));

        // The iteration whose bubble is the median: its time line and trace.
        size_t pick = 0;
        for (size_t i = 0; i < overall.size(); ++i)
          if (std::abs(overall[i] - res.measured) < std::abs(overall[pick] - res.measured)) pick = i;
        const auto& recs = kept.at(pick);
        double t0 = std::numeric_limits<double>::infinity();
        for (const auto& r : recs) t0 = std::min(t0, r.start - r.wait);
        std::vector<TimedEvent> stage_evs, rank_evs;
        for (const auto& r : recs) {
          const std::string name = fmt::format("{}{}{}", kind_letter(r.op), r.mb, V > 1 ? fmt::format(".{}", r.chunk) : "");
          if (r.tp == 0 && r.dp == 0)
            stage_evs.push_back(TimedEvent{r.stage, name, kind_letter(r.op), r.start - t0, r.end - r.start, r.mb, r.chunk, true});
          rank_evs.push_back(TimedEvent{r.world_rank, name, kind_letter(r.op), r.start - t0, r.end - r.start, r.mb, r.chunk, true});
          if (r.wait > 0)
            rank_evs.push_back(TimedEvent{r.world_rank, fmt::format("wait {}", name), "wait", r.start - r.wait - t0, r.wait,
                                          r.mb, r.chunk, false});
        }
        fmt::print("\n== {} (p={} v={} m={}): pipeline tp 0 dp 0, iteration with the median bubble ==\n",
                   sched->label(), P, V, m);
        AsciiOptions ao;
        ao.max_width = width;
        const std::string tl = ascii_timeline(stage_evs, P, ao);
        // The time line's unit is in seconds: say it in ms.
        fmt::print("{}", tl);
        fmt::print("(times in seconds)\n");
        std::string costs;
        for (int s = 0; s < P; ++s) {
          costs += fmt::format("  stage {}:", s);
          for (const char* k : {"F", "BW", "B", "W"})
            if (res.cost_ms.count({s, k})) costs += fmt::format(" {} {:.2f}", k, res.cost_ms[{s, k}]);
        }
        fmt::print("mean compute per instruction (ms, per chunk):{}\n", costs);
        costs.clear();
        for (int s = 0; s < P; ++s) {
          costs += fmt::format("  stage {}:", s);
          for (const char* k : {"F", "BW", "B", "W"})
            if (res.cpu_ms.count({s, k})) costs += fmt::format(" {} {:.2f}", k, res.cpu_ms[{s, k}]);
        }
        fmt::print("mean CPU time per instruction (ms):{}\n", costs);
        fmt::print("activation message {:.0f} KiB: {:.3f} ms one way (ping-pong); median step {:.1f} ms\n",
                   act_floats * 4.0 / 1024, res.p2p_ms, res.step_ms);
        std::string stages_m, stages_s;
        for (int s = 0; s < P; ++s) {
          stages_m += fmt::format(" {:.3f}", res.stage_measured[static_cast<size_t>(s)]);
          stages_s += fmt::format(" {:.3f}", res.stage_simulated[static_cast<size_t>(s)]);
        }
        const std::string theory = std::isfinite(res.theory) ? fmt::format("{:.4f}", res.theory) : "n/a";
        const double diff = std::isfinite(res.theory) ? res.measured - res.theory : NAN;
        fmt::print("bubble {} (idle/compute): measured {:.4f} [stages{}] | theory {} | simulated with measured costs "
                   "{:.4f} [stages{}] ({:.4f} without p2p latency) | measured - theory {:+.1f} pp {}\n",
                   kname, res.measured, stages_m, theory, res.simulated, stages_s, res.simulated_no_comm, diff * 100,
                   !std::isfinite(diff) ? "(no closed form)"
                                        : (std::abs(diff) <= tolerance ? fmt::format("(within {:.0f} pp)", tolerance * 100)
                                                                       : fmt::format("(MISSES the {:.0f} pp target)", tolerance * 100)));
        if (!res.theory_note.empty()) fmt::print("  theory n/a: {}\n", res.theory_note);
        fmt::print("  simulated with the CPU-time costs (what an idle machine would show): {:.4f}\n", res.simulated_cpu);
        fmt::print("  share of the step's makespan idle: {:.4f}; CPU share of the compute intervals {:.3f}{}\n",
                   res.of_makespan, res.cpu_share,
                   res.cpu_share < 0.95 ? " (below 0.95: ranks lost their cores to other processes mid-compute, "
                                          "so compute intervals are stretched unevenly and the bubble is distorted)"
                                        : "");
        if (!trace.empty()) {
          std::string path = trace;
          if (kinds.size() > 1) {
            const auto dot = path.rfind(".json");
            path = dot == std::string::npos ? path + "." + kname : path.substr(0, dot) + "." + kname + ".json";
          }
          // One named row per world rank, with its grid coordinates.
          auto doc = nlohmann::json::parse(chrome_trace_json(rank_evs, 1e6));
          for (auto& ev : doc["traceEvents"])
            if (ev.value("name", "") == "thread_name") {
              const int r = ev["tid"].get<int>();
              const GridCoord cr = grid.layout().coord(r);
              ev["args"]["name"] = fmt::format("rank {} (pp {}, tp {}, dp {})", r, cr.pp, cr.tp, cr.dp);
            }
          doc["otherData"] = {{"schedule", sched->label()}, {"measured_bubble", res.measured},
                              {"theory_bubble", std::isfinite(res.theory) ? nlohmann::json(res.theory) : nlohmann::json()}};
          std::ofstream f(path);
          if (!f) TRIAX_THROW(IoError, "cannot open '{}' for the Chrome trace", path);
          f << doc.dump() << "\n";
          fmt::print("  wrote {}\n", path);
        }
        std::fflush(stdout);
      }
      if (!res.ok) rc = 1;
      results.push_back(std::move(res));
    }

    if (world->rank() == 0) {
      fmt::print("\n{:<12} {:>2} {:>2} {:>3} {:>9} {:>8} {:>10} {:>9} {:>9} {:>9} {:>9}\n", "schedule", "p", "v", "m",
                 "measured", "theory", "simulated", "diff(pp)", "step(ms)", "p2p(ms)", "cpu-share");
      for (const auto& r : results)
        fmt::print("{:<12} {:>2} {:>2} {:>3} {:>9.4f} {:>8} {:>10.4f} {:>9} {:>9.1f} {:>9.3f} {:>9.3f}\n", r.schedule,
                   r.p, r.v, r.m, r.measured, std::isfinite(r.theory) ? fmt::format("{:.4f}", r.theory) : "n/a",
                   r.simulated, std::isfinite(r.theory) ? fmt::format("{:+.1f}", (r.measured - r.theory) * 100) : "n/a",
                   r.step_ms, r.p2p_ms, r.cpu_share);
      if (!json_path.empty()) {
        nlohmann::json j = nlohmann::json::array();
        for (const auto& r : results) {
          nlohmann::json costs = nlohmann::json::object();
          for (const auto& [k, v] : r.cost_ms) costs[fmt::format("stage{}_{}", k.first, k.second)] = v;
          nlohmann::json cpu_costs = nlohmann::json::object();
          for (const auto& [k, v] : r.cpu_ms) cpu_costs[fmt::format("stage{}_{}", k.first, k.second)] = v;
          j.push_back({{"schedule", r.schedule}, {"p", r.p}, {"v", r.v}, {"m", r.m}, {"tp", tp}, {"dp", dp},
                       {"ranks", W}, {"measured", r.measured}, {"stage_measured", r.stage_measured},
                       {"theory", std::isfinite(r.theory) ? nlohmann::json(r.theory) : nlohmann::json()},
                       {"simulated", r.simulated}, {"simulated_no_comm", r.simulated_no_comm}, {"simulated_cpu", r.simulated_cpu},
                       {"stage_simulated", r.stage_simulated}, {"of_makespan", r.of_makespan},
                       {"step_ms", r.step_ms}, {"p2p_ms", r.p2p_ms}, {"cpu_share", r.cpu_share}, {"cost_ms", costs}, {"cpu_ms", cpu_costs}, {"ok", r.ok},
                       {"load_average", bench::load_average()}});
        }
        std::ofstream(json_path) << j.dump(2) << "\n";
      }
    }
  } catch (const ConfigError& e) {
    fmt::print(stderr, "schedule_bench: configuration error: {}\n", e.what());
    bench::abort_job(2);
  } catch (const std::exception& e) {
    fmt::print(stderr, "schedule_bench: {}\n", e.what());
    bench::abort_job(1);
  }
  return rc;
}

#else

int main() {
  std::fputs("schedule_bench needs MPI (build with -DTRIAX_WITH_MPI=ON and launch with mpirun)\n", stderr);
  return 77;
}

#endif
