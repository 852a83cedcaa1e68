// comm_bench: an nccl-tests-style table of the triax collectives on the MPI backend. Every row
// also times the raw MPI call (MPI_Allreduce, ...) on a duplicate of the same communicator in
// the same run, interleaved with the triax measurement, and prints the ratio triax/raw in bus
// bandwidth. Results are checked against closed forms; any wrong element makes the exit code 1.
//
//   mpirun -np 4 comm_bench -b 8 -e 64M -f 2 -n 20 -w 5 --json results.json
#include <cstdio>

#if defined(TRIAX_HAVE_MPI)
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "triax/distributed/bootstrap/bootstrap.h"
#include "triax/distributed/comm/comm.h"
#include "triax/distributed/comm/mpi_comm.h"
#include "triax/plan/collective_model.h"
#include "comm_check.h"

namespace {

using namespace triax;
using clock_type = std::chrono::steady_clock;

// ---- element types: to_d, from_d, exact_int (comm_check.h). Every integer in [0, exact_int] is
// exact in T: the check patterns stay below it, so every partial sum is exact whatever order MPI
// reduces in.
using test::exact_int;
using test::from_d;
using test::kIsHalf;
using test::sum_period;
using test::to_d;

template <class T>
MPI_Datatype raw_type() {
  if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
  else if constexpr (std::is_same_v<T, int32_t>) return MPI_INT32_T;
  else if constexpr (std::is_same_v<T, int64_t>) return MPI_INT64_T;
  else if constexpr (kIsHalf<T>) return MPI_UINT16_T;
  else return MPI_BYTE;
}

// The raw side's own reductions for the 16-bit float types (what a program on plain MPI would
// write): widen to float, combine, round back.
template <class T, ReduceOp Op>
void raw_half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const T*>(in);
  auto* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = static_cast<float>(a[i]), y = static_cast<float>(b[i]);
    b[i] = T(Op == ReduceOp::max ? std::max(x, y) : Op == ReduceOp::min ? std::min(x, y) : x + y);
  }
}

template <class T>
MPI_Op raw_op(ReduceOp op) {
  if constexpr (kIsHalf<T>) {
    static MPI_Op ops[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
    const int k = op == ReduceOp::max ? 1 : op == ReduceOp::min ? 2 : 0;
    if (ops[k] == MPI_OP_NULL) {
      MPI_User_function* f = k == 1 ? &raw_half_op<T, ReduceOp::max>
                             : k == 2 ? &raw_half_op<T, ReduceOp::min>
                                      : &raw_half_op<T, ReduceOp::sum>;
      MPI_Op_create(f, 1, &ops[k]);
    }
    return ops[k];
  } else {
    return op == ReduceOp::max ? MPI_MAX : op == ReduceOp::min ? MPI_MIN : MPI_SUM;
  }
}

template <class T>
void raw_divide(T* p, size_t n, int by) {
  for (size_t i = 0; i < n; ++i) {
    if constexpr (kIsHalf<T>) p[i] = T(static_cast<float>(p[i]) / static_cast<float>(by));
    else p[i] = static_cast<T>(p[i] / static_cast<T>(by));
  }
}

void mpi_check(int code, const char* what) {
  if (code != MPI_SUCCESS) {
    char buf[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(code, buf, &len);
    throw CommError(fmt::format("{} failed: {}", what, std::string(buf, static_cast<size_t>(len))));
  }
}

// ---- check patterns (closed forms) ----
// Reduce: rank r contributes input(r, i); the reduced value at i is expect(i).
template <class T>
struct ReducePattern {
  ReduceOp op;
  int n;
  int64_t k;
  ReducePattern(ReduceOp o, int n_) : op(o), n(n_) {
    const int64_t m = exact_int<T>();
    if (op == ReduceOp::sum) k = sum_period<T>(n);
    else if (op == ReduceOp::avg) k = std::clamp<int64_t>((m - int64_t{n} * (n - 1)) / n + 1, 1, 1000);
    else k = std::min<int64_t>(m / 2, 1000);
  }
  double input(int r, size_t i) const {
    const auto j = static_cast<int64_t>(i % static_cast<size_t>(k));
    if (op == ReduceOp::sum) return static_cast<double>(r + 1 + j);
    if (op == ReduceOp::avg) return static_cast<double>(2 * r + j);
    return static_cast<double>(j - std::abs(r - static_cast<int64_t>(i % static_cast<size_t>(n))));
  }
  double expect(size_t i) const {
    const auto j = static_cast<int64_t>(i % static_cast<size_t>(k));
    const auto at = static_cast<int64_t>(i % static_cast<size_t>(n));
    switch (op) {
      case ReduceOp::sum: return static_cast<double>(int64_t{n} * (n + 1) / 2 + n * j);
      case ReduceOp::avg: return static_cast<double>(n - 1 + j);
      case ReduceOp::max: return static_cast<double>(j);
      case ReduceOp::min: return static_cast<double>(j - std::max<int64_t>(at, n - 1 - at));
    }
    return 0;
  }
};

// Moves: element i of what src sends to dst.
template <class T>
double move_value(int src, int dst, size_t i) {
  const int64_t p = std::min<int64_t>(exact_int<T>(), int64_t{1} << 20);
  return static_cast<double>((int64_t{src} * 37 + int64_t{dst} * 101 + static_cast<int64_t>(i % 1'000'003) * 3 + 1) % p);
}

template <class T, class F>
void fill(std::vector<T>& v, F&& f) {
  for (size_t i = 0; i < v.size(); ++i) v[i] = from_d<T>(f(i));
}
template <class T, class F>
size_t count_wrong(const std::vector<T>& v, F&& want, size_t offset = 0, size_t len = SIZE_MAX) {
  size_t wrong = 0;
  const size_t end = std::min(v.size(), offset + std::min(len, v.size()));
  for (size_t i = offset; i < end; ++i) wrong += to_d(v[i]) != want(i - offset);
  return wrong;
}

// ---- options and results ----
enum class Coll { all_reduce, reduce_scatter, all_gather, all_to_all, broadcast, sendrecv };
const std::map<std::string, Coll> kCollNames = {
    {"all_reduce", Coll::all_reduce}, {"reduce_scatter", Coll::reduce_scatter}, {"all_gather", Coll::all_gather},
    {"all_to_all", Coll::all_to_all}, {"broadcast", Coll::broadcast},           {"sendrecv", Coll::sendrecv}};
std::string coll_name(Coll c) {
  for (const auto& [k, v] : kCollNames)
    if (v == c) return k;
  return "?";
}
bool reduces(Coll c) { return c == Coll::all_reduce || c == Coll::reduce_scatter; }
// nccl-tests' bus bandwidth factors: what each rank's link carries relative to the buffer size.
double bus_factor(Coll c, int n) {
  switch (c) {
    case Coll::all_reduce: return 2.0 * (n - 1) / n;
    case Coll::reduce_scatter:
    case Coll::all_gather:
    case Coll::all_to_all: return static_cast<double>(n - 1) / n;
    case Coll::broadcast:
    case Coll::sendrecv: return 1.0;
  }
  return 1.0;
}

struct Options {
  uint64_t min_bytes = 8;
  uint64_t max_bytes = 32 << 20;
  double factor = 2.0;
  int iters = 10;
  int warmup = 5;
  int reps = 9;
  bool check = true;
  bool corrupt = false;  // testing aid: spoil one element of every triax result before the check
  int root = 0;
  std::string op = "sum";
  std::string dtype = "float32";
  std::vector<std::string> collectives = {"all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast",
                                          "sendrecv"};
  std::string json;
  std::string calibration;  // the planner's calibration format (docs/PLANNER.md)
  // Filled in main from every rank's host name: how the ranks sit on nodes.
  int nodes = 1, ranks_per_node = 1;
};

struct Row {
  std::string coll;
  size_t bytes = 0, count = 0;
  double time_us = 0, algbw = 0, busbw = 0;
  double raw_time_us = 0, raw_busbw = 0;
  double best_us = 0, raw_best_us = 0;  // fastest repetition of each side
  int calls_per_rep = 0;
  int64_t wrong = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// ---- one collective at one size ----
template <class T>
class Bench {
 public:
  Bench(Communicator& comm, MPI_Comm raw, const Options& o, ReduceOp op)
      : c_(comm), raw_(raw), o_(o), op_(op), n_(comm.size()), r_(comm.rank()) {}

  Row run(Coll coll, size_t bytes) {
    coll_ = coll;
    const size_t es = sizeof(T);
    // size is the full buffer (the larger side) as in nccl-tests; blocked collectives round it
    // down to a multiple of the group size.
    size_t total = bytes / es;
    if (coll == Coll::reduce_scatter || coll == Coll::all_gather || coll == Coll::all_to_all)
      total -= total % static_cast<size_t>(n_);
    Row row;
    row.coll = coll_name(coll);
    row.count = total;
    row.bytes = total * es;
    if (total == 0) return row;
    block_ = total / static_cast<size_t>(n_);
    size_t in_n = total, out_n = total;
    if (coll == Coll::reduce_scatter) out_n = block_;
    if (coll == Coll::all_gather) in_n = block_;
    if (coll == Coll::all_reduce || coll == Coll::broadcast || coll == Coll::sendrecv) out_n = 0;  // in place
    in_.assign(in_n, T{});
    out_.assign(out_n, T{});
    partner_ = (r_ ^ 1) < n_ ? (r_ ^ 1) : -1;  // sendrecv pairs (0,1) (2,3) ...; odd one out idles

    fill_timing_data();
    for (int i = 0; i < o_.warmup; ++i) {
      step_triax();
      step_raw();
    }
    // Interleaved repetitions, alternating which side goes first, so drift and cache state
    // affect both alike; the median of each side is reported. Large messages use fewer calls
    // per repetition (one from iters MiB on), so each repetition stays short and the median can
    // discard the ones another process preempted.
    calls_ = static_cast<int>(std::clamp<size_t>((size_t{1} << 20) * static_cast<size_t>(o_.iters) / row.bytes, 1,
                                                 static_cast<size_t>(o_.iters)));
    row.calls_per_rep = calls_;
    std::vector<double> t_triax, t_raw;
    for (int rep = 0; rep < o_.reps; ++rep) {
      if (rep % 2 == 0) {
        t_triax.push_back(timed(true));
        t_raw.push_back(timed(false));
      } else {
        t_raw.push_back(timed(false));
        t_triax.push_back(timed(true));
      }
    }
    const double scale = coll == Coll::sendrecv ? 0.5 : 1.0;  // one-way time of a ping-pong
    row.time_us = median(t_triax) * scale;
    row.raw_time_us = median(t_raw) * scale;
    row.best_us = *std::min_element(t_triax.begin(), t_triax.end()) * scale;
    row.raw_best_us = *std::min_element(t_raw.begin(), t_raw.end()) * scale;
    row.algbw = static_cast<double>(row.bytes) / (row.time_us * 1e-6) / 1e9;
    row.busbw = row.algbw * bus_factor(coll, n_);
    row.raw_busbw = static_cast<double>(row.bytes) / (row.raw_time_us * 1e-6) / 1e9 * bus_factor(coll, n_);
    if (o_.check) row.wrong = check(true) + check(false);
    int64_t all_wrong = row.wrong;
    mpi_check(MPI_Allreduce(MPI_IN_PLACE, &all_wrong, 1, MPI_INT64_T, MPI_SUM, raw_), "MPI_Allreduce(#wrong)");
    row.wrong = all_wrong;
    return row;
  }

 private:
  // Seconds per iteration of one side, the slowest rank's.
  double timed(bool triax) {
    mpi_check(MPI_Barrier(raw_), "MPI_Barrier");
    const auto t0 = clock_type::now();
    for (int i = 0; i < calls_; ++i) triax ? step_triax() : step_raw();
    double us = std::chrono::duration<double, std::micro>(clock_type::now() - t0).count() / calls_;
    mpi_check(MPI_Allreduce(MPI_IN_PLACE, &us, 1, MPI_DOUBLE, MPI_MAX, raw_), "MPI_Allreduce(time)");
    return us;
  }

  // Timing data: the check pattern, except that a repeated in-place sum would grow without
  // bound (to inf, or wrapping integers), so all_reduce sum times zeros. avg, max and min reach
  // their fixed point after one iteration.
  void fill_timing_data() {
    if (coll_ == Coll::all_reduce && op_ == ReduceOp::sum) {
      std::fill(in_.begin(), in_.end(), from_d<T>(0));
      return;
    }
    fill_check_data();
  }

  void fill_check_data() {
    const ReducePattern<T> p(op_, n_);
    switch (coll_) {
      case Coll::all_reduce: fill(in_, [&](size_t i) { return p.input(r_, i); }); break;
      case Coll::reduce_scatter: fill(in_, [&](size_t j) { return p.input(r_, j); }); break;
      case Coll::all_gather: fill(in_, [&](size_t i) { return move_value<T>(r_, 0, i); }); break;
      case Coll::all_to_all: fill(in_, [&](size_t j) { return move_value<T>(r_, static_cast<int>(j / block_), j % block_); }); break;
      case Coll::broadcast:
        fill(in_, [&](size_t i) { return r_ == o_.root ? move_value<T>(o_.root, 0, i) : move_value<T>(o_.root, 0, i + 1); });
        break;
      case Coll::sendrecv: fill(in_, [&](size_t i) { return move_value<T>(r_, partner_, i); }); break;
    }
    std::fill(out_.begin(), out_.end(), from_d<T>(1));
  }

  // Runs one fresh, checked call of one side; returns the wrong elements on this rank.
  int64_t check(bool triax) {
    const ReducePattern<T> p(op_, n_);
    fill_check_data();
    if (coll_ == Coll::sendrecv) return check_sendrecv(triax);
    triax ? step_triax() : step_raw();
    if (triax && o_.corrupt && r_ == 0) spoil(coll_ == Coll::all_reduce || coll_ == Coll::broadcast ? in_ : out_);
    switch (coll_) {
      case Coll::all_reduce: return count_wrong(in_, [&](size_t i) { return p.expect(i); });
      case Coll::reduce_scatter:
        return count_wrong(out_, [&](size_t i) { return p.expect(static_cast<size_t>(r_) * block_ + i); });
      case Coll::all_gather: return count_wrong(out_, [&](size_t j) { return move_value<T>(static_cast<int>(j / block_), 0, j % block_); });
      case Coll::all_to_all:
        return count_wrong(out_, [&](size_t j) { return move_value<T>(static_cast<int>(j / block_), r_, j % block_); });
      case Coll::broadcast: return count_wrong(in_, [&](size_t i) { return move_value<T>(o_.root, 0, i); });
      case Coll::sendrecv: break;
    }
    return 0;
  }

  // One ping-pong with fresh data: the even rank's message comes back as the odd rank's reply,
  // each checked on arrival.
  int64_t check_sendrecv(bool triax) {
    if (partner_ < 0) return 0;
    std::vector<T> got(in_.size());
    int64_t wrong = 0;
    auto send = [&] {
      if (triax) c_.send(std::span<const T>(in_), partner_, 1).wait();
      else mpi_check(MPI_Send(in_.data(), static_cast<int>(in_.size()), raw_type<T>(), partner_, 1, raw_), "MPI_Send");
    };
    auto recv = [&] {
      if (triax) c_.recv(std::span<T>(got), partner_, 1).wait();
      else mpi_check(MPI_Recv(got.data(), static_cast<int>(got.size()), raw_type<T>(), partner_, 1, raw_, MPI_STATUS_IGNORE), "MPI_Recv");
      if (triax && o_.corrupt && r_ == 0) spoil(got);
      wrong += static_cast<int64_t>(count_wrong(got, [&](size_t i) { return move_value<T>(partner_, r_, i); }));
    };
    if (r_ % 2 == 0) {
      send();
      recv();
    } else {
      recv();
      send();
    }
    return wrong;
  }

  // Changes element 0 to a value no check pattern produces there (the patterns' values are
  // small non-negative or small negative integers; this is out of their range or at least
  // different from the original).
  static void spoil(std::vector<T>& v) {
    if (v.empty()) return;
    v[0] = from_d<T>(to_d(v[0]) == 3.0 ? 5.0 : 3.0);
  }

  void step_triax() {
    switch (coll_) {
      case Coll::all_reduce: c_.all_reduce(std::span<T>(in_), op_).wait(); break;
      case Coll::reduce_scatter: c_.reduce_scatter(std::span<const T>(in_), std::span<T>(out_), op_).wait(); break;
      case Coll::all_gather: c_.all_gather(std::span<const T>(in_), std::span<T>(out_)).wait(); break;
      case Coll::all_to_all: c_.all_to_all(std::span<const T>(in_), std::span<T>(out_)).wait(); break;
      case Coll::broadcast: c_.broadcast(std::span<T>(in_), o_.root).wait(); break;
      case Coll::sendrecv:
        if (partner_ < 0) break;
        if (r_ % 2 == 0) {
          c_.send(std::span<const T>(in_), partner_, 0).wait();
          c_.recv(std::span<T>(in_), partner_, 0).wait();
        } else {
          c_.recv(std::span<T>(in_), partner_, 0).wait();
          c_.send(std::span<const T>(in_), partner_, 0).wait();
        }
        break;
    }
  }

  void step_raw() {
    const MPI_Datatype t = raw_type<T>();
    const int cin = static_cast<int>(in_.size()), cb = static_cast<int>(block_);
    switch (coll_) {
      case Coll::all_reduce:
        mpi_check(MPI_Allreduce(MPI_IN_PLACE, in_.data(), cin, t, raw_op<T>(op_), raw_), "MPI_Allreduce");
        if (op_ == ReduceOp::avg) raw_divide(in_.data(), in_.size(), n_);
        break;
      case Coll::reduce_scatter:
        mpi_check(MPI_Reduce_scatter_block(in_.data(), out_.data(), cb, t, raw_op<T>(op_), raw_), "MPI_Reduce_scatter_block");
        if (op_ == ReduceOp::avg) raw_divide(out_.data(), out_.size(), n_);
        break;
      case Coll::all_gather: mpi_check(MPI_Allgather(in_.data(), cb, t, out_.data(), cb, t, raw_), "MPI_Allgather"); break;
      case Coll::all_to_all: mpi_check(MPI_Alltoall(in_.data(), cb, t, out_.data(), cb, t, raw_), "MPI_Alltoall"); break;
      case Coll::broadcast: mpi_check(MPI_Bcast(in_.data(), cin, t, o_.root, raw_), "MPI_Bcast"); break;
      case Coll::sendrecv:
        if (partner_ < 0) break;
        if (r_ % 2 == 0) {
          mpi_check(MPI_Send(in_.data(), cin, t, partner_, 0, raw_), "MPI_Send");
          mpi_check(MPI_Recv(in_.data(), cin, t, partner_, 0, raw_, MPI_STATUS_IGNORE), "MPI_Recv");
        } else {
          mpi_check(MPI_Recv(in_.data(), cin, t, partner_, 0, raw_, MPI_STATUS_IGNORE), "MPI_Recv");
          mpi_check(MPI_Send(in_.data(), cin, t, partner_, 0, raw_), "MPI_Send");
        }
        break;
    }
  }

  Communicator& c_;
  MPI_Comm raw_;
  const Options& o_;
  ReduceOp op_;
  int n_, r_;
  Coll coll_ = Coll::all_reduce;
  size_t block_ = 0;
  int partner_ = -1;
  int calls_ = 1;  // timed calls per repetition
  std::vector<T> in_, out_;  // in_: the in-place buffer of all_reduce/broadcast/sendrecv
};

// The machine's 1/5/15-minute load averages (Linux), printed beside the table: on shared
// machines other processes' load is the main source of noise in these numbers.
std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  if (!(f >> a >> b >> c)) return "unknown";
  return a + " " + b + " " + c;
}

// Writes the rows the planner models (all_reduce, all_gather, reduce_scatter as rings, sendrecv
// as direct p2p) as a calibration file of (bytes, triax time) samples, each the fastest repetition
// (noise only ever adds time: a descheduled repetition of a small size must not make the fitted
// time fall with size on a loaded machine), then reads it back with
// the planner's own loader and prints the fitted alpha and bus bandwidth. A file the planner
// cannot fit (e.g. noise made time fall with size) is reported, not fatal: the table stands.
void write_calibration(const Options& o, int n, const std::vector<Row>& rows) {
  const bool inter = o.nodes > 1;
  nlohmann::json j;
  j["format"] = "triax-collective-calibration";
  j["version"] = 1;
  j["source"] = fmt::format("comm_bench, np {} on {} node(s), {} ranks per node, dtype {}, op {}", n, o.nodes,
                            o.ranks_per_node, o.dtype, o.op);
  auto& entries = j["entries"] = nlohmann::json::array();
  const std::pair<const char*, const char*> kinds[] = {{"all_reduce", "all_reduce"},
                                                       {"all_gather", "all_gather"},
                                                       {"reduce_scatter", "reduce_scatter"},
                                                       {"sendrecv", "p2p"}};
  for (const auto& [coll, op] : kinds) {
    nlohmann::json samples = nlohmann::json::array();
    for (const auto& r : rows)
      if (r.coll == coll) samples.push_back({static_cast<double>(r.bytes), r.best_us});
    if (samples.size() < 2) continue;
    nlohmann::json e = {{"op", op},
                        {"link", inter ? "inter" : "intra"},
                        {"algorithm", std::string(op) == "p2p" ? "direct" : "ring"},
                        {"ranks", std::string(op) == "p2p" ? 2 : n},
                        {"samples", samples}};
    if (inter) e["ranks_per_node"] = o.ranks_per_node;
    entries.push_back(e);
  }
  {
    std::ofstream f(o.calibration);
    if (!f) throw IoError(fmt::format("cannot write --calibration file '{}'", o.calibration));
    f << j.dump(2) << "\n";
  }
  try {
    const auto cal = plan::load_calibration(o.calibration);
    fmt::print("# calibration written to {} ({} entries); the planner fits:\n", o.calibration, cal.size());
    for (const auto& [coll, op] : kinds) {
      const auto pop = plan::parse_collective_op(op);
      const auto algo = std::string(op) == "p2p" ? plan::Algorithm::direct : plan::Algorithm::ring;
      if (auto k = cal.find(pop, inter ? plan::LinkClass::inter : plan::LinkClass::intra, algo))
        fmt::print("#   {:<15} alpha {:.2f} us/step, bus {:.3f} GB/s\n", op, k->alpha_us, k->bus_gbps);
    }
  } catch (const Error& e) {
    fmt::print("# calibration written to {}, but the planner cannot fit it: {}\n", o.calibration, e.what());
  }
}

template <class T>
int run(Communicator& world, const Options& o, ReduceOp op, const std::vector<Coll>& colls) {
  MPI_Comm raw = MPI_COMM_NULL;
  // Under mpirun with TRIAX_COMM=gloo the world is Gloo and the raw side is MPI's own world.
  mpi_check(MPI_Comm_dup(world.backend() == CommBackend::mpi ? mpi_handle(world) : MPI_COMM_WORLD, &raw), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(raw, MPI_ERRORS_RETURN);
  const int n = world.size(), me = world.rank();
  const bool lead = me == 0;
  const std::string tname(dtype_name(dtype_of<T>()));
  std::vector<size_t> sizes;
  for (double b = static_cast<double>(o.min_bytes); b <= static_cast<double>(o.max_bytes) * 1.000001; b *= o.factor) {
    sizes.push_back(static_cast<size_t>(std::llround(b)));
    if (o.factor <= 1.0) break;
  }
  if (lead) {
    fmt::print("# comm_bench: triax {} backend vs raw MPI on a dup of the same communicator\n",
               backend_name(world.backend()));
    fmt::print("# np {}  dtype {}  op {}  iters {}  warmup {}  reps {} (median, interleaved)  check {}\n", n, tname,
               o.op, o.iters, o.warmup, o.reps, o.check ? "on" : "off");
    fmt::print("# time: slowest rank, per call (sendrecv: one-way, half a ping-pong); {} calls per repetition up "
               "to 1 MiB, then fewer (1 from {} MiB on)\n", o.iters, o.iters);
    fmt::print("# load average at start: {}\n", load_average());
  }
  Bench<T> bench(world, raw, o, op);
  std::vector<Row> rows;
  int64_t wrong_total = 0;
  for (Coll c : colls) {
    if (reduces(c) && dtype_of<T>() == DType::u8) {
      if (lead) fmt::print("#\n# {}: skipped, uint8 does not reduce\n", coll_name(c));
      continue;
    }
    if (c == Coll::sendrecv && n < 2) {
      if (lead) fmt::print("#\n# sendrecv: skipped, needs two ranks\n");
      continue;
    }
    if (lead) {
      fmt::print("#\n# {}  (busbw = algbw x {:.3f})\n", coll_name(c), bus_factor(c, n));
      fmt::print("# {:>11} {:>11} {:>8} {:>5} {:>11} {:>8} {:>8} {:>6}   {:>11} {:>8} {:>6}\n", "size(B)", "count",
                 "type", "redop", "time(us)", "algbw", "busbw", "#wrong", "raw(us)", "busbw", "ratio");
      fmt::print("# {:>11} {:>11} {:>8} {:>5} {:>11} {:>8} {:>8} {:>6}   {:>11} {:>8} {:>6}\n", "", "(elements)", "",
                 "", "", "(GB/s)", "(GB/s)", "", "", "(GB/s)", "busbw");
    }
    for (size_t s : sizes) {
      Row row = bench.run(c, s);
      if (row.count == 0) continue;
      wrong_total += row.wrong;
      rows.push_back(row);
      if (lead)
        fmt::print("  {:>11} {:>11} {:>8} {:>5} {:>11.2f} {:>8.3f} {:>8.3f} {:>6}   {:>11.2f} {:>8.3f} {:>6.3f}\n",
                   row.bytes, row.count, tname, reduces(c) ? o.op : "none", row.time_us, row.algbw, row.busbw,
                   row.wrong, row.raw_time_us, row.raw_busbw, row.busbw / row.raw_busbw);
      std::fflush(stdout);
    }
  }
  if (lead) {
    // Summary of the target: triax within 5% of raw MPI for messages of 1 MiB and more.
    // Per collective over the rows >= 1 MiB: the lowest and the median ratio of the medians,
    // and the median ratio of the fastest repetitions (what each side does undisturbed).
    fmt::print("#\n# ratio triax/raw (busbw), rows >= 1 MiB: lowest / median of the rows; median of best-of-reps ratios\n");
    for (Coll c : colls) {
      std::vector<double> rs, best;
      for (const auto& r : rows)
        if (r.coll == coll_name(c) && r.bytes >= (size_t{1} << 20)) {
          rs.push_back(r.busbw / r.raw_busbw);
          best.push_back(r.raw_best_us / r.best_us);
        }
      if (!rs.empty())
        fmt::print("#   {:<15} {:.3f} / {:.3f}; best-of-reps {:.3f}\n", coll_name(c),
                   *std::min_element(rs.begin(), rs.end()), median(rs), median(best));
    }
    fmt::print("# load average at end: {}\n", load_average());
    fmt::print("# out of bounds values: {} {}\n", wrong_total, wrong_total ? "ERROR" : "OK");
    if (!o.json.empty()) {
      nlohmann::json j;
      j["benchmark"] = "comm_bench";
      j["backend"] = backend_name(world.backend());
      j["np"] = n;
      j["dtype"] = tname;
      j["op"] = o.op;
      j["iters"] = o.iters;
      j["warmup"] = o.warmup;
      j["reps"] = o.reps;
      j["check"] = o.check;
      j["bus_factor_note"] = "busbw = algbw * (all_reduce 2(n-1)/n; reduce_scatter, all_gather, all_to_all (n-1)/n; "
                             "broadcast, sendrecv 1)";
      auto& res = j["results"] = nlohmann::json::array();
      for (const auto& r : rows)
        res.push_back({{"collective", r.coll},
                       {"bytes", r.bytes},
                       {"count", r.count},
                       {"time_us", r.time_us},
                       {"algbw_gbps", r.algbw},
                       {"busbw_gbps", r.busbw},
                       {"raw_time_us", r.raw_time_us},
                       {"best_time_us", r.best_us},
                       {"raw_best_time_us", r.raw_best_us},
                       {"calls_per_rep", r.calls_per_rep},
                       {"raw_busbw_gbps", r.raw_busbw},
                       {"ratio_busbw", r.busbw / r.raw_busbw},
                       {"wrong", r.wrong}});
      std::ofstream f(o.json);
      if (!f) throw IoError(fmt::format("cannot write --json file '{}'", o.json));
      f << j.dump(2) << "\n";
    }
    if (!o.calibration.empty()) write_calibration(o, n, rows);
  }
  MPI_Comm_free(&raw);
  return wrong_total == 0 ? 0 : 1;
}

ReduceOp parse_op(const std::string& s) {
  if (s == "sum") return ReduceOp::sum;
  if (s == "avg") return ReduceOp::avg;
  if (s == "max") return ReduceOp::max;
  if (s == "min") return ReduceOp::min;
  throw ConfigError(fmt::format("--op '{}': expected sum, avg, max or min", s));
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"comm_bench: triax collectives vs raw MPI, nccl-tests style"};
  app.add_option("-b,--minbytes", o.min_bytes, "smallest message (bytes; K, M, G suffixes)")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("-e,--maxbytes", o.max_bytes, "largest message")->transform(CLI::AsSizeValue(false));
  app.add_option("-f,--stepfactor", o.factor, "size multiplier between rows")->check(CLI::Range(1.0, 1e6));
  app.add_option("-n,--iters", o.iters, "timed calls per repetition (up to 1 MiB; larger messages use fewer, one call from N MiB on)")->check(CLI::PositiveNumber);
  app.add_option("-w,--warmup_iters", o.warmup, "untimed calls per side before timing")->check(CLI::NonNegativeNumber);
  app.add_option("-r,--reps", o.reps, "interleaved repetitions per side; the median is reported")
      ->check(CLI::PositiveNumber);
  app.add_option("-c,--check", o.check, "check results against closed forms (0/1)");
  app.add_option("--root", o.root, "broadcast root")->check(CLI::NonNegativeNumber);
  app.add_option("-o,--op", o.op, "reduction: sum, avg, max, min")->check(CLI::IsMember({"sum", "avg", "max", "min"}));
  app.add_option("-d,--dtype", o.dtype, "float32 float64 int32 int64 bfloat16 float16 uint8")
      ->check(CLI::IsMember({"float32", "float64", "int32", "int64", "bfloat16", "float16", "uint8"}));
  app.add_option("--collectives", o.collectives, "comma-separated subset of " +
                                                     std::string("all_reduce,reduce_scatter,all_gather,all_to_all,"
                                                                 "broadcast,sendrecv"))
      ->delimiter(',')
      ->check(CLI::IsMember({"all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "sendrecv"}));
  app.add_option("--json", o.json, "write machine-readable results (rank 0) to this file");
  app.add_option("--calibration", o.calibration,
                 "write the planner's calibration file (docs/PLANNER.md) from the triax times (rank 0)");
  app.add_flag("--corrupt", o.corrupt,
               "testing aid: spoil one element of each triax result on rank 0 before checking (must exit 1)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  std::unique_ptr<Bootstrap> boot;
  int rc = 0;
  try {
    // Raw MPI is half of every row, so MPI it is, with or without mpirun (a singleton).
    BootstrapOptions bo;
    bo.force = true;
    bo.kind = LaunchKind::mpi;
    boot = Bootstrap::create(bo);
    auto world = boot->world();
    {
      // Where the ranks sit, for the calibration's link class (intra / inter node).
      const auto hosts = boot->all_gather(host_name());
      std::map<std::string, int> per_host;
      for (const auto& h : hosts) ++per_host[h];
      o.nodes = static_cast<int>(per_host.size());
      for (const auto& [h, c] : per_host) o.ranks_per_node = std::max(o.ranks_per_node, c);
    }
    if (o.min_bytes > o.max_bytes) throw ConfigError(fmt::format("-b {} is larger than -e {}", o.min_bytes, o.max_bytes));
    if (o.root >= world->size())
      throw ConfigError(fmt::format("--root {} is not a rank of the {}-rank world", o.root, world->size()));
    if (o.max_bytes > static_cast<uint64_t>(INT32_MAX))
      throw ConfigError(fmt::format("-e {} exceeds MPI's int count range", o.max_bytes));
    std::vector<Coll> colls;
    for (const auto& s : o.collectives) colls.push_back(kCollNames.at(s));
    const ReduceOp op = parse_op(o.op);
    if (o.dtype == "float32") rc = run<float>(*world, o, op, colls);
    else if (o.dtype == "float64") rc = run<double>(*world, o, op, colls);
    else if (o.dtype == "int32") rc = run<int32_t>(*world, o, op, colls);
    else if (o.dtype == "int64") rc = run<int64_t>(*world, o, op, colls);
    else if (o.dtype == "bfloat16") rc = run<bf16>(*world, o, op, colls);
    else if (o.dtype == "float16") rc = run<f16>(*world, o, op, colls);
    else rc = run<unsigned char>(*world, o, op, colls);
    world.reset();
    boot.reset();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm_bench: %s\n", e.what());
    // One rank failing leaves the others in a collective: end the whole job (a program's main
    // may; the library never does).
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (inited && !finalized) MPI_Abort(MPI_COMM_WORLD, 2);
    return 2;
  }
  return rc;
}

#else  // no MPI

int main() {
  std::fprintf(stderr, "comm_bench compares triax with raw MPI and needs MPI; this build has -DTRIAX_WITH_MPI=OFF\n");
  return 1;
}

#endif
