// cp_bench: context parallelism's two measured claims (issue 28, docs/CONTEXT_PARALLEL.md).
//
//   memory   activation bytes per rank, from the backend allocator, at a fixed sequence length for
//            every cp of --cp-list. The world is split into groups of cp ranks (each group one
//            trainer at tp 1 pp 1 dp 1 cp c, all groups alike); after a warm-up step (optimizer
//            states and the CP exchange buffers allocated), a step runs between reset_peak() and
//            peak_bytes(): activations = peak during the step - bytes in use before it. The
//            persistent bytes (parameters, gradients, optimizer, pipeline and CP buffers) are
//            printed beside, and their growth over cp 1 (the K/V exchange buffers). Max over ranks.
//   overlap  the exposed K/V exchange time per step and the share hidden (1 - exposed / total,
//            ContextParallel::stats() via the iteration metrics, max over ranks), p2p against
//            allgather at cp = world size, with the step time. The two sides alternate in rounds
//            (who goes first alternates too), each round's numbers and ratios printed: this
//            machine's speed drifts.
// Checks (exit 1): finite losses, and the two comm types give the same loss at each step (they
// compute the same attention; float summation order differs: |diff| <= 1e-4 relative). With
// --max-ratio R (exit 3): the largest cp's activations must be at most R x cp 1's.
//
//   OMP_NUM_THREADS=1 mpirun -np 4 cp_bench --table memory --cp-list 1,2,4 --seq 4096
//   OMP_NUM_THREADS=1 mpirun -np 2 cp_bench --table overlap --seq 4096 --rounds 4
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cmath>
#include <map>

#include "triax/core/error.h"
#include "triax/distributed/bootstrap/bootstrap.h"
#include "triax/parallel/context_parallel.h"

#include "bench_common.h"

using namespace triax;

namespace {

struct Options {
  bench::ModelFlags model;
  std::string table = "both";
  std::vector<int> cp_list = {1, 2, 4};
  int64_t micro_batch = 1;
  int rounds = 4, iters = 2;
  double max_ratio = 0;
};

TrainConfig bench_config(const Options& o, int cp, const std::string& comm_type) {
  TrainConfig c;
  o.model.apply(c);
  c.cp = cp;
  c.dp = 1;
  c.cp_comm_type = comm_type;
  c.micro_batch = o.micro_batch;
  c.global_batch = o.micro_batch;
  c.train_iters = 1000000;
  c.lr = 1e-3;
  return c;
}

double max_over(Communicator& world, double v) {
  double a[1] = {v};
  world.all_reduce(std::span<double>(a), ReduceOp::max).wait();
  return a[0];
}

// One memory row: allocator bytes per rank, max over ranks: the model state (parameters,
// gradients, AdamW moments: in use once the trainer is built) and the high-water mark of a
// training step after a warm-up step, for each comm type.
struct MemRow {
  int cp = 0;
  double state = 0;
  double peak[2] = {0, 0};  // p2p, allgather
  double activations(int k) const { return peak[k] - state; }
};

constexpr const char* kCommTypes[2] = {"p2p", "allgather"};

MemRow measure_memory(const Options& o, const std::shared_ptr<Communicator>& world, int cp) {
  std::shared_ptr<Communicator> group = world->split(world->rank() / cp, world->rank(), fmt::format("cp{}", cp));
  MemRow row{cp};
  for (int k = 0; k < 2; ++k) {
    Trainer t(group, bench_config(o, cp, kCommTypes[k]));
    Backend& be = t.backend();
    row.state = max_over(*world, static_cast<double>(be.bytes_in_use()));
    t.step();  // warm-up: the model's activation and the CP exchange buffers exist from here on
    be.reset_peak();
    const IterationMetrics mt = t.step();
    if (!std::isfinite(mt.loss)) TRIAX_THROW(Error, "cp {}: non-finite loss {}", cp, mt.loss);
    row.peak[k] = max_over(*world, static_cast<double>(be.peak_bytes()));
  }
  return row;
}

int memory_table(const Options& o, const std::shared_ptr<Communicator>& world) {
  const bool r0 = world->rank() == 0;
  std::vector<MemRow> rows;
  for (int cp : o.cp_list) {
    if (world->size() % cp != 0) TRIAX_THROW(ConfigError, "--cp-list: cp {} does not divide {} ranks", cp, world->size());
    rows.push_back(measure_memory(o, world, cp));
  }
  const double MiB = 1 << 20;
  if (r0) {
    fmt::print("# memory: seq {} x micro-batch {} | allocator bytes per rank, max over ranks | activations = high-water "
               "mark of a step (after a warm-up step) - model state (parameters, gradients, AdamW moments)\n",
               o.model.seq, o.micro_batch);
    fmt::print("{:>3} | {:>6} | {:>9} | {:>26} | {:>26} | {:>9}\n", "cp", "rows", "state MiB", "activations MiB, p2p",
               "activations MiB, allgather", "peak MiB");
    fmt::print("{:>3} | {:>6} | {:>9} | {:>8} {:>8} {:>8} | {:>8} {:>8} {:>8} | {:>9}\n", "", "/ rank", "", "MiB",
               "vs cp 1", "-1/cp", "MiB", "vs cp 1", "-1/cp", "p2p");
  }
  const MemRow& base = rows.front();
  for (const MemRow& r : rows) {
    const double a = r.activations(0), g = r.activations(1), a1 = base.activations(0), g1 = base.activations(1);
    if (r0)
      fmt::print("{:>3} | {:>6} | {:>9.2f} | {:>8.2f} {:>8.3f} {:>8.2f} | {:>8.2f} {:>8.3f} {:>8.2f} | {:>9.2f}\n", r.cp,
                 o.model.seq / r.cp, r.state / MiB, a / MiB, a / a1, (a - a1 / r.cp) / MiB, g / MiB, g / g1,
                 (g - g1 / r.cp) / MiB, r.peak[0] / MiB);
  }
  if (r0) fmt::print("(-1/cp: MiB above cp 1's activations / cp, what does not shrink with cp: the K/V exchange "
                     "buffers and the per-rank working buffers)\n");
  const double worst = rows.back().activations(0) / base.activations(0);
  if (o.max_ratio > 0 && worst > o.max_ratio) {
    if (r0) fmt::print("FAILED: cp {} holds {:.3f} of cp {}'s activations (limit {:.3f})\n", rows.back().cp, worst,
                       base.cp, o.max_ratio);
    return 3;
  }
  return 0;
}

// One side's per-round means (ms; step time and exchanges max over ranks).
struct Side {
  std::string name;
  std::unique_ptr<Trainer> trainer;
  std::vector<double> exposed, total, step;
  std::vector<double> losses;
};

void run_round(Side& s, int iters) {
  double e = 0, t = 0, st = 0;
  for (int i = 0; i < iters; ++i) {
    s.trainer->grid().world().barrier().wait();
    const IterationMetrics m = s.trainer->step();
    e += m.cp_exposed_ms;
    t += m.cp_exchange_ms;
    st += m.elapsed_ms;
    s.losses.push_back(m.loss);
  }
  s.exposed.push_back(e / iters);
  s.total.push_back(t / iters);
  s.step.push_back(st / iters);
}

double hidden(double exposed, double total) { return total > 0 ? 1.0 - exposed / total : 0.0; }

void print_round(size_t r, const Side& a, const Side& b) {
  fmt::print("{:>5} | {:>8.2f} {:>8.2f} {:>6.1f}% {:>9.1f} | {:>8.2f} {:>8.2f} {:>6.1f}% {:>9.1f} | {:>7.3f} {:>7.3f}\n",
             r + 1, a.exposed[r], a.total[r], 100 * hidden(a.exposed[r], a.total[r]), a.step[r], b.exposed[r],
             b.total[r], 100 * hidden(b.exposed[r], b.total[r]), b.step[r], a.step[r] / b.step[r],
             b.exposed[r] > 0 ? a.exposed[r] / b.exposed[r] : NAN);
}

// Same step, same data, same weights: the two comm types' losses agree to float rounding.
int compare_losses(const Side& a, const Side& b, bool r0) {
  double worst = 0;
  bool finite = true;
  for (size_t i = 0; i < a.losses.size(); ++i) {
    finite = finite && std::isfinite(a.losses[i]) && std::isfinite(b.losses[i]);
    worst = std::max(worst, std::abs(a.losses[i] - b.losses[i]) / std::max(1e-12, std::abs(b.losses[i])));
  }
  if (r0) fmt::print("losses: {} steps per side, largest relative difference p2p vs allgather {:.2e}\n",
                     a.losses.size(), worst);
  if (finite && worst <= 1e-4) return 0;
  if (r0) fmt::print("FAILED: {} losses\n", finite ? "different" : "non-finite");
  return 1;
}

void print_summary(const Side& a, const Side& b) {
  for (const Side* s : {&a, &b}) {
    std::vector<double> h;
    for (size_t r = 0; r < s->exposed.size(); ++r) h.push_back(hidden(s->exposed[r], s->total[r]));
    fmt::print("{:>9}: median of rounds exposed {:.2f} ms of {:.2f} ms ({:.1f}% hidden), step {:.1f} ms\n", s->name,
               bench::median(s->exposed), bench::median(s->total), 100 * bench::median(h), bench::median(s->step));
  }
}

int overlap_table(const Options& o, const std::shared_ptr<Communicator>& world) {
  const int cp = world->size();
  if (cp < 2) TRIAX_THROW(ConfigError, "--table overlap needs cp >= 2: run it under mpirun -np 2 or more");
  Side sides[2] = {{"p2p", {}, {}, {}, {}, {}}, {"allgather", {}, {}, {}, {}, {}}};
  for (Side& s : sides) {
    s.trainer = std::make_unique<Trainer>(world, bench_config(o, cp, s.name));
    s.trainer->step();  // warm-up
  }
  const bool r0 = world->rank() == 0;
  if (r0) {
    fmt::print("# overlap: cp {} | seq {} x micro-batch {} | {} step(s) per side per round, sides alternated | per step, "
               "max over ranks\n",
               cp, o.model.seq, o.micro_batch, o.iters);
    fmt::print("{:>5} | {:>38} | {:>38} | {:>15}\n", "round", "p2p (ring)", "allgather", "p2p / allgather");
    fmt::print("{:>5} | {:>8} {:>8} {:>7} {:>9} | {:>8} {:>8} {:>7} {:>9} | {:>7} {:>7}\n", "", "exp. ms",
               "total ms", "hidden", "step ms", "exp. ms", "total ms", "hidden", "step ms", "step", "exposed");
  }
  for (int r = 0; r < o.rounds; ++r) {
    const bool flip = r % 2 == 1;
    run_round(sides[flip ? 1 : 0], o.iters);
    run_round(sides[flip ? 0 : 1], o.iters);
    if (r0) print_round(static_cast<size_t>(r), sides[0], sides[1]);
  }
  if (r0) print_summary(sides[0], sides[1]);
  return compare_losses(sides[0], sides[1], r0);
}

void add_options(CLI::App& app, Options& o) {
  o.model.layers = 2;
  o.model.hidden = 128;
  o.model.heads = 4;
  o.model.seq = 4096;
  o.model.add(app);
  app.add_option("--table", o.table, "memory, overlap or both")->capture_default_str();
  app.add_option("--cp-list", o.cp_list, "memory table: the cp sizes (each divides the world)")->delimiter(',');
  app.add_option("--micro-batch-size", o.micro_batch)->capture_default_str();
  app.add_option("--rounds", o.rounds, "overlap table: rounds of both sides")->capture_default_str();
  app.add_option("--iters", o.iters, "overlap table: steps per side per round")->capture_default_str();
  app.add_option("--max-ratio", o.max_ratio,
                 "memory table: exit 3 when the last cp's activations exceed this share of the first's (0: no check)")
      ->capture_default_str();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cp_bench: context parallelism's activation memory per rank and exposed K/V exchange time"};
  Options o;
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  if (o.table != "memory" && o.table != "overlap" && o.table != "both") {
    fmt::print(stderr, "--table must be memory, overlap or both, got '{}'\n", o.table);
    return 2;
  }
  int rc = 0;
  std::unique_ptr<Bootstrap> boot;  // outside the try: see train_bench
  try {
    boot = Bootstrap::create();
    auto world = boot->world();
    if (world->rank() == 0)
      fmt::print("# cp_bench: model {} with {} layers x {} channels, {} heads, vocab {} | {}\n", o.model.model,
                 o.model.layers, o.model.hidden, o.model.heads, o.model.vocab ? fmt::format("{}", o.model.vocab) : "of the preset",
                 bench::machine_line(world->size()));
    if (o.table != "overlap") rc = memory_table(o, world);
    if (o.table != "memory" && rc == 0) rc = overlap_table(o, world);
  } catch (const std::exception& e) {
    fmt::print(stderr, "cp_bench: {}\n", e.what());
    bench::abort_job(1);
  }
  return rc;
}
