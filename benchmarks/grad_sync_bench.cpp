// grad_sync_bench: exposed data-parallel communication with and without bucket overlap.
// A synthetic backward (fixed arithmetic per layer, in chunks with GradBuffer::progress() in
// between, as the executor does between ops) marks each layer's gradients ready in reverse order;
// then finish() waits for what is left. Both modes run alternately in one process, and every
// step's reduced gradients are checked bit-exactly against the closed form.
//
//   mpirun -np 2 grad_sync_bench --grad-mb 32 --layers 12 --backward-ms 400 --bucket-mb 4
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <numeric>

#include "triax/distributed/bootstrap/bootstrap.h"
#include "triax/distributed/grid.h"
#include "triax/optim/grad_buffer.h"

#include "synthetic_compute.h"

using namespace triax;

namespace {

using bench::Clock;
using bench::calibrate;
using bench::compute;
using bench::median;
using bench::secs;

float base_value(size_t k) { return static_cast<float>(static_cast<int64_t>(k % 97) - 48) / 8.0f; }

struct Mode {
  std::string name;
  bool overlap;
  std::vector<double> step_s, backward_s, exposed_s, comm_span_s, progress_s, skew_s, net_s;
  size_t started_early = 0;
  int64_t wrong = 0;
};


}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Exposed DP gradient communication with and without bucket overlap"};
  double grad_mb = 32, bucket_mb = 4, backward_ms = 400, chunk_ms = 0.5;
  int layers = 12, iters = 7, warmup = 1;
  bool zero1 = false;
  std::string json_path;
  app.add_option("--grad-mb", grad_mb, "gradient buffer size per rank (MB)");
  app.add_option("--layers", layers, "layers (one parameter each, equal sizes)");
  app.add_option("--backward-ms", backward_ms, "compute time of the whole backward (ms, calibrated)");
  app.add_option("--chunk-ms", chunk_ms, "compute between two progress() calls (ms)");
  app.add_option("--bucket-mb", bucket_mb, "bucket size (MB)");
  app.add_option("--iters", iters, "timed steps per mode");
  app.add_option("--warmup", warmup, "untimed steps per mode");
  app.add_flag("--zero1", zero1, "reduce-scatter (ZeRO-1) instead of all-reduce");
  app.add_option("--json", json_path, "write the results as JSON (rank 0)");
  CLI11_PARSE(app, argc, argv);

  int rc = 0;
  try {
    auto boot = Bootstrap::create();
    auto world = boot->world();
    ProcessGrid grid(world, GridShape{1, 1, world->size()});
    Communicator& dp = grid.dp();
    const int n = dp.size();

    const size_t total = static_cast<size_t>(grad_mb * 1024 * 1024 / sizeof(float));
    const size_t per = std::max<size_t>(1, total / static_cast<size_t>(layers));
    ParamStore store;
    for (int l = 0; l < layers; ++l)
      store.add(ParamSpec{fmt::format("h.{}.w", l), {static_cast<int64_t>(per)}}, {static_cast<int64_t>(per)});
    store.finalize(static_cast<size_t>(n));

    // Same compute budget on every rank: the slowest calibration wins (so no rank idles).
    double rate[1] = {calibrate()};
    world->all_reduce(std::span<double>(rate), ReduceOp::min).wait();
    const int64_t units_per_chunk = std::max<int64_t>(1, static_cast<int64_t>(rate[0] * chunk_ms));
    const int chunks_per_layer = std::max(1, static_cast<int>(backward_ms / chunk_ms / layers));

    std::vector<Mode> modes = {{"no overlap", false, {}, {}, {}, {}, {}}, {"overlap", true, {}, {}, {}, {}, {}}};
    std::vector<std::unique_ptr<GradBuffer>> gbs;
    for (auto& m : modes) {
      GradBufferOptions o;
      o.bucket_bytes = static_cast<size_t>(bucket_mb * 1024 * 1024);
      o.overlap = m.overlap;
      o.sync = zero1 ? GradSync::reduce_scatter : GradSync::all_reduce;
      gbs.push_back(std::make_unique<GradBuffer>(store, dp, o));
    }
    const float factor = static_cast<float>(n + 1) / 2.0f;  // average of (r + 1) over ranks
    for (int it = 0; it < warmup + iters; ++it) {
      for (size_t mi = 0; mi < modes.size(); ++mi) {
        auto& m = modes[mi];
        GradBuffer& gb = *gbs[mi];
        auto g = store.flat_grads();
        for (size_t k = 0; k < store.numel(); ++k) g[k] = static_cast<float>(dp.rank() + 1) * base_value(k);
        world->barrier().wait();
        const auto t0 = Clock::now();
        for (int l = layers; l-- > 0;) {
          for (int c = 0; c < chunks_per_layer; ++c) {
            compute(units_per_chunk);
            gb.progress();
          }
          gb.mark_ready(static_cast<size_t>(l));
        }
        const auto t1 = Clock::now();
        const auto st = gb.finish();
        const auto t2 = Clock::now();
        // Check: bit-exact average (values are multiples of 1/8 times small integers).
        int64_t wrong = 0;
        if (zero1) {
          for (const auto& seg : gb.shard_segments())
            for (size_t k = 0; k < seg.count; ++k)
              wrong += gb.shard_grads()[seg.shard_offset + k] != base_value(seg.flat_offset + k) * factor;
        } else {
          for (size_t k = 0; k < store.numel(); ++k) wrong += g[k] != base_value(k) * factor;
        }
        m.wrong += wrong;
        // Part of finish() is waiting for a slower rank to end its backward (CPU sharing on an
        // oversubscribed machine): that is load imbalance, not communication. Steps start together
        // (barrier), so the slowest rank's backward time tells how long this rank waited for it.
        double slowest[1] = {secs(t0, t1)};
        world->all_reduce(std::span<double>(slowest), ReduceOp::max).wait();
        const double skew = slowest[0] - secs(t0, t1);
        if (it < warmup) continue;
        m.skew_s.push_back(skew);
        m.net_s.push_back(std::max(0.0, st.exposed_s - skew));
        m.step_s.push_back(secs(t0, t2));
        m.backward_s.push_back(secs(t0, t1));
        m.exposed_s.push_back(st.exposed_s);
        m.comm_span_s.push_back(st.comm_span_s);
        m.progress_s.push_back(st.progress_s);
        m.started_early = st.started_early;
      }
    }
    // Worst rank decides (the step ends when the slowest rank does).
    constexpr size_t kS = 8;  // statistics per mode
    std::vector<double> stats;
    for (auto& m : modes)
      for (double v : {median(m.step_s), median(m.backward_s), median(m.exposed_s), median(m.comm_span_s),
                       median(m.progress_s), static_cast<double>(m.wrong), median(m.skew_s), median(m.net_s)})
        stats.push_back(v);
    world->all_reduce(std::span<double>(stats), ReduceOp::max).wait();
    int64_t wrong_total = 0;
    if (world->rank() == 0) {
      fmt::print("# grad_sync_bench: dp {} | {:.1f} MB gradients in {} layers | buckets {:.1f} MB ({} buckets) | {} | "
                 "backward {:.0f} ms of compute | medians of {} steps, worst rank\n",
                 n, grad_mb, layers, bucket_mb, gbs[0]->num_buckets(), zero1 ? "reduce-scatter (ZeRO-1)" : "all-reduce",
                 backward_ms, iters);
      fmt::print("{:>12} {:>10} {:>12} {:>12} {:>10} {:>10} {:>10} {:>12} {:>6} {:>7}\n", "mode", "step(ms)",
                 "backward(ms)", "exposed(ms)", "skew(ms)", "net(ms)", "span(ms)", "progress(ms)", "early", "#wrong");
      for (size_t mi = 0; mi < modes.size(); ++mi) {
        const double* s = &stats[mi * kS];
        fmt::print("{:>12} {:>10.2f} {:>12.2f} {:>12.2f} {:>10.2f} {:>10.2f} {:>10.2f} {:>12.2f} {:>6} {:>7}\n",
                   modes[mi].name, s[0] * 1e3, s[1] * 1e3, s[2] * 1e3, s[6] * 1e3, s[7] * 1e3, s[3] * 1e3,
                   s[4] * 1e3, modes[mi].started_early, static_cast<int64_t>(s[5]));
        wrong_total += static_cast<int64_t>(s[5]);
      }
      // Hidden fraction on the net exposed times (exposed minus waiting for a slower rank).
      const double comm = stats[7], exposed = stats[kS + 7];
      const double hidden = comm > 0 ? 1.0 - exposed / comm : 0.0;
      fmt::print("hidden: {:.1f}% of the no-overlap communication time ({:.2f} ms -> {:.2f} ms exposed, net of "
                 "skew); step time {:.2f} -> {:.2f} ms\n",
                 100 * hidden, comm * 1e3, exposed * 1e3, stats[0] * 1e3, stats[kS] * 1e3);
      if (!json_path.empty()) {
        nlohmann::json j = {{"dp", n}, {"grad_mb", grad_mb}, {"layers", layers}, {"bucket_mb", bucket_mb},
                            {"buckets", gbs[0]->num_buckets()}, {"zero1", zero1}, {"backward_ms", backward_ms},
                            {"iters", iters}, {"hidden_fraction", hidden}};
        for (size_t mi = 0; mi < modes.size(); ++mi) {
          const double* s = &stats[mi * kS];
          j[modes[mi].overlap ? "overlap" : "no_overlap"] = {
              {"step_ms", s[0] * 1e3}, {"backward_ms", s[1] * 1e3}, {"exposed_ms", s[2] * 1e3},
              {"comm_span_ms", s[3] * 1e3}, {"progress_ms", s[4] * 1e3}, {"wrong", s[5]},
              {"skew_ms", s[6] * 1e3}, {"net_exposed_ms", s[7] * 1e3}};
        }
        std::ofstream(json_path) << j.dump(2) << "\n";
      }
    }
    int64_t w[1] = {wrong_total};
    world->all_reduce(std::span<int64_t>(w), ReduceOp::max).wait();
    rc = w[0] == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "grad_sync_bench: {}\n", e.what());
    return 2;
  }
  return rc;
}
