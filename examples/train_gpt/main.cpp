// train_gpt: 3D-parallel GPT training on the CPU path, launched by mpirun.
//   mpirun -np 8 train_gpt --tp 2 --pp 2 --dp 2
// With no flags it trains the tiny model on a built-in generated language. Flags may also come
// from a TOML file (--config FILE; keys are the flag names, e.g. micro-batch-size = 4); flags
// given on the command line win. Rank 0 prints the resolved configuration, then one line per
// iteration (Megatron's field names) and, with --metrics-jsonl, one JSON object per iteration.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include <triax/core/log.h>
#include <triax/core/log_json.h>
#include <triax/dist/bootstrap.h>
#include <triax/train/metrics_exporter.h>
#include <triax/train/trainer.h>

#if defined(TRIAX_HAVE_MPI)
#include <mpi.h>
#endif

namespace {
[[noreturn]] void abort_job(int code) {
#if defined(TRIAX_HAVE_MPI)
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  // One rank failing leaves the others waiting in collectives: end the whole job now.
  if (inited && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  std::exit(code);
}
}  // namespace

int main(int argc, char** argv) {
  triax::TrainConfig c;
  CLI::App app{"triax train_gpt: tensor x pipeline x data parallel GPT training (CPU path)"};
  app.set_config("--config", "", "TOML file of flag values (keys are flag names)");
  app.add_option("--model", c.model, "preset: nano, tiny, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b")->capture_default_str();
  app.add_option("--num-layers", c.layers, "override the preset's layer count");
  app.add_option("--num-attention-heads", c.heads, "override the preset's heads");
  app.add_option("--hidden-size", c.hidden, "override the preset's hidden size");
  app.add_option("--ffn-hidden-size", c.ffn, "override the MLP size (default 4 x hidden)");
  app.add_option("--vocab-size", c.vocab, "override the vocabulary");
  app.add_option("--max-position-embeddings", c.max_seq, "override the position table size");
  app.add_option("--seq-length", c.seq, "tokens per sample (default: max positions)");
  app.add_option("--tp", c.tp, "tensor-parallel size")->capture_default_str();
  app.add_option("--pp", c.pp, "pipeline-parallel size")->capture_default_str();
  app.add_option("--dp", c.dp, "data-parallel size (default world / (tp x pp))");
  app.add_option("--vpp", c.vpp, "virtual chunks per pipeline stage (interleaved schedule)")->capture_default_str();
  app.add_option("--order", c.order, "grid axis order, fastest first")->capture_default_str();
  app.add_flag("--allow-tp-across-hosts", c.allow_tp_across_hosts, "allow TP groups spanning hosts");
  app.add_option("--pipeline-layers", c.pipeline_layers, "layers per stage for an uneven split, e.g. 3,5")->delimiter(',');
  app.add_option("--schedule", c.schedule, "gpipe | 1f1b | interleaved | zb-h1")->capture_default_str();
  app.add_option("--micro-batch-size", c.micro_batch, "samples per micro-batch");
  app.add_option("--global-batch-size", c.global_batch, "samples per iteration over all DP ranks");
  app.add_option("--num-micro-batches", c.num_micro_batches, "micro-batches per iteration (gradient accumulation)");
  std::vector<int64_t> ramp;
  app.add_option("--rampup-batch-size", ramp, "START INCREMENT SAMPLES: grow the global batch")->expected(3);
  app.add_option("--train-iters", c.train_iters, "iterations")->capture_default_str();
  app.add_option("--seed", c.seed, "seed of initialisation and generated data")->capture_default_str();
  app.add_option("--lr", c.lr, "peak learning rate")->capture_default_str();
  app.add_option("--min-lr", c.min_lr, "final learning rate")->capture_default_str();
  app.add_option("--lr-warmup-iters", c.warmup_iters, "linear warm-up iterations")->capture_default_str();
  app.add_option("--lr-decay-iters", c.decay_iters, "iteration where decay reaches min-lr (default train-iters)");
  app.add_option("--lr-decay-style", c.lr_decay, "cosine | linear | constant")->capture_default_str();
  app.add_option("--weight-decay", c.adamw.weight_decay, "AdamW decoupled weight decay")->capture_default_str();
  app.add_option("--adam-beta1", c.adamw.beta1)->capture_default_str();
  app.add_option("--adam-beta2", c.adamw.beta2)->capture_default_str();
  app.add_option("--clip-grad", c.clip_grad, "clip the global gradient norm (0: off)")->capture_default_str();
  app.add_flag("--zero1", c.zero1, "ZeRO-1 distributed optimizer");
  app.add_option("--bucket-mb", c.bucket_mb, "DP gradient bucket size (MiB)")->capture_default_str();
  bool no_overlap = false;
  app.add_flag("--no-overlap-grad-reduce", no_overlap, "reduce gradients after backward instead of during it");
  app.add_flag("--sequence-parallel", c.sequence_parallel, "split LayerNorm/residual regions over TP by tokens");
  app.add_option("--recompute", c.recompute, "none | selective | full")->capture_default_str();
  app.add_option("--moe-every", c.moe_every, "every K-th layer is a mixture-of-experts layer (0: none)");
  app.add_option("--experts", c.experts, "experts per MoE layer")->capture_default_str();
  app.add_option("--topk", c.topk, "experts per token (1 or 2)")->capture_default_str();
  app.add_option("--capacity-factor", c.capacity_factor, "expert capacity factor")->capture_default_str();
  app.add_flag("--no-drop", c.no_drop, "no token dropping (capacity = the largest load)");
  app.add_option("--moe-aux-coef", c.moe_aux_coef, "weight of the load-balancing loss")->capture_default_str();
  app.add_option("--moe-chunks", c.moe_chunks, "token chunks overlapping all-to-all with expert compute")->capture_default_str();
  app.add_option("--ep", c.ep, "expert-parallel size (divides dp)")->capture_default_str();
  app.add_option("--data", c.data, "llm.c token shards (a.bin,b.bin or 'train_*.bin'), a Megatron indexed dataset "
                 "(PREFIX[.bin|.idx]), a text file, or synthetic (default); docs/DATA.md");
  bool no_shuffle = false;
  app.add_flag("--no-data-shuffle", no_shuffle, "visit training samples in file order (default: seeded shuffle per epoch)");
  app.add_flag("--data-respect-eod", c.data_respect_eod, "samples never cross a document boundary (Megatron format)");
  app.add_option("--valid-data", c.valid_data, "validation set (same formats as --data)");
  app.add_option("--eval-interval", c.eval_interval, "validation loss every N iterations (0: never)")->capture_default_str();
  app.add_option("--eval-iters", c.eval_iters, "global batches per validation")->capture_default_str();
  app.add_option("--metrics-jsonl", c.metrics_jsonl, "write one JSON object per iteration here");
  triax::MetricsExporterConfig prom;
  double metrics_linger_s = 0;
  app.add_option("--metrics-port", prom.port, "rank 0 serves Prometheus /metrics on this port (0: any free port)");
  app.add_option("--metrics-bind", prom.bind, "address the metrics endpoint listens on")->capture_default_str();
  app.add_option("--metrics-textfile", prom.textfile, "rewrite this Prometheus textfile atomically after each iteration");
  app.add_option("--metrics-linger", metrics_linger_s, "keep serving /metrics this many seconds after the last iteration");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  c.overlap_grad_reduce = !no_overlap;
  c.data_shuffle = !no_shuffle;
  if (!ramp.empty()) c.rampup = triax::BatchRampup{ramp[0], ramp[1], ramp[2]};

  int rank = 0;
  // The bootstrap outlives the try: an error on one rank must reach abort_job (MPI_Abort) while
  // MPI is still up, not wait in MPI_Finalize for ranks blocked in a collective.
  std::unique_ptr<triax::Bootstrap> boot;
  try {
    boot = triax::Bootstrap::create();
  } catch (const std::exception& e) {
    triax::log::emit(stderr, triax::log::Level::error, fmt::format("train_gpt: start-up failed: {}", e.what()));
    return 1;
  }
  try {
    auto world = boot->world();
    rank = world->rank();
    triax::log::set_rank(world->size() > 1 ? rank : -1);
    triax::Trainer trainer(world, c);
    std::ofstream jsonl;
    if (rank == 0) {
      if (triax::log::format() == triax::log::Format::json)
        triax::log::emit(stdout, triax::log::Level::info, "resolved configuration",
                         nlohmann::json{{"config", trainer.resolved_config()}}.dump());
      else
        std::fputs(trainer.resolved_config().c_str(), stdout);
      if (!c.metrics_jsonl.empty()) {
        jsonl.open(c.metrics_jsonl, std::ios::trunc);
        if (!jsonl) throw triax::IoError(fmt::format("{}: cannot open the metrics file for writing", c.metrics_jsonl));
      }
      std::fflush(stdout);
    }
    std::unique_ptr<triax::MetricsExporter> exporter;
    if (prom.port >= 0 || !prom.textfile.empty())
      exporter = std::make_unique<triax::MetricsExporter>(world, prom, c.tp, c.pp, trainer.grid().layout().shape().dp);
    trainer.train([&](const triax::IterationMetrics& m) {
      if (exporter)
        exporter->observe(m, {trainer.last_step().compute_s, trainer.last_step().p2p_wait_s,
                              trainer.last_report().sync.exposed_s + trainer.last_report().gather_s});
      if (rank != 0) return;
      triax::log::emit(stdout, triax::log::Level::info, m.log_line(), m.json());
      if (jsonl.is_open()) jsonl << m.json() << '\n' << std::flush;
    }, [&](const triax::EvalMetrics& e) {
      if (rank != 0) return;
      std::puts(e.log_line().c_str());
      std::fflush(stdout);
      if (jsonl.is_open()) jsonl << e.json() << '\n' << std::flush;
    });
    if (exporter && exporter->port() >= 0 && metrics_linger_s > 0)
      std::this_thread::sleep_for(std::chrono::duration<double>(metrics_linger_s));
  } catch (const triax::ConfigError& e) {
    triax::log::emit(stderr, triax::log::Level::error, fmt::format("train_gpt: rank {}: configuration error: {}", rank, e.what()));
    abort_job(2);
  } catch (const std::exception& e) {
    triax::log::emit(stderr, triax::log::Level::error, fmt::format("train_gpt: rank {}: {}", rank, e.what()));
    abort_job(1);
  }
  return 0;
}
