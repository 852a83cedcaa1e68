// step_bench: forward + backward of GPT-2-shaped models on the CPU (fp32), measured against
// OpenBLAS sgemm on exactly the step's own GEMM calls, in the same run.
//
// Two cases, each at every thread count of --threads (OpenMP and OpenBLAS set together):
//   block  one GPT-2 layer as a GptChunk without embedding or head (input and output gradient given)
//   model  a small full GPT (token + position embedding, L layers, final LayerNorm, tied LM head with
//          the padded vocabulary, vocab-parallel cross-entropy) on a single-rank TP group
// Per case and thread count, interleaved rep by rep (the machine is shared; medians are reported):
//   step     forward + backward wall time, no observer installed (the plain library path)
//   in-step  the same step with a gemm observer (ops/gemm.h) timing each BLAS call: the step's time
//            inside GEMM. Calls made inside an OpenMP region (attention's per-head GEMMs) count their
//            thread-seconds divided by the team size, i.e. their share of the region's wall time.
//   sgemm    the recorded GEMM calls (same shapes, transposes, leading dimensions and beta) replayed
//            with cblas_sgemm on scratch buffers; calls that ran inside an OpenMP region are replayed
//            in one too, as attention issues them. FLOPs / replay time = the sgemm rate.
// FLOPs: every GEMM 2*M*N*K as executed. Attention issues one GEMM per 64-row query block against
// every key up to the block's end, so the masked upper triangles of the diagonal blocks count
// (at T = 1024: 6% more than the causal half); nothing outside GEMMs counts. The recorded FLOPs
// and call count are checked against the closed form before anything is timed.
// Correctness beside the timing (exit 1 on failure): the loss (model) and every gradient are
// finite, every parameter gets a nonzero gradient, the model's initial loss is near ln(vocab), and
// a second step and a step with the observer installed give bit-identical losses and gradients.
//   step_bench [--batch 4 --seq 1024] [--model-batch 4 --model-seq 256 --model-layers 2]
//              [--threads 1,2] [--reps 5] [--cases block,model] [--json FILE]
#include <CLI/CLI.hpp>
#include <cblas.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "triax/distributed/comm/self_comm.h"
#include "triax/model/gpt.h"
#include "triax/ops/attention.h"
#include "triax/ops/gemm.h"

using namespace triax;

namespace {

constexpr double kTargetGemmFraction = 0.75;
constexpr double kTargetSgemmRatio = 0.60;

double wall_now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
double cpu_now() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}
std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  if (!(f >> a >> b >> c)) return "n/a";
  return a + " " + b + " " + c;
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
void set_threads(int n) {
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}
double flops_of(const ops::GemmCall& c) { return 2.0 * c.M * c.N * c.K; }

// Records every GEMM of a step (thread-safe: attention calls gemm from an OpenMP region).
class Recorder final : public ops::GemmObserver {
 public:
  void on_gemm(const ops::GemmCall& c) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back(c);
  }
  std::vector<ops::GemmCall> take() { return std::move(calls_); }

 private:
  std::mutex mu_;
  std::vector<ops::GemmCall> calls_;
};

// Installs a recorder for one scope.
struct Observe {
  explicit Observe(Recorder& r) { ops::set_gemm_observer(&r); }
  ~Observe() { ops::set_gemm_observer(nullptr); }
};

// In-step GEMM wall time: a call inside an OpenMP team of P threads ran beside P - 1 others.
double in_step_gemm_seconds(const std::vector<ops::GemmCall>& calls) {
  double s = 0;
  for (const auto& c : calls) s += c.seconds / c.team_size;
  return s;
}

// Replays a recorded GEMM list with cblas_sgemm on scratch buffers of the right extents, timing
// each call (clock reads cost ~0.1% of attention's smallest GEMM) to split the time by kind.
class Replayer {
 public:
  Replayer(const std::vector<ops::GemmCall>& calls, std::vector<int> kinds) : calls_(calls), kinds_(std::move(kinds)) {
    size_t a = 0, b = 0, c = 0, na = 0, nb = 0, nc = 0;
    int team = 1;
    for (const auto& k : calls_) {
      const size_t ea = size_t(k.ta == ops::Trans::no ? k.M : k.K) * k.lda;
      const size_t eb = size_t(k.tb == ops::Trans::no ? k.K : k.N) * k.ldb;
      const size_t ec = size_t(k.M) * k.ldc;
      if (k.team_size > 1) {
        na = std::max(na, ea), nb = std::max(nb, eb), nc = std::max(nc, ec);
        team = std::max(team, k.team_size);
      } else {
        a = std::max(a, ea), b = std::max(b, eb), c = std::max(c, ec);
      }
    }
    // Values in [-0.5, 0.5) from a multiplicative hash: any normal numbers do (no denormals),
    // and hundreds of MB fill in a blink.
    auto fill = [](std::vector<float>& v, size_t n) {
      v.resize(n);
      for (size_t i = 0; i < n; ++i) v[i] = float((uint32_t(i) * 2654435761u) >> 16) / 65536.0f - 0.5f;
    };
    fill(a_, a), fill(b_, b), fill(c_, c);
    nested_.resize(team);
    for (auto& t : nested_) fill(t.a, na), fill(t.b, nb), fill(t.c, nc);
  }

  // Returns the seconds spent in each kind (as in-step time: nested calls count 1/team).
  std::array<double, 3> run() {
    std::array<double, 3> by_kind{};
    size_t i = 0;
    while (i < calls_.size()) {
      if (calls_[i].team_size == 1) {
        const double t0 = wall_now();
        one(calls_[i], a_.data(), b_.data(), c_.data());
        by_kind[kinds_[i++]] += wall_now() - t0;
        continue;
      }
      // A run of calls that the library made from one OpenMP region: replay them from one too.
      size_t j = i;
      while (j < calls_.size() && calls_[j].team_size > 1) ++j;
      const int team = calls_[i].team_size;
      const int64_t lo = int64_t(i), hi = int64_t(j);
      for (auto& s : nested_) s.seconds = {};
#pragma omp parallel for schedule(dynamic) num_threads(team)
      for (int64_t k = lo; k < hi; ++k) {
        auto& s = nested_[omp_get_thread_num()];
        const double t0 = wall_now();
        one(calls_[k], s.a.data(), s.b.data(), s.c.data());
        s.seconds[kinds_[k]] += (wall_now() - t0) / team;
      }
      for (const auto& s : nested_)
        for (int k = 0; k < 3; ++k) by_kind[k] += s.seconds[k];
      i = j;
    }
    return by_kind;
  }

 private:
  static void one(const ops::GemmCall& k, const float* a, const float* b, float* c) {
    cblas_sgemm(CblasRowMajor, k.ta == ops::Trans::no ? CblasNoTrans : CblasTrans,
                k.tb == ops::Trans::no ? CblasNoTrans : CblasTrans, k.M, k.N, k.K, 1.0f, a, k.lda, b, k.ldb,
                k.accumulate ? 1.0f : 0.0f, c, k.ldc);
  }
  struct Scratch {
    std::vector<float> a, b, c;
    std::array<double, 3> seconds;
  };
  std::vector<ops::GemmCall> calls_;
  std::vector<int> kinds_;
  std::vector<float> a_, b_, c_;
  std::vector<Scratch> nested_;
};

// The closed-form GEMM list of one step (Recompute::none): calls and FLOPs by kind.
struct GemmCount {
  double linear = 0, attention = 0, head = 0;
  int64_t calls = 0;
  double total() const { return linear + attention + head; }
};
GemmCount expected_gemms(const GptConfig& cfg, int layers, bool head, int B, int T) {
  const double N = double(B) * T, C = cfg.n_embd, F = cfg.ffn_size(), NH = cfg.n_head, hs = cfg.head_dim();
  GemmCount g;
  // qkv (N, 3C, C), proj (N, C, C), fc (N, F, C), fc proj (N, C, F): forward, dinp and dweight each.
  g.linear = layers * 3 * 2 * N * (3 * C * C + C * C + F * C + C * F);
  const int nqb = (T + ops::kAttentionBlock - 1) / ops::kAttentionBlock;
  double blocks = 0;  // sum over query blocks of rows x keys seen
  for (int qb = 0; qb < nqb; ++qb) {
    const int i0 = qb * ops::kAttentionBlock, i1 = std::min(T, i0 + ops::kAttentionBlock);
    blocks += double(i1 - i0) * i1;
  }
  // forward: S = QK^T, O = PV; backward: P, dP, dQ, dK, dV. Each 2 * rows * keys * hs.
  g.attention = layers * 7 * 2 * hs * B * NH * blocks;
  g.calls = int64_t(layers) * (12 + 7 * int64_t(B) * int64_t(NH) * nqb);
  if (head) {
    g.head = 3 * 2 * N * double(cfg.padded_vocab()) * C;  // logits, dlnf, dwte
    g.calls += 3;
  }
  return g;
}

// A chunk on a single-rank TP group, with its inputs.
struct Case {
  std::string name, description;
  GptConfig cfg;
  int B, T, layers;
  bool full;  // embedding + head
  std::unique_ptr<Communicator> tp;
  ParamStore store;
  std::unique_ptr<GptChunk> chunk;
  std::vector<int32_t> tokens, targets;
  std::vector<float> x_in, x_out, dx_out, dx_in;  // host copies (x_in, dx_out: the inputs)
  Tensor tx_in, tx_out, tdx_out, tdx_in;          // the chunk's backend buffers

  Case(std::string n, GptConfig c, int b, int t, int l, bool f)
      : name(std::move(n)), cfg(c), B(b), T(t), layers(l), full(f) {
    tp = make_self_communicator("tp");
    chunk = std::make_unique<GptChunk>(cfg, ChunkSpec{0, layers, full, full}, *tp, store, Recompute::none);
    store.finalize();
    chunk->init_params(1234);
    const size_t N = size_t(B) * T, NC = N * cfg.n_embd;
    std::mt19937 g(99);
    if (full) {
      std::uniform_int_distribution<int32_t> tok(0, cfg.vocab - 1);
      tokens.resize(N), targets.resize(N);
      for (auto& x : tokens) x = tok(g);
      for (auto& x : targets) x = tok(g);
    } else {
      std::uniform_real_distribution<float> u(-1.0f, 1.0f);
      x_in.resize(NC), x_out.resize(NC), dx_out.resize(NC), dx_in.resize(NC);
      for (auto& x : x_in) x = u(g);
      for (auto& x : dx_out) x = 1e-3f * u(g);
      Backend& be = store.backend();
      auto buf = [&](const std::vector<float>& v) {
        Tensor t = be.empty(Shape{static_cast<int64_t>(v.size())}, DType::f32);
        from_host_f32(be, t, v);
        return t;
      };
      tx_in = buf(x_in), tx_out = buf(x_out), tdx_out = buf(dx_out), tdx_in = buf(dx_in);
    }
  }

  // One forward + backward; returns the loss (0 for the block).
  float step() {
    if (full) {
      const float loss = static_cast<float>(chunk->forward(0, B, T, tokens, targets, Tensor(), Tensor(), true));
      chunk->backward(0, Tensor(), Tensor());
      return loss;
    }
    chunk->forward(0, B, T, {}, {}, tx_in, tx_out, true);
    chunk->backward(0, tdx_out, tdx_in);
    return 0.0f;
  }
};

struct Snapshot {
  float loss;
  std::vector<float> grads, dx_in;
};
Snapshot checked_step(Case& c) {
  c.store.zero_grads();
  Snapshot s;
  s.loss = c.step();
  auto g = c.store.flat_grads();
  s.grads.assign(g.begin(), g.end());
  if (!c.full) {
    s.dx_in = to_host_f32(c.store.backend(), c.tdx_in);
    c.x_out = to_host_f32(c.store.backend(), c.tx_out);
  }
  return s;
}
bool same_bits(const Snapshot& a, const Snapshot& b) {
  auto eq = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
  };
  return std::memcmp(&a.loss, &b.loss, sizeof(float)) == 0 && eq(a.grads, b.grads) && eq(a.dx_in, b.dx_in);
}

// Correctness of one step's results; returns the failures (empty when fine).
std::vector<std::string> check_results(Case& c, const Snapshot& s) {
  std::vector<std::string> bad;
  if (c.full) {
    const double want = std::log(double(c.cfg.vocab));
    if (!std::isfinite(s.loss) || std::abs(s.loss - want) > 1.0)
      bad.push_back(fmt::format("initial loss {} is not within 1 of ln(vocab) = {:.4f}", s.loss, want));
  } else {
    bool finite = true, nonzero = false;
    for (float v : s.dx_in) finite &= std::isfinite(v), nonzero |= v != 0.0f;
    if (!finite || !nonzero) bad.push_back(fmt::format("input gradient {}", finite ? "is all zero" : "has non-finite values"));
    for (float v : c.x_out)
      if (!std::isfinite(v)) {
        bad.push_back("block output has non-finite values");
        break;
      }
  }
  for (size_t i = 0; i < c.store.size(); ++i) {
    const auto& info = c.store.info(i);
    bool finite = true, nonzero = false;
    for (size_t k = info.offset; k < info.offset + info.numel; ++k) finite &= std::isfinite(s.grads[k]), nonzero |= s.grads[k] != 0.0f;
    if (!finite) bad.push_back(fmt::format("gradient of {} has non-finite values", info.spec.name));
    if (!nonzero) bad.push_back(fmt::format("gradient of {} is all zero", info.spec.name));
  }
  return bad;
}

struct Result {
  int threads;
  double step, step_cpu, observed, gemm_in_step, sgemm, sgemm_cpu;  // medians, seconds
  double best_step;                                                   // fastest rep, seconds
  double non_gemm;                    // median of (observed step - its in-step GEMM time), seconds
  // Medians of the per-rep ratios: each rep's step, observed step and replay ran back to back,
  // so a change of load between reps cancels out of its ratios.
  double gemm_fraction, sgemm_ratio, cpu_ratio;
  double gemm_linear, gemm_attention, gemm_head;                      // in-step, by kind
  double sgemm_linear, sgemm_attention, sgemm_head;                   // GFLOP/s of the replay by kind
  std::string load_before, load_after;
};

enum class Kind { linear, attention, head };
Kind kind_of(const Case& c, const ops::GemmCall& k) {
  const int vp = c.cfg.padded_vocab();
  if (c.full && (k.M == vp || k.N == vp || k.K == vp)) return Kind::head;
  // Every linear GEMM has the token count N as one dimension and two of C, 3C and ffn as the others;
  // attention's are (<= 64 query rows) x (<= T keys) x head_dim.
  const int N = c.B * c.T, C = c.cfg.n_embd, F = c.cfg.ffn_size();
  auto feature = [&](int d) { return d == C || d == 3 * C || d == F; };
  if ((k.M == N && feature(k.N) && feature(k.K)) || (k.N == N && feature(k.M) && feature(k.K)) ||
      (k.K == N && feature(k.M) && feature(k.N)))
    return Kind::linear;
  return Kind::attention;
}

Result measure(Case& c, const std::vector<ops::GemmCall>& calls, int threads, int reps) {
  Result r{};
  r.threads = threads;
  r.load_before = load_average();
  std::vector<int> kinds;
  double kind_flops[3] = {0, 0, 0};
  for (const auto& k : calls) {
    kinds.push_back(int(kind_of(c, k)));
    kind_flops[kinds.back()] += flops_of(k);
  }
  Replayer replay(calls, kinds);
  replay.run();  // warm-up (the step itself was warmed by the checks)
  std::vector<double> step, step_cpu, observed, in_step, sgemm, sgemm_cpu;
  std::vector<double> in_kind[3];
  std::vector<double> replay_kind_t[3];
  Recorder rec;
  for (int rep = 0; rep < reps; ++rep) {
    double w0 = wall_now(), c0 = cpu_now();
    c.step();
    step.push_back(wall_now() - w0), step_cpu.push_back(cpu_now() - c0);
    {
      Observe on(rec);
      w0 = wall_now();
      c.step();
      observed.push_back(wall_now() - w0);
    }
    const auto got = rec.take();
    in_step.push_back(in_step_gemm_seconds(got));
    double kind_s[3] = {0, 0, 0};
    for (const auto& k : got) kind_s[int(kind_of(c, k))] += k.seconds / k.team_size;
    for (int k = 0; k < 3; ++k) in_kind[k].push_back(kind_s[k]);
    w0 = wall_now(), c0 = cpu_now();
    const auto replay_s = replay.run();
    sgemm.push_back(wall_now() - w0), sgemm_cpu.push_back(cpu_now() - c0);
    for (int k = 0; k < 3; ++k) replay_kind_t[k].push_back(replay_s[k]);
  }
  r.step = median(step), r.step_cpu = median(step_cpu), r.observed = median(observed);
  r.best_step = *std::min_element(step.begin(), step.end());
  std::vector<double> frac, ratio, cpu_ratio, non_gemm;
  for (int i = 0; i < reps; ++i) {
    non_gemm.push_back(observed[i] - in_step[i]);
    frac.push_back(in_step[i] / observed[i]);
    ratio.push_back(sgemm[i] / step[i]);
    cpu_ratio.push_back(sgemm_cpu[i] / step_cpu[i]);
  }
  r.non_gemm = median(non_gemm);
  r.gemm_fraction = median(frac), r.sgemm_ratio = median(ratio), r.cpu_ratio = median(cpu_ratio);
  r.gemm_in_step = median(in_step), r.sgemm = median(sgemm), r.sgemm_cpu = median(sgemm_cpu);
  r.gemm_linear = median(in_kind[0]), r.gemm_attention = median(in_kind[1]), r.gemm_head = median(in_kind[2]);
  auto rate = [&](int k) { return kind_flops[k] == 0 ? 0.0 : kind_flops[k] / median(replay_kind_t[k]) / 1e9; };
  r.sgemm_linear = rate(0), r.sgemm_attention = rate(1), r.sgemm_head = rate(2);
  r.load_after = load_average();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GPT-2 forward + backward on the CPU against OpenBLAS sgemm on the same GEMM calls"};
  int B = 4, T = 1024, mB = 4, mT = 256, mL = 2, reps = 5;
  std::string block_preset = "gpt2-124m", model_preset = "gpt2-124m", json_path;
  std::vector<int> thread_counts{1, 2};
  std::vector<std::string> cases{"block", "model"};
  app.add_option("--batch", B, "block case: sequences per step");
  app.add_option("--seq", T, "block case: tokens per sequence");
  app.add_option("--block-preset", block_preset, "block case: model shape");
  app.add_option("--model-batch", mB, "model case: sequences per step");
  app.add_option("--model-seq", mT, "model case: tokens per sequence");
  app.add_option("--model-layers", mL, "model case: layers (embedding and head included)");
  app.add_option("--model-preset", model_preset, "model case: model shape (vocab, C, heads)");
  app.add_option("--threads", thread_counts, "thread counts to measure (OpenMP and OpenBLAS)")->delimiter(',');
  app.add_option("--reps", reps, "timed repetitions (medians reported)")->check(CLI::PositiveNumber);
  app.add_option("--cases", cases, "block, model")->delimiter(',');
  app.add_option("--json", json_path, "also write the results to this JSON file");
  CLI11_PARSE(app, argc, argv);

  nlohmann::json out = nlohmann::json::object();
  bool ok = true;
  try {
    fmt::print("step_bench: fp32 forward + backward on the CPU; OpenBLAS {} ({}), {} cores; load average {}\n",
               openblas_get_config(), openblas_get_parallel() == 2 ? "OpenMP" : openblas_get_parallel() == 1 ? "pthreads" : "sequential",
               omp_get_num_procs(), load_average());
    fmt::print("targets: >= {:.0f}% of step time inside GEMM, >= {:.0f}% of the sgemm rate overall\n",
               100 * kTargetGemmFraction, 100 * kTargetSgemmRatio);
    fmt::print("compares with: sgemm replaying this step's own GEMM calls (the same shapes, per-block attention "
               "calls included), not one big call per shape, and forward + backward only (no optimizer); for the "
               "whole step against PyTorch and the one-call ceiling see benchmarks/torch_compare.py\n");
    out["openblas"] = openblas_get_config();
    out["cases"] = nlohmann::json::array();
    for (const auto& name : cases) {
      std::unique_ptr<Case> c;
      if (name == "block") {
        GptConfig cfg = GptConfig::preset(block_preset);
        cfg.n_layer = 1;
        c = std::make_unique<Case>(name, cfg, B, T, 1, false);
        c->description = fmt::format("{} block: 1 layer, C={} heads={} ffn={}, B={} T={}, no embedding/head",
                                     block_preset, cfg.n_embd, cfg.n_head, cfg.ffn_size(), B, T);
      } else if (name == "model") {
        GptConfig cfg = GptConfig::preset(model_preset);
        cfg.n_layer = mL;
        c = std::make_unique<Case>(name, cfg, mB, mT, mL, true);
        c->description = fmt::format(
            "{} with {} layers: embedding + layers + ln_f + tied head, vocab {} padded to {}, C={} heads={}, B={} T={} "
            "({:.1f}M params)",
            model_preset, mL, cfg.vocab, cfg.padded_vocab(), cfg.n_embd, cfg.n_head, mB, mT, cfg.num_params() / 1e6);
      } else {
        fmt::print(stderr, "step_bench: unknown case '{}' (block, model)\n", name);
        return 2;
      }
      const GemmCount want = expected_gemms(c->cfg, c->layers, c->full, c->B, c->T);
      const double tokens = double(c->B) * c->T;
      fmt::print("\n== {} ==\n{}\n", name, c->description);
      fmt::print("GEMM FLOPs per step: {:.2f} GFLOP = linears {:.2f} + attention {:.2f} (as executed) + head {:.2f}; "
                 "{} GEMM calls\n",
                 want.total() / 1e9, want.linear / 1e9, want.attention / 1e9, want.head / 1e9, want.calls);
      nlohmann::json jc = {{"case", name}, {"description", c->description}, {"tokens", tokens},
                           {"gflop", want.total() / 1e9}, {"gemm_calls", want.calls}, {"runs", nlohmann::json::array()}};
      std::vector<Result> results;
      for (int th : thread_counts) {
        if (th < 1) {
          fmt::print(stderr, "step_bench: thread count {} must be positive\n", th);
          return 2;
        }
        set_threads(th);
        // ---- correctness beside the timing ----
        const Snapshot a = checked_step(*c), b = checked_step(*c);
        Recorder rec;
        Snapshot o;
        {
          Observe on(rec);
          o = checked_step(*c);
        }
        const auto calls = rec.take();
        auto bad = check_results(*c, a);
        if (!same_bits(a, b)) bad.push_back("a second step gave different bits (loss, gradients or input gradient)");
        if (!same_bits(a, o)) bad.push_back("the step with the gemm observer installed gave different bits");
        double got_flops = 0;
        for (const auto& k : calls) got_flops += flops_of(k);
        if (int64_t(calls.size()) != want.calls || got_flops != want.total())
          bad.push_back(fmt::format("recorded {} GEMM calls / {:.6g} FLOPs, the closed form says {} / {:.6g}",
                                    calls.size(), got_flops, want.calls, want.total()));
        for (const auto& k : calls)
          if (k.is_double) {
            bad.push_back("a double-precision GEMM ran in the fp32 step");
            break;
          }
        if (!bad.empty()) {
          for (const auto& m : bad) fmt::print(stderr, "step_bench: {} ({} threads): FAILED: {}\n", name, th, m);
          ok = false;
          continue;
        }
        fmt::print("[{} threads] checks passed: loss {:.6f}, gradients finite and nonzero in all {} parameters, "
                   "bit-identical on repeat and under the observer; {} GEMM calls match the closed form\n",
                   th, a.loss, c->store.size(), calls.size());
        results.push_back(measure(*c, calls, th, reps));
      }
      if (results.empty()) continue;
      const double F = want.total();
      fmt::print("\n{:>7} | {:>9} | {:>8} | {:>8} | {:>8} | {:>11} | {:>9} | {:>8} | {:>9} | {:>10} | {:>8} | {}\n",
                 "threads", "step ms", "best ms", "tokens/s", "GFLOP/s", "in-GEMM ms", "GEMM frac", "sgemm ms", "sgemm GF/s", "GF/s÷sgemm",
                 "cpu ratio", "load avg (before -> after)");
      for (const auto& r : results) {
        const double frac = r.gemm_fraction, ratio = r.sgemm_ratio;
        fmt::print("{:>7} | {:>9.1f} | {:>8.1f} | {:>8.0f} | {:>8.1f} | {:>11.1f} | {:>8.1f}% | {:>8.1f} | {:>10.1f} | "
                   "{:>9.1f}% | {:>7.1f}% | {} -> {}\n",
                   r.threads, 1e3 * r.step, 1e3 * r.best_step, tokens / r.step, F / r.step / 1e9, 1e3 * r.gemm_in_step, 100 * frac,
                   1e3 * r.sgemm, F / r.sgemm / 1e9, 100 * ratio, 100 * r.cpu_ratio, r.load_before,
                   r.load_after);
      }
      fmt::print("\nin-step GEMM ms by kind (sgemm replay GFLOP/s of that kind), observed step ms, non-GEMM ms:\n");
      for (const auto& r : results) {
        fmt::print("{:>7} | linears {:.1f} ({:.1f}) | attention {:.1f} ({:.1f}) | head {:.1f} ({:.1f}) | observed {:.1f} | "
                   "non-GEMM {:.1f}\n",
                   r.threads, 1e3 * r.gemm_linear, r.sgemm_linear, 1e3 * r.gemm_attention, r.sgemm_attention,
                   1e3 * r.gemm_head, r.sgemm_head, 1e3 * r.observed, 1e3 * r.non_gemm);
        const double frac = r.gemm_fraction, ratio = r.sgemm_ratio;
        fmt::print("        targets: GEMM fraction {:.1f}% {} {:.0f}%: {}; overall/sgemm {:.1f}% {} {:.0f}%: {}\n",
                   100 * frac, frac >= kTargetGemmFraction ? ">=" : "<", 100 * kTargetGemmFraction,
                   frac >= kTargetGemmFraction ? "met" : "MISSED", 100 * ratio, ratio >= kTargetSgemmRatio ? ">=" : "<",
                   100 * kTargetSgemmRatio, ratio >= kTargetSgemmRatio ? "met" : "MISSED");
        jc["runs"].push_back({{"threads", r.threads},
                              {"step_ms", 1e3 * r.step},
                              {"step_cpu_ms", 1e3 * r.step_cpu},
                              {"best_step_ms", 1e3 * r.best_step},
                              {"cpu_ratio_to_sgemm", r.cpu_ratio},
                              {"tokens_per_s", tokens / r.step},
                              {"gflops", F / r.step / 1e9},
                              {"gemm_in_step_ms", 1e3 * r.gemm_in_step},
                              {"gemm_fraction", frac},
                              {"sgemm_ms", 1e3 * r.sgemm},
                              {"sgemm_gflops", F / r.sgemm / 1e9},
                              {"ratio_to_sgemm", ratio},
                              {"observed_step_ms", 1e3 * r.observed},
                              {"non_gemm_ms", 1e3 * r.non_gemm},
                              {"load_before", r.load_before},
                              {"load_after", r.load_after}});
      }
      out["cases"].push_back(jc);
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "step_bench: {}\n", e.what());
    return 1;
  }
  fmt::print("\nload average at the end: {}\n", load_average());
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << out.dump(2) << "\n";
    if (!f) {
      fmt::print(stderr, "step_bench: cannot write {}\n", json_path);
      return 1;
    }
  }
  if (!ok) {
    fmt::print(stderr, "step_bench: correctness checks FAILED\n");
    return 1;
  }
  return 0;
}
