// moe_bench: the expert-parallel MoE layer (ep = world size) forward + backward at several chunk
// counts - tokens/s and the exposed all-to-all time (blocked in Work::wait) with chunks = 1 (no
// overlap) and > 1 (dispatch / combine of one chunk in flight while the experts run another) - with
// a check that every chunk count gives the chunks = 1 outputs and gradients; and the all-to-all
// itself: Communicator::all_to_all_v against raw MPI_Alltoallv on the same MPI communicator,
// nccl-tests style (size, count, time, algbw, busbw, #wrong), with exact-value data checks.
//
//   mpirun -np 4 moe_bench                       # both parts
//   mpirun -np 2 moe_bench --mode layer --tokens 2048 --chunks 1,2,4,8
//   mpirun -np 8 moe_bench --mode alltoall --max-bytes 16M
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <random>

#include "triax/distributed/bootstrap/bootstrap.h"
#include "triax/distributed/grid.h"
#include "triax/model/moe.h"
#include "triax/model/param_shards.h"
#if defined(TRIAX_HAVE_MPI)
#include "triax/distributed/comm/mpi_comm.h"
#endif

using namespace triax;

namespace {

using Clock = std::chrono::steady_clock;
double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double rel_err(std::span<const float> a, std::span<const float> b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

struct LayerOpts {
  int tokens = 2048, hidden = 256, ffn = 1024, experts = 0, topk = 2, iters = 5, warmup = 1;
  double capacity_factor = 1.0;  // tight enough that the drop path runs
  bool no_drop = false;
  bool swiglu = false;  // Mixtral-shaped experts: SwiGLU, no biases
  std::vector<int> chunks{1, 2, 4, 8};
};

struct LayerRow {
  int chunks;
  double step_s, fwd_s, bwd_s, wait_s, net_s, call_s, expert_s, max_err;
  int64_t wrong;
};

int run_layer(Communicator& world, ProcessGrid& grid, const LayerOpts& o, nlohmann::json& out) {
  Communicator& ep = grid.ep();
  const int P = ep.size();
  MoeConfig cfg;
  cfg.experts = o.experts > 0 ? o.experts : std::max(8, 2 * P);
  cfg.top_k = o.topk;
  cfg.capacity_factor = o.capacity_factor;
  cfg.drop_tokens = !o.no_drop;
  cfg.aux_loss_coef = 0.01f;
  cfg.swiglu = o.swiglu;
  cfg.bias = !o.swiglu;
  ParamStore store;
  MoeMlp moe(cfg, 0, o.hidden, o.ffn, ep, store);
  store.finalize();
  moe.init_params(1, 12);
  // Larger router weights than init so routing is uneven (drops happen, loads differ by rank).
  auto wr = store.param(moe.router_param());
  const auto rv = init_normal(2, "bench.router", wr.size(), 0.3f);
  std::copy(rv.begin(), rv.end(), wr.begin());

  const size_t NC = static_cast<size_t>(o.tokens) * o.hidden;
  std::mt19937 gen(17u + static_cast<uint32_t>(world.rank()));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(NC), dy(NC), y(NC), dx(NC);
  for (auto& v : x) v = u(gen);
  for (auto& v : dy) v = u(gen) * 1e-2f;
  std::vector<float> y_ref, dx_ref, g_ref;

  // Chunk counts take turns step by step (a load spike on this shared machine hits them alike).
  const size_t K = o.chunks.size();
  std::vector<std::vector<double>> step(K), fwd(K), bwd(K), wait(K), net(K), call(K), expert(K);
  std::vector<double> err(K, 0.0);
  int64_t dropped = 0, capacity = 0;
  for (int it = 0; it < o.warmup + o.iters; ++it)
    for (size_t ci = 0; ci < K; ++ci) {
      moe.set_chunks(o.chunks[ci]);
      store.zero_grads();
      world.barrier().wait();
      const auto t0 = Clock::now();
      moe.forward(0, o.tokens, x.data(), y.data(), true);
      const auto t1 = Clock::now();
      moe.backward(0, dy.data(), dx.data(), 1.0f);
      const auto t2 = Clock::now();
      const MoeStats& f = moe.forward_stats();
      const MoeStats& b = moe.backward_stats();
      dropped = f.dropped;
      capacity = f.capacity;
      if (it == 0) {  // correctness: the same results as the first chunk count
        const auto g = store.flat_grads();
        if (ci == 0) {
          y_ref = y;
          dx_ref = dx;
          g_ref.assign(g.begin(), g.end());
        }
        err[ci] = std::max({rel_err(y, y_ref), rel_err(dx, dx_ref), rel_err(g, g_ref)});
      }
      // Net of waiting for a slower peer: per exchange, the wait of the rank that arrived last.
      std::vector<double> w = f.a2a_waits;
      w.insert(w.end(), b.a2a_waits.begin(), b.a2a_waits.end());
      world.all_reduce(std::span<double>(w), ReduceOp::min).wait();
      double net_s = 0;
      for (double v : w) net_s += v;
      if (it < o.warmup) continue;
      net[ci].push_back(net_s);
      step[ci].push_back(secs(t0, t2));
      fwd[ci].push_back(secs(t0, t1));
      bwd[ci].push_back(secs(t1, t2));
      wait[ci].push_back(f.a2a_wait_s + b.a2a_wait_s);
      call[ci].push_back(f.a2a_call_s + b.a2a_call_s);
      expert[ci].push_back(f.expert_s + b.expert_s);
    }
  std::vector<LayerRow> rows;
  for (size_t ci = 0; ci < K; ++ci) {
    // Worst rank decides.
    std::vector<double> s = {median(step[ci]), median(fwd[ci]),  median(bwd[ci]), median(wait[ci]),
                             median(net[ci]),  median(call[ci]), median(expert[ci]), err[ci]};
    world.all_reduce(std::span<double>(s), ReduceOp::max).wait();
    rows.push_back({o.chunks[ci], s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[7] > 1e-6 ? 1 : 0});
  }
  int64_t tot[2] = {o.tokens, dropped};
  world.all_reduce(std::span<int64_t>(tot), ReduceOp::sum).wait();
  int64_t wrong = 0;
  if (world.rank() == 0) {
    fmt::print("# moe_bench layer: ep {} | {} tokens/rank, C {}, F {}, E {} ({} per rank, {}), top-{}, {} | capacity {} "
               "(rank 0), {} of {} assignments dropped | forward + backward, medians of {} steps, worst rank\n",
               P, o.tokens, o.hidden, o.ffn, cfg.experts, cfg.experts / P, o.swiglu ? "SwiGLU" : "GELU", cfg.top_k,
               o.no_drop ? "no-drop" : fmt::format("capacity factor {}", o.capacity_factor), capacity, tot[1],
               tot[0] * cfg.top_k, o.iters);
    fmt::print("{:>6} {:>9} {:>9} {:>8} {:>8} {:>11} {:>8} {:>9} {:>10} {:>11} {:>8} {:>7}\n", "chunks", "step(ms)",
               "tokens/s", "fwd(ms)", "bwd(ms)", "exposed(ms)", "net(ms)", "calls(ms)", "experts(ms)",
               "hidden(net)", "max_err", "#wrong");
    const double base = rows.empty() ? 0 : rows[0].net_s;
    for (const auto& r : rows) {
      const double hidden = base > 0 && r.chunks != rows[0].chunks ? 1.0 - r.net_s / base : 0.0;
      fmt::print("{:>6} {:>9.2f} {:>9.0f} {:>8.2f} {:>8.2f} {:>11.2f} {:>8.2f} {:>9.2f} {:>10.2f} {:>10.1f}% {:>8.1e} "
                 "{:>7}\n",
                 r.chunks, r.step_s * 1e3, static_cast<double>(tot[0]) / r.step_s, r.fwd_s * 1e3, r.bwd_s * 1e3,
                 r.wait_s * 1e3, r.net_s * 1e3, r.call_s * 1e3, r.expert_s * 1e3, 100 * hidden, r.max_err, r.wrong);
      wrong += r.wrong;
      out["layer"].push_back({{"ep", P}, {"chunks", r.chunks}, {"step_ms", r.step_s * 1e3},
                              {"tokens_per_s", static_cast<double>(tot[0]) / r.step_s}, {"exposed_a2a_ms", r.wait_s * 1e3},
                              {"net_exposed_a2a_ms", r.net_s * 1e3}, {"a2a_calls_ms", r.call_s * 1e3},
                              {"experts_ms", r.expert_s * 1e3}, {"max_rel_err", r.max_err}});
    }
    fmt::print("exposed = time blocked in Work::wait on the counts / dispatch / combine exchanges (forward + "
               "backward, worst rank); net = per exchange the wait of the rank that arrived last (min over ranks), "
               "summed: exposed minus waiting for a slower peer; calls = inside the calls that start and test them; "
               "hidden = 1 - net / net(chunks {})\n\n",
               rows.empty() ? 1 : rows[0].chunks);
  }
  return wrong > 0 ? 1 : 0;
}

// ---- all-to-all: triax all_to_all_v vs raw MPI_Alltoallv --------------------------------------
// Element i of the block that rank s sends to rank d: a value that names (s, d, i) exactly.
float a2a_value(int s, int d, size_t i) { return static_cast<float>((s * 131 + d * 17 + static_cast<int>(i % 4099)) % 8191); }

int run_alltoall(Communicator& world, size_t min_bytes, size_t max_bytes, double target_s, int reps,
                 nlohmann::json& out) {
  const int P = world.size(), me = world.rank();
#if defined(TRIAX_HAVE_MPI)
  MPI_Comm raw = MPI_COMM_NULL;
  try {
    raw = mpi_handle(world);
  } catch (const Error&) {
    raw = MPI_COMM_NULL;  // one process without mpirun: no MPI to compare with
  }
#endif
  if (me == 0) {
    fmt::print("# moe_bench alltoall: {} ranks, float32, equal blocks through all_to_all_v (as MoE dispatch uses "
               "it); size = bytes each rank sends (all blocks); busbw = algbw * (n-1)/n\n", P);
    fmt::print("{:>10} {:>9} | {:>10} {:>7} {:>7} | {:>10} {:>7} {:>7} | {:>10} {:>7} {:>7} | {:>6} {:>6}\n",
               "size(B)", "count", "triax(us)", "algbw", "busbw", "Ia2av(us)", "algbw", "busbw", "a2av(us)", "algbw",
               "busbw", "ratio", "#wrong");
  }
  int64_t wrong_total = 0;
  for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    const size_t per = std::max<size_t>(1, bytes / sizeof(float) / static_cast<size_t>(P));
    const size_t n = per * static_cast<size_t>(P);
    std::vector<float> in(n), outb(n);
    for (int d = 0; d < P; ++d)
      for (size_t i = 0; i < per; ++i) in[static_cast<size_t>(d) * per + i] = a2a_value(me, d, i);
    std::vector<int64_t> counts(static_cast<size_t>(P), static_cast<int64_t>(per));
    auto check = [&] {
      int64_t w = 0;
      for (int s = 0; s < P; ++s)
        for (size_t i = 0; i < per; ++i) w += outb[static_cast<size_t>(s) * per + i] != a2a_value(s, me, i);
      return w;
    };
    auto triax_once = [&] {
      world.all_to_all_v(std::span<const float>(in), std::span<const int64_t>(counts), std::span<float>(outb),
                         std::span<const int64_t>(counts)).wait();
    };
#if defined(TRIAX_HAVE_MPI)
    std::vector<int> ic(static_cast<size_t>(P), static_cast<int>(per)), id(static_cast<size_t>(P));
    for (int r = 0; r < P; ++r) id[static_cast<size_t>(r)] = static_cast<int>(static_cast<size_t>(r) * per);
    auto mpi_once = [&] {
      MPI_Alltoallv(in.data(), ic.data(), id.data(), MPI_FLOAT, outb.data(), ic.data(), id.data(), MPI_FLOAT, raw);
    };
    auto mpi_i_once = [&] {
      MPI_Request req;
      MPI_Ialltoallv(in.data(), ic.data(), id.data(), MPI_FLOAT, outb.data(), ic.data(), id.data(), MPI_FLOAT, raw,
                     &req);
      MPI_Wait(&req, MPI_STATUS_IGNORE);
    };
#endif
    // The methods take turns, repetition by repetition, so a load spike on this shared machine hits
    // them alike; each repetition is timed on the slowest rank and the median repetition is kept.
    std::vector<std::function<void()>> methods = {triax_once};
#if defined(TRIAX_HAVE_MPI)
    if (raw != MPI_COMM_NULL) {
      methods.push_back(mpi_i_once);
      methods.push_back(mpi_once);
    }
#endif
    std::vector<int64_t> wrongs(methods.size(), 0);
    double est[1] = {0};
    for (size_t m = 0; m < methods.size(); ++m) {
      std::fill(outb.begin(), outb.end(), -1.0f);
      world.barrier().wait();
      const auto t = Clock::now();
      methods[m]();  // warm-up, timed for the iteration count, and the data check
      est[0] = std::max(est[0], secs(t, Clock::now()));
      wrongs[m] = check();
    }
    world.all_reduce(std::span<double>(est), ReduceOp::max).wait();
    const int iters = std::clamp(static_cast<int>(target_s / reps / std::max(est[0], 1e-7)), 2, 1000);
    std::vector<std::vector<double>> samples(methods.size());
    for (int r = 0; r < reps; ++r)
      for (size_t m = 0; m < methods.size(); ++m) {
        world.barrier().wait();
        const auto t = Clock::now();
        for (int i = 0; i < iters; ++i) methods[m]();
        double dt[1] = {secs(t, Clock::now()) / iters};
        world.all_reduce(std::span<double>(dt), ReduceOp::max).wait();
        samples[m].push_back(dt[0]);
      }
    const double tt = median(samples[0]);
    const double it = methods.size() > 1 ? median(samples[1]) : 0, mt = methods.size() > 2 ? median(samples[2]) : 0;
    int64_t w[1] = {0};
    for (auto x : wrongs) w[0] += x;
    world.all_reduce(std::span<int64_t>(w), ReduceOp::sum).wait();
    wrong_total += w[0];
    const double sz = static_cast<double>(n * sizeof(float));
    const double f = P > 1 ? static_cast<double>(P - 1) / P : 1.0;
    if (me == 0) {
      const double ta = sz / tt / 1e9, ia = it > 0 ? sz / it / 1e9 : 0, ma = mt > 0 ? sz / mt / 1e9 : 0;
      fmt::print("{:>10} {:>9} | {:>10.1f} {:>7.3f} {:>7.3f} | {:>10.1f} {:>7.3f} {:>7.3f} | {:>10.1f} {:>7.3f} "
                 "{:>7.3f} | {:>6.2f} {:>6}\n",
                 n * sizeof(float), n, tt * 1e6, ta, ta * f, it * 1e6, ia, ia * f, mt * 1e6, ma, ma * f,
                 it > 0 ? it / tt : 0.0, w[0]);
      out["alltoall"].push_back({{"np", P}, {"bytes", n * sizeof(float)}, {"triax_us", tt * 1e6},
                                 {"triax_busbw_gbs", ta * f}, {"mpi_ialltoallv_us", it * 1e6},
                                 {"mpi_ialltoallv_busbw_gbs", ia * f}, {"mpi_alltoallv_us", mt * 1e6},
                                 {"mpi_alltoallv_busbw_gbs", ma * f}, {"wrong", w[0]}});
    }
  }
  if (me == 0)
    fmt::print("triax = Communicator::all_to_all_v + Work::wait (MPI_Ialltoallv underneath, polled with MPI_Test); "
               "Ia2av = raw MPI_Ialltoallv + MPI_Wait; a2av = raw blocking MPI_Alltoallv; ratio = Ia2av time / "
               "triax time (1 = the wrapper costs nothing)\n\n");
  return wrong_total > 0 ? 1 : 0;
}

size_t parse_bytes(const std::string& s) {
  size_t end = 0;
  const double v = std::stod(s, &end);
  double mul = 1;
  if (end < s.size()) {
    const char c = static_cast<char>(std::toupper(static_cast<unsigned char>(s[end])));
    mul = c == 'K' ? 1024.0 : c == 'M' ? 1024.0 * 1024 : c == 'G' ? 1024.0 * 1024 * 1024 : 0;
    if (mul == 0 || end + 1 != s.size()) throw ConfigError(fmt::format("size '{}': expected a number with K, M or G", s));
  }
  return static_cast<size_t>(v * mul);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Expert-parallel MoE layer (tokens/s, exposed all-to-all vs chunk count) and all-to-all bandwidth"};
  std::string mode = "all", json_path, min_b = "4K", max_b = "16M";
  double target_s = 0.3;
  int reps = 7;
  LayerOpts o;
  app.add_option("--mode", mode, "layer, alltoall or all")->check(CLI::IsMember({"layer", "alltoall", "all"}));
  app.add_option("--tokens", o.tokens, "tokens per rank (one micro-batch)");
  app.add_option("--hidden", o.hidden, "C");
  app.add_option("--ffn", o.ffn, "F (expert hidden size)");
  app.add_option("--experts", o.experts, "E (default max(8, 2 np)); a multiple of np");
  app.add_option("--topk", o.topk, "1 or 2");
  app.add_option("--capacity-factor", o.capacity_factor, "capacity factor (drop mode)");
  app.add_flag("--no-drop", o.no_drop, "no-drop mode (capacity = largest load)");
  app.add_flag("--swiglu", o.swiglu, "Mixtral-shaped experts (SwiGLU, no biases) instead of GPT-2's (GELU, biases)");
  app.add_option("--chunks", o.chunks, "chunk counts to compare (the first is the reference)")->delimiter(',');
  app.add_option("--iters", o.iters, "timed steps per chunk count");
  app.add_option("--warmup", o.warmup, "untimed steps per chunk count");
  app.add_option("--min-bytes", min_b, "all-to-all: smallest size per rank");
  app.add_option("--max-bytes", max_b, "all-to-all: largest size per rank");
  app.add_option("--target-s", target_s, "all-to-all: seconds per size and method");
  app.add_option("--reps", reps, "all-to-all: repetitions per size and method (median kept)");
  app.add_option("--json", json_path, "write the results as JSON (rank 0)");
  CLI11_PARSE(app, argc, argv);

  int rc = 0;
  try {
    auto boot = Bootstrap::create();
    auto world = boot->world();
    const int P = world->size();
    nlohmann::json out;
    if (mode != "alltoall") {
      ProcessGrid grid(world, GridShape{1, 1, P, P});
      rc |= run_layer(*world, grid, o, out);
    }
    if (mode != "layer") rc |= run_alltoall(*world, parse_bytes(min_b), parse_bytes(max_b), target_s, reps, out);
    if (world->rank() == 0 && !json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  } catch (const std::exception& e) {
    fmt::print(stderr, "moe_bench: {}\n", e.what());
    return 2;
  }
  return rc;
}
