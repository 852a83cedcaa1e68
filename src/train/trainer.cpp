// The training loop: resolve and validate the configuration, build the grid, model chunks and
// optimizer, then run iterations (schedule -> executor -> optimizer) and report metrics.
#include "triax/train/trainer.h"

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <numeric>

#include "triax/core/log.h"

#include <omp.h>

#include <cstdlib>
#include <thread>

namespace triax {

std::string IterationMetrics::log_line() const {
  return fmt::format(
      " iteration {:>8}/{:>8} | consumed samples: {:>12} | elapsed time per iteration (ms): {:.1f} | "
      "throughput (tokens/s): {:.0f} | TFLOP/s per rank: {:.4f} | learning rate: {:.6E} | global batch size: {:>5} | "
      "lm loss: {:.6E} | grad norm: {:.3f} | number of skipped iterations: {:>3} | "
      "dp exposed (ms): {:.2f} | p2p wait (ms): {:.2f} |{}",
      iteration, train_iters, consumed_samples, elapsed_ms, tokens_per_s, tflops, lr, global_batch, loss, grad_norm,
      skipped, dp_exposed_ms, p2p_wait_ms, moe ? fmt::format(" load balancing loss: {:.6E} |", moe_aux_loss) : "");
}

std::string IterationMetrics::json() const {
  nlohmann::json j;
  j["iteration"] = iteration;
  j["consumed_samples"] = consumed_samples;
  j["elapsed_ms"] = elapsed_ms;
  j["tokens_per_s"] = tokens_per_s;
  j["tflops"] = tflops;
  j["lr"] = lr;
  j["global_batch_size"] = global_batch;
  j["micro_batches"] = micro_batches;
  j["loss"] = loss;
  if (moe) j["moe_aux_loss"] = moe_aux_loss;
  j["grad_norm"] = grad_norm;
  j["skipped_iterations"] = skipped;
  j["dp_exposed_ms"] = dp_exposed_ms;
  j["dp_comm_ms"] = dp_comm_ms;
  j["p2p_wait_ms"] = p2p_wait_ms;
  j["compute_ms"] = compute_ms;
  return j.dump();
}

namespace {

GptConfig resolve_model(const TrainConfig& c) {
  GptConfig m = GptConfig::preset(c.model);
  if (c.layers) m.n_layer = c.layers;
  if (c.heads) m.n_head = c.heads;
  if (c.hidden) m.n_embd = c.hidden;
  if (c.ffn) m.ffn = c.ffn;
  if (c.vocab) m.vocab = c.vocab;
  if (c.max_seq) m.max_seq = c.max_seq;
  return m;
}

}  // namespace

Trainer::Trainer(std::shared_ptr<Communicator> world, const TrainConfig& cfg) : cfg_(cfg) {
  const int W = world->size();
  require(cfg.tp >= 1 && cfg.pp >= 1 && cfg.dp >= 0 && cfg.vpp >= 1,
          "parallel sizes must be positive: tp={} pp={} dp={} vpp={}", cfg.tp, cfg.pp, cfg.dp, cfg.vpp);
  int dp = cfg.dp;
  if (dp == 0) {
    require(W % (cfg.tp * cfg.pp) == 0, "the world of {} ranks is not divisible by tp {} x pp {} = {}", W, cfg.tp,
            cfg.pp, cfg.tp * cfg.pp);
    dp = W / (cfg.tp * cfg.pp);
  }
  cfg_.dp = dp;
  model_ = resolve_model(cfg);
  model_.validate(cfg.tp);
  T_ = cfg.seq ? cfg.seq : model_.max_seq;
  require(T_ >= 1 && T_ <= model_.max_seq, "sequence length {} must be in [1, max_seq {}]", T_, model_.max_seq);
  kind_ = parse_schedule_kind(cfg.schedule);
  require(cfg.vpp == 1 || kind_ == ScheduleKind::interleaved,
          "--vpp {} needs the interleaved schedule (got '{}')", cfg.vpp, cfg.schedule);
  require(kind_ != ScheduleKind::interleaved || cfg.vpp >= 2,
          "the interleaved schedule needs --vpp >= 2 virtual chunks per stage (got {})", cfg.vpp);
  parse_recompute(cfg.recompute);

  // Layers per virtual stage.
  const int P = cfg.pp, V = cfg.vpp, L = model_.n_layer;
  if (!cfg.pipeline_layers.empty()) {
    require(V == 1, "--pipeline-layers gives one count per stage; it cannot be combined with --vpp {}", V);
    require(static_cast<int>(cfg.pipeline_layers.size()) == P, "--pipeline-layers has {} counts for pp {} stages",
            cfg.pipeline_layers.size(), P);
    const int sum = std::accumulate(cfg.pipeline_layers.begin(), cfg.pipeline_layers.end(), 0);
    require(sum == L, "--pipeline-layers [{}] sum to {} but the model has {} layers", fmt::join(cfg.pipeline_layers, ","),
            sum, L);
    for (int n : cfg.pipeline_layers) require(n >= 1, "--pipeline-layers [{}]: every stage needs at least one layer", fmt::join(cfg.pipeline_layers, ","));
    stage_layers_ = cfg.pipeline_layers;
  } else {
    require(L % (P * V) == 0,
            "{} layers cannot be split evenly over pp {} x vpp {} = {} virtual stages (give --pipeline-layers for an "
            "uneven split)",
            L, P, V, P * V);
    stage_layers_.assign(static_cast<size_t>(P * V), L / (P * V));
  }

  if (cfg.moe_every > 0) {
    require(cfg.ep >= 1 && dp % cfg.ep == 0, "expert-parallel size ep={} must divide dp={}", cfg.ep, dp);
  } else {
    require(cfg.ep == 1, "--ep {} needs MoE layers (--moe-every K)", cfg.ep);
  }
  grid_ = std::make_unique<ProcessGrid>(world, GridShape{cfg.tp, P, dp, cfg.ep, cfg.order},
                                        GridOptions{cfg.allow_tp_across_hosts});
  // One thread pool per core: unless the user chose (OMP_NUM_THREADS), ranks sharing a host
  // split its cores, so oversubscribed runs do not spin against each other.
  if (!std::getenv("OMP_NUM_THREADS")) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    omp_set_num_threads(std::max(1, cores / std::max(1, grid_->local_size())));
  }
  data_ = open_dataset(cfg.data, model_.vocab, cfg.seed, DataOptions{cfg.data_shuffle, cfg.data_respect_eod});
  require(data_->vocab() <= model_.vocab, "the data's vocabulary {} exceeds the model's {}", data_->vocab(),
          model_.vocab);
  require(data_->num_samples(T_) > 0, "{} holds no sample of {} + 1 tokens", data_->describe(), T_);
  open_validation();

  BatchConfig bc{cfg.global_batch, cfg.micro_batch, cfg.num_micro_batches};
  if (!bc.global_batch && !bc.micro_batch && !bc.num_micro_batches) {
    bc.micro_batch = 4;
    bc.num_micro_batches = 2 * P;  // enough micro-batches to fill the pipeline
  }
  const BatchPlan plan = resolve_batch(bc, dp);
  require(!cfg.sequence_parallel || (plan.micro_batch * T_) % cfg.tp == 0,
          "sequence parallelism splits micro-batch {} x seq {} = {} tokens over tp {}: not divisible", plan.micro_batch,
          T_, plan.micro_batch * T_, cfg.tp);
  batches_ = std::make_unique<BatchSchedule>(plan, cfg.rampup);
  // Validate the schedule for every micro-batch count the ramp visits (the first and the last).
  validate_schedule_config(kind_, P, V, static_cast<int>(batches_->num_micro_batches(0)));
  validate_schedule_config(kind_, P, V, static_cast<int>(plan.num_micro_batches));

  const int s = grid_->coord().pp;
  const Recompute rc = parse_recompute(cfg.recompute);
  ChunkMoe moe;
  if (cfg.moe_every > 0) {
    moe.every = cfg.moe_every;
    moe.cfg.experts = cfg.experts;
    moe.cfg.top_k = cfg.topk;
    moe.cfg.capacity_factor = cfg.capacity_factor;
    moe.cfg.drop_tokens = !cfg.no_drop;
    moe.cfg.aux_loss_coef = static_cast<float>(cfg.moe_aux_coef);
    moe.cfg.chunks = cfg.moe_chunks;
    moe.ep = &grid_->ep();
    moe.cfg.validate(cfg.ep);
    for (int l = 0; l < L; ++l) moe_layers_ += (l + 1) % cfg.moe_every == 0;
  }
  for (int c = 0; c < V; ++c) {
    const int vs = c * P + s;
    const auto [first, count] = virtual_stage_layers(vs);
    const ChunkSpec spec{first, count, vs == 0, vs == P * V - 1};
    chunks_.push_back(std::make_unique<GptChunk>(model_, spec, grid_->tp(), store_, rc, /*wte_norm_owner=*/P == 1,
                                                 cfg.sequence_parallel, moe));
  }
  store_.finalize(cfg.zero1 ? static_cast<size_t>(dp) : 1);
  for (auto& ch : chunks_) ch->init_params(cfg.seed);

  OptimizerConfig oc;
  oc.adamw = cfg.adamw;
  oc.max_grad_norm = cfg.clip_grad;
  oc.zero1 = cfg.zero1;
  oc.grad_sync.bucket_bytes = static_cast<size_t>(cfg.bucket_mb * 1024 * 1024);
  oc.grad_sync.overlap = cfg.overlap_grad_reduce;
  if (P > 1 && (grid_->is_first_stage() || grid_->is_last_stage()))
    oc.grad_sync.tied_param = store_.find("transformer.wte.weight");
  optimizer_ = std::make_unique<Optimizer>(store_, *grid_, oc);

  std::vector<GptChunk*> ptrs;
  for (auto& ch : chunks_) ptrs.push_back(ch.get());
  executor_ = std::make_unique<PipelineExecutor>(ptrs, grid_->pp(), static_cast<int>(plan.micro_batch), T_,
                                                 model_.n_embd);
  LrScheduleConfig lc;
  lc.max_lr = cfg.lr;
  lc.min_lr = cfg.min_lr;
  lc.warmup_iters = cfg.warmup_iters;
  lc.decay_iters = cfg.decay_iters ? cfg.decay_iters : cfg.train_iters;
  lc.decay = parse_lr_decay(cfg.lr_decay);
  lr_ = std::make_unique<LrSchedule>(lc);
  flops_per_token_ = 6.0 * static_cast<double>(model_.num_params()) +
                     6.0 * model_.n_layer * static_cast<double>(model_.n_embd) * T_;
}

Trainer::~Trainer() = default;

std::pair<int, int> Trainer::virtual_stage_layers(int vs) const {
  int first = 0;
  for (int i = 0; i < vs; ++i) first += stage_layers_.at(static_cast<size_t>(i));
  return {first, stage_layers_.at(static_cast<size_t>(vs))};
}

std::string Trainer::resolved_config() const {
  const auto& c = cfg_;
  const BatchPlan p = batches_->target();
  std::string s;
  s += fmt::format("# triax resolved configuration ({} ranks)\n", grid_->world().size());
  s += fmt::format("model = \"{}\"  # {}\n", c.model, model_.describe());
  s += fmt::format("layers = {}\nheads = {}\nhidden = {}\nffn = {}\nvocab = {}\npadded_vocab = {}\nmax_seq = {}\nseq = {}\n",
                   model_.n_layer, model_.n_head, model_.n_embd, model_.ffn_size(), model_.vocab,
                   model_.padded_vocab(c.tp), model_.max_seq, T_);
  s += fmt::format("tp = {}\npp = {}\ndp = {}\nvpp = {}\norder = \"{}\"\nschedule = \"{}\"\npipeline_layers = [{}]\n", c.tp,
                   c.pp, c.dp, c.vpp, c.order, schedule_kind_name(kind_), fmt::join(stage_layers_, ", "));
  s += fmt::format("micro_batch_size = {}\nglobal_batch_size = {}\nnum_micro_batches = {}\n", p.micro_batch,
                   p.global_batch, p.num_micro_batches);
  if (c.rampup)
    s += fmt::format("rampup_batch_size = [{}, {}, {}]\n", c.rampup->start, c.rampup->increment, c.rampup->samples);
  s += fmt::format("train_iters = {}\nseed = {}\nlr = {}\nmin_lr = {}\nwarmup_iters = {}\ndecay_iters = {}\nlr_decay = \"{}\"\n",
                   c.train_iters, c.seed, c.lr, c.min_lr, c.warmup_iters, c.decay_iters ? c.decay_iters : c.train_iters,
                   c.lr_decay);
  s += fmt::format("weight_decay = {}\nadam_beta1 = {}\nadam_beta2 = {}\nadam_eps = {}\nclip_grad = {}\n",
                   c.adamw.weight_decay, c.adamw.beta1, c.adamw.beta2, c.adamw.eps, c.clip_grad);
  s += fmt::format("zero1 = {}\nbucket_mb = {}\noverlap_grad_reduce = {}\nrecompute = \"{}\"\nsequence_parallel = {}\n",
                   c.zero1, c.bucket_mb, c.overlap_grad_reduce, c.recompute, c.sequence_parallel);
  s += fmt::format("data = \"{}\"  # {}\nmetrics_jsonl = \"{}\"\n", c.data, data_->describe(), c.metrics_jsonl);
  if (valid_)
    s += fmt::format("valid_data = \"{}\"  # {}\neval_interval = {}\neval_iters = {}\n", c.valid_data, valid_->describe(),
                     c.eval_interval, c.eval_iters);
  if (c.moe_every > 0)
    s += fmt::format("moe_every = {}\nexperts = {}\ntopk = {}\ncapacity_factor = {}\nno_drop = {}\nmoe_aux_coef = {}\n"
                     "moe_chunks = {}\nep = {}  # {} MoE layers\n",
                     c.moe_every, c.experts, c.topk, c.capacity_factor, c.no_drop, c.moe_aux_coef, c.moe_chunks, c.ep,
                     moe_layers_);
  s += fmt::format("# threads per rank: {} ({} ranks on this host)\n", omp_get_max_threads(), grid_->local_size());
  size_t act = 0;
  for (auto& ch : chunks_) act += ch->activation_floats(static_cast<int>(p.micro_batch), T_);
  s += fmt::format("# this rank: {} parameters, {:.2f} MiB of activations per in-flight micro-batch (recompute={})\n",
                   store_.numel(), act * 4.0 / (1 << 20), c.recompute);
  return s;
}

IterationMetrics Trainer::step(bool record_events) {
  using Clock = std::chrono::steady_clock;
  const BatchPlan plan = batches_->plan(consumed_);
  const int m = static_cast<int>(plan.num_micro_batches);
  const int P = cfg_.pp, V = cfg_.vpp;
  if (!schedule_ || schedule_->micro_batches != m) schedule_ = make_schedule(kind_, P, V, m);
  store_.zero_grads();
  const int d = grid_->coord().dp;
  const int64_t base = consumed_;
  const int mbs = static_cast<int>(plan.micro_batch);
  auto data = [&](int mb, std::vector<int32_t>& x, std::vector<int32_t>& y) {
    data_->batch(base + (static_cast<int64_t>(d) * m + mb) * mbs, mbs, T_, x, y);
  };
  const double lr = lr_->lr(iteration_);
  const auto t0 = Clock::now();
  last_ = executor_->run(*schedule_, data, &optimizer_->grad_buffer(), 1.0f / static_cast<float>(m), record_events);
  const StepReport rep = optimizer_->step(lr);
  last_report_ = rep;
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();

  // Loss from the last stage (one TP rank per pipeline), averaged over DP; times: max over ranks.
  const bool reporter = grid_->is_last_stage() && grid_->coord().tp == 0;
  double aux = 0;
  for (auto& ch : chunks_) aux += ch->take_aux_loss();
  double sums[2] = {reporter ? last_.loss_sum / m / plan.dp : 0.0,
                    grid_->coord().tp == 0 ? aux / m / plan.dp : 0.0};
  grid_->world().all_reduce(std::span<double>(sums), ReduceOp::sum).wait();
  double maxes[5] = {elapsed, rep.sync.exposed_s + rep.gather_s, rep.sync.comm_span_s, last_.p2p_wait_s,
                     last_.compute_s};
  grid_->world().all_reduce(std::span<double>(maxes), ReduceOp::max).wait();

  consumed_ += plan.global_batch;
  ++iteration_;
  IterationMetrics mt;
  mt.iteration = iteration_;
  mt.train_iters = cfg_.train_iters;
  mt.consumed_samples = consumed_;
  mt.elapsed_ms = maxes[0] * 1e3;
  const double tokens = static_cast<double>(plan.global_batch) * T_;
  mt.tokens_per_s = tokens / maxes[0];
  mt.tflops = flops_per_token_ * tokens / maxes[0] / grid_->world().size() / 1e12;
  mt.lr = lr;
  mt.global_batch = plan.global_batch;
  mt.micro_batches = m;
  mt.loss = sums[0];
  mt.moe = moe_layers_ > 0;
  mt.moe_aux_loss = moe_layers_ > 0 ? sums[1] / moe_layers_ : 0.0;
  mt.grad_norm = rep.grad_norm;
  mt.skipped = rep.skipped_steps;
  mt.dp_exposed_ms = maxes[1] * 1e3;
  mt.dp_comm_ms = maxes[2] * 1e3;
  mt.p2p_wait_ms = maxes[3] * 1e3;
  mt.compute_ms = maxes[4] * 1e3;
  return mt;
}

void Trainer::train(const std::function<void(const IterationMetrics&)>& on_iteration,
                    const std::function<void(const EvalMetrics&)>& on_eval) {
  while (iteration_ < cfg_.train_iters) {
    const auto m = step();
    if (on_iteration) on_iteration(m);
    if (cfg_.eval_interval > 0 && iteration_ % cfg_.eval_interval == 0) {
      const auto e = evaluate();
      if (on_eval) on_eval(e);
    }
  }
}

}  // namespace triax
