// torch_compare_triax: the triax side of benchmarks/torch_compare.py, a long-lived worker that the
// driver alternates with a PyTorch worker of the same model: GPT-2's block (default), or with
// --block llama the Llama block of the "llama-tiny" preset (RMSNorm, SwiGLU, RoPE, grouped-query
// attention over --kv-heads, no biases, untied head) at the given shape. One full training step is either
//   one process (default): GptChunk forward + backward (embedding, L layers, final norm, LM head,
//     cross-entropy) and Optimizer::step (global norm, clip, fused AdamW), or
//   --dp N / --pp N under mpirun: the library's Trainer (pipeline schedule, DP gradient buckets
//     overlapped with backward, clip by the global norm, AdamW) on an llm.c shard (--shard) of the
//     same tokens in file order; rank 0 reads the commands and answers, the other ranks wait for
//     them without spinning (so they take no core from the PyTorch side between rounds).
//
// Commands, one per line on stdin; each answer is one JSON line on stdout:
//   hello                 the model: parameters (name, shape, weight decay), padded vocabulary, FLOPs,
//                         the block's choices (norm, eps, MLP, positions, RoPE base, kv heads, ffn)
//   export PATH           the current parameters as safetensors (triax's names; metadata "decay":
//                         the names with weight decay, comma-separated); one process only
//   steps K               K training steps on the next K batches: global losses, grad norms,
//                         seconds each (with ranks: the slowest rank's step time)
//   sgemm R [ROWS]        the sgemm ceiling: each distinct GEMM shape of the step (linears and LM
//                         head, forward NT, input gradient NN, weight gradient TN) as one
//                         cblas_sgemm call, best of R, weighted by how often the step issues it;
//                         ROWS sequences per GEMM (default: a micro-batch). With ranks: every
//                         rank at once, each on its own threads; the sum of the ranks' rates
//   quit
// Batches: step s (0-based, counted over the worker's life) takes sequences s*B .. s*B+B-1 of the
// --data file (int32 tokens, sequence i = tokens [i*T, i*T+T], targets shifted by one), wrapping;
// with ranks, DP rank d takes the d-th B/dp of them (the Trainer's split by global sample index).
#include <CLI/CLI.hpp>
#include <cblas.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "triax/core/cpu_isa.h"
#include "triax/distributed/comm/self_comm.h"
#include "triax/io/safetensors.h"
#include "triax/model/gpt.h"
#include "triax/optim/optimizer.h"
#include "triax/train/trainer.h"

#if defined(TRIAX_HAVE_MPI)
#include <mpi.h>

#include "triax/distributed/bootstrap/bootstrap.h"
#endif

using namespace triax;

namespace {

double wall_now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void reply(const nlohmann::json& j) {
  std::fputs((j.dump() + "\n").c_str(), stdout);
  std::fflush(stdout);
}

struct Gemm {
  std::string what;
  int M, N, K;
  bool ta, tb;
  int count;  // how many times one step issues it
  double flops() const { return 2.0 * M * N * K; }
};

// The step's linear and head GEMMs (row-major, C = op(A) op(B)); attention's small per-head
// GEMMs are not in the ceiling (the same rate is applied to their FLOPs).
std::vector<Gemm> step_gemms(const GptConfig& cfg, int B, int T) {
  const int N = B * T, C = cfg.n_embd, F = cfg.ffn_size(), Vp = cfg.padded_vocab();
  const int F1 = cfg.swiglu ? 2 * F : F;  // SwiGLU: gate and up as one GEMM over the fused view
  std::vector<Gemm> g;
  auto linear = [&](const std::string& w, int OC, int IC, int count) {
    g.push_back({w + " fwd", N, OC, IC, false, true, count});     // out = inp W^T
    g.push_back({w + " dinp", N, IC, OC, false, false, count});   // dinp = dout W
    g.push_back({w + " dW", OC, IC, N, true, false, count});      // dW = dout^T inp
  };
  linear("qkv", cfg.qkv_width(), C, cfg.n_layer);
  linear("attn.proj", C, C, cfg.n_layer);
  linear(cfg.swiglu ? "gate_up" : "fc", F1, C, cfg.n_layer);
  linear(cfg.swiglu ? "down" : "fc.proj", C, F, cfg.n_layer);
  linear("lm_head", Vp, C, 1);
  return g;
}

// Model FLOPs of one step, the same count for both sides: linears and LM head (real vocabulary)
// 6 N p, causal attention (the half of QK^T and PV below the diagonal) forward + backward. The
// linears of a layer: QKV C x qkv_width (3C without grouped-query attention), projection C x C, MLP
// 2 C F (3 C F with SwiGLU). Elementwise work (norms, activations, RoPE) is not counted.
nlohmann::json step_flops(const GptConfig& cfg, int B, int T) {
  const double N = double(B) * T, C = cfg.n_embd, F = cfg.ffn_size(), L = cfg.n_layer, V = cfg.vocab;
  const double linears = 6 * N * L * (C * cfg.qkv_width() + C * C + (cfg.swiglu ? 3 : 2) * C * F);
  const double head = 6 * N * C * V;
  const double attention = 6 * double(B) * T * T * C * L;
  return {{"linears", linears}, {"head", head}, {"attention", attention}, {"total", linears + head + attention}};
}

nlohmann::json sgemm_ceiling(const std::vector<Gemm>& gemms, int reps) {
  size_t na = 0, nb = 0, nc = 0;
  for (const auto& g : gemms)
    na = std::max(na, size_t(g.M) * g.K), nb = std::max(nb, size_t(g.K) * g.N), nc = std::max(nc, size_t(g.M) * g.N);
  // Normal values in [-0.5, 0.5) (no denormals); filled once per call, outside the timing.
  auto fill = [](size_t n) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = float((uint32_t(i) * 2654435761u) >> 16) / 65536.0f - 0.5f;
    return v;
  };
  std::vector<float> a = fill(na), b = fill(nb), c = fill(nc);
  double flops = 0, seconds = 0;
  nlohmann::json shapes = nlohmann::json::array();
  for (const auto& g : gemms) {
    const int lda = g.ta ? g.M : g.K, ldb = g.tb ? g.K : g.N;
    double best = 1e30;
    for (int r = 0; r <= reps; ++r) {  // r = 0: warm-up
      const double t0 = wall_now();
      cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans, g.tb ? CblasTrans : CblasNoTrans, g.M, g.N, g.K,
                  1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(), g.N);
      if (r > 0) best = std::min(best, wall_now() - t0);
    }
    flops += g.count * g.flops();
    seconds += g.count * best;
    shapes.push_back({{"gemm", g.what}, {"M", g.M}, {"N", g.N}, {"K", g.K}, {"count", g.count},
                      {"gflops_per_s", g.flops() / best / 1e9}});
  }
  return {{"gflops_per_s", flops / seconds / 1e9}, {"gemm_gflop", flops / 1e9}, {"seconds", seconds}, {"shapes", shapes}};
}

std::vector<int32_t> read_tokens(const std::string& path, int vocab, size_t min_tokens) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw IoError(fmt::format("torch_compare_triax: cannot open the token file {}", path));
  const auto bytes = static_cast<size_t>(f.tellg());
  if (bytes % 4 || bytes / 4 < min_tokens)
    throw IoError(fmt::format("torch_compare_triax: {} has {} bytes; it needs a whole number of int32 tokens, at "
                              "least {} (one batch)",
                              path, bytes, min_tokens));
  std::vector<int32_t> t(bytes / 4);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(t.data()), static_cast<std::streamsize>(bytes));
  for (size_t i = 0; i < t.size(); ++i)
    if (t[i] < 0 || t[i] >= vocab)
      throw IoError(fmt::format("torch_compare_triax: token {} at index {} of {} is outside [0, {})", t[i], i, path, vocab));
  return t;
}

// What one training step runs on: one process, or the Trainer over an mpirun world.
struct Model {
  GptConfig cfg;
  int B = 8, T = 256, threads = 2;
  uint64_t seed = 1234;
  double lr = 6e-4, clip = 1.0;
  AdamWConfig adamw;
};

struct StepOut {
  double loss = 0, grad_norm = 0, seconds = 0;
  // With ranks, per rank (ms): compute (forward/backward), pipeline receive/send waits, exposed
  // DP gradient sync, optimizer (norm + AdamW); where the step's time goes.
  nlohmann::json breakdown;
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual nlohmann::json hello() = 0;
  virtual nlohmann::json export_params(const std::string& path) = 0;
  virtual StepOut step() = 0;
  virtual nlohmann::json sgemm(int reps, int rows) = 0;
  virtual int micro_batch() const = 0;
  // The next command line: rank 0 reads stdin, the others receive it ("quit" at the end).
  virtual std::string next_command() {
    std::string line;
    return std::getline(std::cin, line) ? line : std::string("quit");
  }
  virtual bool answers() const { return true; }
};

// The block's choices, for the PyTorch side to build the same model.
nlohmann::json block_json(const GptConfig& c) {
  return {{"gpt2", c.is_gpt2()},
          {"kv_heads", c.kv_heads()},
          {"ffn", c.ffn_size()},
          {"norm", std::string(enum_name(c.norm))},
          {"norm_eps", c.norm_eps},
          {"swiglu", c.swiglu},
          {"positions", std::string(enum_name(c.positions))},
          {"rope_theta", c.rope_theta},
          {"rope_llama3_scaling", c.rope_scaling.llama3},
          {"bias", c.bias},
          {"tied_embeddings", c.tied_embeddings}};
}

nlohmann::json common_hello(const Model& m) {
  return {{"side", "triax"},
          {"block", block_json(m.cfg)},
          {"padded_vocab", m.cfg.padded_vocab()},
          {"flops", step_flops(m.cfg, m.B, m.T)},
          {"openblas", openblas_get_config()},
          {"isa", cpu_isa_name(cpu_isa())},
          {"threads", m.threads}};
}

// The single-rank path: GptChunk forward + backward and Optimizer::step on a Self communicator.
class SingleEngine final : public Engine {
 public:
  SingleEngine(const Model& m, const std::string& data)
      : m_(m), tokens_(read_tokens(data, m.cfg.vocab, size_t(m.B) * m.T + 1)), nseq_((tokens_.size() - 1) / m.T),
        grid_(std::make_unique<ProcessGrid>(std::shared_ptr<Communicator>(make_self_communicator()), GridShape{})),
        chunk_(m.cfg, ChunkSpec{0, m.cfg.n_layer, true, true}, grid_->tp(), store_, Recompute::none),
        x_(size_t(m.B) * m.T), y_(size_t(m.B) * m.T) {
    store_.finalize();
    chunk_.init_params(m.seed);
    OptimizerConfig ocfg;
    ocfg.adamw = m.adamw;
    ocfg.max_grad_norm = m.clip;
    opt_ = std::make_unique<Optimizer>(store_, *grid_, ocfg);
  }
  nlohmann::json hello() override {
    nlohmann::json params = nlohmann::json::array();
    for (const auto& p : store_.infos())
      params.push_back({{"name", p.spec.name}, {"shape", p.local_shape}, {"weight_decay", p.spec.weight_decay}});
    nlohmann::json j = common_hello(m_);
    j["params"] = params;
    j["numel"] = store_.numel();
    return j;
  }
  nlohmann::json export_params(const std::string& path) override {
    io::SafetensorsWriter w;
    std::string decay;
    for (size_t i = 0; i < store_.size(); ++i) {
      const auto& p = store_.info(i);
      w.add(p.spec.name, io::Shape(p.local_shape), store_.param_to_host(i));
      if (p.spec.weight_decay) decay += (decay.empty() ? "" : ",") + p.spec.name;
    }
    w.add_metadata("decay", decay);
    w.write(path);
    return {{"exported", path}};
  }
  StepOut step() override {
    const int B = m_.B, T = m_.T;
    for (int b = 0; b < B; ++b) {
      const size_t s = (size_t(step_) * B + b) % nseq_;
      std::copy_n(tokens_.begin() + s * T, T, x_.begin() + size_t(b) * T);
      std::copy_n(tokens_.begin() + s * T + 1, T, y_.begin() + size_t(b) * T);
    }
    const double t0 = wall_now();
    store_.zero_grads();
    const double loss = chunk_.forward(0, B, T, x_, y_, Tensor(), Tensor(), true);
    chunk_.backward(0, Tensor(), Tensor());
    const StepReport rep = opt_->step(m_.lr);
    ++step_;
    return {loss, rep.grad_norm, wall_now() - t0};
  }
  nlohmann::json sgemm(int reps, int rows) override { return sgemm_ceiling(step_gemms(m_.cfg, rows, m_.T), reps); }
  int micro_batch() const override { return m_.B; }

 private:
  Model m_;
  std::vector<int32_t> tokens_;
  size_t nseq_;
  std::unique_ptr<ProcessGrid> grid_;
  ParamStore store_;
  GptChunk chunk_;
  std::unique_ptr<Optimizer> opt_;
  std::vector<int32_t> x_, y_;
  int64_t step_ = 0;
};

#if defined(TRIAX_HAVE_MPI)
// The multi-rank path: the library's Trainer (schedule, executor, DP buckets, optimizer) on the
// mpirun world, from the same initial weights (init by (seed, name) on the full shape, whatever
// the layout) and the same samples (global sample index, file order, constant learning rate).
class TrainerEngine final : public Engine {
 public:
  struct Layout {
    int dp = 1, pp = 1;
    int64_t micro_batches = 0;  // 0: 1 with pp 1, else 2 pp (the trainer's default: fill the pipeline)
    std::string schedule = "1f1b";
    std::vector<int> stage_layers;  // empty: even
    bool zero1 = false;             // ZeRO-1: AdamW state and update sharded over dp
  };
  TrainerEngine(const Model& m, const Layout& l, const std::string& shard)
      : m_(m), boot_(Bootstrap::create()), world_(boot_->world()) {
    if (boot_->kind() != LaunchKind::mpi)
      TRIAX_THROW(ConfigError, "--dp {} --pp {} needs mpirun (launched as '{}')", l.dp, l.pp,
                  launch_kind_name(boot_->kind()));
    TrainConfig c;
    // The block comes from the preset (TrainConfig overrides only the shape); kv heads and every
    // block choice are checked against the worker's model below.
    c.model = m.cfg.is_gpt2() ? "tiny" : "llama-tiny";
    c.layers = m.cfg.n_layer;
    c.heads = m.cfg.n_head;
    c.hidden = m.cfg.n_embd;
    c.ffn = m.cfg.ffn_size();
    c.vocab = m.cfg.vocab;
    c.max_seq = m.cfg.max_seq;
    c.seq = m.T;
    c.dp = l.dp;
    c.pp = l.pp;
    c.schedule = parse_schedule_kind(l.schedule);
    c.pipeline_layers = l.stage_layers;
    c.zero = (l.zero1) ? 1 : 0;
    c.global_batch = m.B;
    c.num_micro_batches = l.micro_batches ? l.micro_batches : (l.pp > 1 ? 2 * l.pp : 1);
    c.train_iters = int64_t{1} << 40;  // the driver decides how many steps; nothing decays
    c.seed = m.seed;
    c.lr = m.lr;
    c.lr_decay = LrDecay::constant;
    c.adamw = m.adamw;
    c.clip_grad = m.clip;
    c.data = shard;
    c.data_shuffle = false;
    c.loss_spike_zscore = 0;   // random tokens: no spikes to warn about
    c.straggler_factor = 1e6;  // a shared machine slows ranks at random; the driver reports times
    trainer_ = std::make_unique<Trainer>(world_, c);
    const GptConfig& got = trainer_->model_config();
    if (block_json(got) != block_json(m.cfg))
      TRIAX_THROW(ConfigError, "the Trainer built the block {} from preset '{}', the worker asked for {} (--kv-heads and "
                  "--ffn must be the preset's with ranks)", block_json(got).dump(), c.model, block_json(m.cfg).dump());
    layout_ = fmt::format("dp {} pp {}", l.dp, l.pp);
  }
  nlohmann::json hello() override {
    const TrainConfig& c = trainer_->config();
    nlohmann::json j = common_hello(m_);
    j["numel"] = trainer_->model_config().num_params();
    j["ranks"] = world_->size();
    j["layout"] = layout_;
    j["micro_batch"] = *c.micro_batch;
    j["micro_batches"] = *c.num_micro_batches;
    j["schedule"] = std::string(schedule_kind_name(c.schedule));
    j["stage_layers"] = c.pipeline_layers;
    j["zero1"] = (c.zero == 1);
    j["bucket_mb"] = c.bucket_mb;
    j["overlap_grad_reduce"] = c.overlap_grad_reduce;
    j["threads_per_rank"] = omp_get_max_threads();
    return j;
  }
  nlohmann::json export_params(const std::string&) override {
    TRIAX_THROW(ConfigError, "export: only the one-process worker exports (the initial weights do not depend on the layout)");
  }
  StepOut step() override {
    const IterationMetrics mt = trainer_->step();
    // Outside the timed step: every rank's own times, gathered.
    const StepResult& st = trainer_->last_step();
    const StepReport& rep = trainer_->last_report();
    const std::vector<double> mine{st.compute_s * 1e3, st.p2p_wait_s * 1e3, (rep.sync.exposed_s + rep.gather_s) * 1e3,
                                   rep.update_s * 1e3};
    std::vector<double> all(mine.size() * static_cast<size_t>(world_->size()));
    world_->all_gather(std::span<const double>(mine), std::span<double>(all)).wait();
    nlohmann::json b = nlohmann::json::object();
    const char* names[] = {"compute_ms", "p2p_wait_ms", "dp_exposed_ms", "optimizer_ms"};
    for (size_t k = 0; k < mine.size(); ++k) {
      nlohmann::json per = nlohmann::json::array();
      for (int r = 0; r < world_->size(); ++r) per.push_back(all[static_cast<size_t>(r) * mine.size() + k]);
      b[names[k]] = per;
    }
    return {mt.loss, mt.grad_norm, mt.elapsed_ms / 1e3, b};
  }
  nlohmann::json sgemm(int reps, int rows) override {
    // Every rank at once, after a barrier: what each core does on its own threads while the other
    // rank's core is busy too (the 2-rank run's situation).
    world_->barrier().wait();
    const nlohmann::json mine = sgemm_ceiling(step_gemms(m_.cfg, rows, m_.T), reps);
    std::vector<double> in{mine["gflops_per_s"].get<double>()}, all(static_cast<size_t>(world_->size()));
    world_->all_gather(std::span<const double>(in), std::span<double>(all)).wait();
    double sum = 0;
    for (double v : all) sum += v;
    return {{"gflops_per_s", sum}, {"per_rank", all}, {"rows", rows}, {"gemm_gflop", mine["gemm_gflop"]}};
  }
  int micro_batch() const override { return static_cast<int>(*trainer_->config().micro_batch); }
  std::string next_command() override {
    // Rank 0 reads stdin (mpirun forwards it there only) and broadcasts the line; the others
    // poll for it with sleeps, not in MPI's busy wait: between rounds they must leave the cores
    // to the PyTorch side.
    std::array<uint8_t, 4096> buf{};
    if (world_->rank() == 0) {
      const std::string line = Engine::next_command();
      if (line.size() >= buf.size()) TRIAX_THROW(ConfigError, "command of {} bytes (at most {})", line.size(), buf.size() - 1);
      std::copy(line.begin(), line.end(), buf.begin());
    }
    Work w = world_->broadcast(std::span<uint8_t>(buf), 0);
    while (!w.test()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return std::string(reinterpret_cast<const char*>(buf.data()));
  }
  bool answers() const override { return world_->rank() == 0; }

 private:
  Model m_;
  std::unique_ptr<Bootstrap> boot_;
  std::shared_ptr<Communicator> world_;
  std::unique_ptr<Trainer> trainer_;
  std::string layout_;
};
#endif

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"triax worker of benchmarks/torch_compare.py (commands on stdin, JSON lines on stdout)"};
  Model m;
  GptConfig& cfg = m.cfg;
  std::string data, shard;
  int dp = 1, pp = 1;
  int64_t micro_batches = 0;
  std::string schedule = "1f1b";
  std::vector<int> stage_layers;
  bool zero1 = false;
  std::string block = "gpt2";
  int kv_heads = 0, ffn = 0;
  app.add_option("--block", block, "gpt2, or llama: the block of the llama-tiny preset (RMSNorm, SwiGLU, RoPE, "
                 "no biases, untied head)")->check(CLI::IsMember({"gpt2", "llama"}));
  app.add_option("--kv-heads", kv_heads, "key/value heads (grouped-query attention; default: --heads)");
  app.add_option("--ffn", ffn, "MLP hidden size (default: 4 x --channels)");
  app.add_option("--layers", cfg.n_layer)->required();
  app.add_option("--heads", cfg.n_head)->required();
  app.add_option("--channels", cfg.n_embd)->required();
  app.add_option("--vocab", cfg.vocab)->required();
  app.add_option("--max-seq", cfg.max_seq, "position-embedding rows (default: --seq)");
  app.add_option("--seq", m.T)->required()->check(CLI::PositiveNumber);
  app.add_option("--batch", m.B, "global batch (sequences per step)")->required()->check(CLI::PositiveNumber);
  app.add_option("--threads", m.threads, "threads per rank")->check(CLI::PositiveNumber);
  app.add_option("--seed", m.seed);
  app.add_option("--lr", m.lr);
  app.add_option("--clip", m.clip);
  app.add_option("--beta1", m.adamw.beta1);
  app.add_option("--beta2", m.adamw.beta2);
  app.add_option("--eps", m.adamw.eps);
  app.add_option("--weight-decay", m.adamw.weight_decay);
  app.add_option("--data", data, "int32 token file (one process)");
  app.add_option("--shard", shard, "the same tokens as an llm.c shard (with --dp/--pp: the Trainer reads it)");
  app.add_option("--dp", dp, "data-parallel ranks (under mpirun)")->check(CLI::PositiveNumber);
  app.add_option("--pp", pp, "pipeline stages (under mpirun)")->check(CLI::PositiveNumber);
  app.add_option("--micro-batches", micro_batches, "micro-batches per step (default: 1 with pp 1, else 2 pp)");
  app.add_option("--schedule", schedule, "pipeline schedule (1f1b, gpipe, zb-h1)");
  app.add_option("--pipeline-layers", stage_layers, "layers per stage, e.g. 9,3 (default: even)")->delimiter(',');
  app.add_flag("--zero1", zero1, "ZeRO-1 over dp (reduce-scatter, sharded AdamW, all-gather)");
  bool max_seq_given = false;
  app.callback([&] { max_seq_given = app.count("--max-seq") > 0; });
  CLI11_PARSE(app, argc, argv);
  if (!max_seq_given) cfg.max_seq = m.T;
  std::unique_ptr<Engine> engine;
  try {
    if (block == "llama") {
      const GptConfig p = GptConfig::preset("llama-tiny");
      cfg.norm = p.norm;
      cfg.norm_eps = p.norm_eps;
      cfg.swiglu = p.swiglu;
      cfg.positions = p.positions;
      cfg.rope_theta = p.rope_theta;
      cfg.rope_scaling = p.rope_scaling;
      cfg.bias = p.bias;
      cfg.tied_embeddings = p.tied_embeddings;
    }
    cfg.n_kv_head = kv_heads;
    cfg.ffn = ffn;
    cfg.validate();
    if (m.T > cfg.max_seq) throw ConfigError(fmt::format("--seq {} exceeds --max-seq {}", m.T, cfg.max_seq));
    omp_set_num_threads(m.threads);
    openblas_set_num_threads(m.threads);
    if (dp * pp > 1) {
#if defined(TRIAX_HAVE_MPI)
      if (shard.empty()) throw ConfigError("--dp/--pp need --shard (the tokens as an llm.c shard)");
      engine = std::make_unique<TrainerEngine>(m, TrainerEngine::Layout{dp, pp, micro_batches, schedule, stage_layers, zero1}, shard);
#else
      throw ConfigError("--dp/--pp need MPI (this triax was built with TRIAX_WITH_MPI=OFF)");
#endif
    } else {
      if (data.empty()) throw ConfigError("--data is required (int32 token file)");
      engine = std::make_unique<SingleEngine>(m, data);
    }
    const bool answers = engine->answers();
    auto answer = [&](const nlohmann::json& j) {
      if (answers) reply(j);
    };
    for (;;) {
      const std::string line = engine->next_command();
      std::istringstream in(line);
      std::string cmd;
      in >> cmd;
      if (cmd == "quit") break;
      if (cmd == "hello") {
        answer(engine->hello());
      } else if (cmd == "export") {
        std::string path;
        in >> path;
        answer(engine->export_params(path));
      } else if (cmd == "steps") {
        int k = 0;
        in >> k;
        nlohmann::json losses = nlohmann::json::array(), norms = nlohmann::json::array(),
                       secs = nlohmann::json::array(), breakdown = nlohmann::json::array();
        for (int i = 0; i < k; ++i) {
          const StepOut o = engine->step();
          secs.push_back(o.seconds);
          losses.push_back(o.loss);
          norms.push_back(o.grad_norm);
          if (!o.breakdown.is_null()) breakdown.push_back(o.breakdown);
        }
        nlohmann::json j{{"losses", losses}, {"grad_norms", norms}, {"seconds", secs}};
        if (!breakdown.empty()) j["breakdown"] = breakdown;
        answer(j);
      } else if (cmd == "sgemm") {
        int reps = 3, rows = 0;
        in >> reps >> rows;
        answer(engine->sgemm(std::max(1, reps), rows > 0 ? rows : engine->micro_batch()));
      } else {
        answer({{"error", fmt::format("unknown command '{}' (hello, export PATH, steps K, sgemm R [ROWS], quit)", line)}});
      }
    }
  } catch (const std::exception& e) {
    reply({{"error", e.what()}});
    fmt::print(stderr, "torch_compare_triax: {}\n", e.what());
#if defined(TRIAX_HAVE_MPI)
    // One rank failing must end the job: the others may wait in a collective forever.
    if (dp * pp > 1) {
      int init = 0;
      MPI_Initialized(&init);
      if (init) MPI_Abort(MPI_COMM_WORLD, 1);
    }
#endif
    return 1;
  }
  return 0;
}
