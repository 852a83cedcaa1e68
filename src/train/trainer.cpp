// The training loop: resolve and validate the configuration (once), build the rank's backend,
// grid, model chunks and optimizer from it, then run iterations (schedule -> executor ->
// optimizer) and report metrics.
#include "triax/train/trainer.h"

#include "triax/config/hetero.h"

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <numeric>

#include "triax/backend/emulated_backend.h"
#include "triax/core/env.h"
#include "triax/core/gpu_count.h"
#include "triax/core/log.h"
#include "triax/core/trace.h"
#include "triax/core/memory_limit.h"
#include "triax/train/memory_plan.h"
#include "triax/model/hf_dir.h"
#include "triax/model/weight_file.h"

#if defined(TRIAX_HAVE_CUDA)
#include "triax/cuda/cuda_backend.h"
#endif

#include <omp.h>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <new>
#include <thread>

namespace triax {

std::string format_duration(double seconds) {
  const auto s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
}

std::string IterationMetrics::log_line() const {
  return fmt::format(
      " iteration {:>8}/{:>8} | consumed samples: {:>12} | elapsed time per iteration (ms): {:.1f} | "
      "throughput (tokens/s): {:.0f} | TFLOP/s per rank: {:.4f} | learning rate: {:.6E} | global batch size: {:>5} | "
      "lm loss: {:.6E} | grad norm: {:.3f} | number of skipped iterations: {:>3} | "
      "dp exposed (ms): {:.2f} |{}{} p2p wait (ms): {:.2f} |{} ETA: {} |",
      iteration, train_iters, consumed_samples, elapsed_ms, tokens_per_s, tflops, lr, global_batch, loss, grad_norm,
      skipped, dp_exposed_ms,
      zero3 ? fmt::format(" zero3 gather exposed (ms): {:.2f} of {:.2f} ({:.0f}% hidden) |", zero3_gather_exposed_ms,
                          zero3_gather_ms, 100 * zero3_hidden())
            : "",
      cp ? fmt::format(" cp exposed (ms): {:.2f} of {:.2f} ({:.0f}% hidden) |", cp_exposed_ms, cp_exchange_ms,
                       100 * cp_hidden())
         : "",
      p2p_wait_ms, moe ? fmt::format(" load balancing loss: {:.6E} |", moe_aux_loss) : "",
      format_duration(eta_s));
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
  if (zero3) {
    j["zero3_gather_exposed_ms"] = zero3_gather_exposed_ms;
    j["zero3_gather_ms"] = zero3_gather_ms;
    j["zero3_gather_hidden"] = zero3_hidden();
  }
  if (cp) {
    j["cp_exposed_ms"] = cp_exposed_ms;
    j["cp_exchange_ms"] = cp_exchange_ms;
    j["cp_hidden"] = cp_hidden();
  }
  j["peak_mem_bytes"] = peak_mem_bytes;
  j["eta_s"] = eta_s;
  if (step_skipped) {
    j["step_skipped"] = true;
    j["nonfinite_rank"] = nonfinite_rank;
    j["nonfinite_param"] = nonfinite_param;
  }
  if (loss_spike) j["loss_spike"] = true;
  if (!stragglers.empty()) j["stragglers"] = stragglers;
  return j.dump();
}

namespace {

// What did not fit when an allocation failed after all (the prediction was under the limit, or the
// limit unknown): the memory model's numbers for this rank and what the host reports.
std::string describe_start_up_oom(const ResolvedTrainConfig& r, int world_size, int rank) {
  const TrainConfig& c = r.explicit_cfg;
  const int stage = GridLayout(world_size, GridShape{c.tp, c.pp, r.dp, c.ep, c.order, c.cp}).coord(rank).pp;
  const MemoryLimit limit = available_memory(Device::cpu());
  return fmt::format(
      "rank {}: out of memory while allocating the model, optimizer and pipeline buffers of {} (tp {} pp {} dp {}, "
      "micro-batch {} x seq {}): this rank needs about {} (memory model, docs/PLANNER.md); {}. Use a smaller model, "
      "more tp/pp, --zero 1/2/3 or --recompute full",
      rank, r.model.describe(), c.tp, c.pp, r.dp, r.batch.micro_batch, r.seq,
      describe_rank_memory(predict_rank_memory(r, stage)),
      limit.bytes ? fmt::format("{:.0f} MiB are available ({})", static_cast<double>(*limit.bytes) / (1 << 20), limit.source)
                  : std::string("the available memory is unknown"));
}

// The step's times (seconds) and allocator high-water mark, each the max over ranks, in the order
// Trainer::step reduces them, into the iteration's metrics.
void set_max_times(IterationMetrics& mt, std::span<const double, 10> maxes) {
  mt.elapsed_ms = maxes[0] * 1e3;
  mt.dp_exposed_ms = maxes[1] * 1e3;
  mt.dp_comm_ms = maxes[2] * 1e3;
  mt.p2p_wait_ms = maxes[3] * 1e3;
  mt.compute_ms = maxes[4] * 1e3;
  mt.peak_mem_bytes = static_cast<int64_t>(maxes[5]);
  mt.zero3_gather_exposed_ms = maxes[6] * 1e3;
  mt.zero3_gather_ms = maxes[7] * 1e3;
  mt.cp_exposed_ms = maxes[8] * 1e3;
  mt.cp_exchange_ms = maxes[9] * 1e3;
}

// The memory available, the same number on every rank (collective): the smallest measurement in
// the job. Ranks of one host read MemAvailable at slightly different moments, and a refusal must
// print one message per job, not one per rank.
MemoryLimit job_memory_limit(Communicator& world, Device device) {
  MemoryLimit limit = available_memory(device);
  double room = limit.bytes ? static_cast<double>(*limit.bytes) : std::numeric_limits<double>::infinity();
  world.all_reduce(std::span<double>(&room, 1), ReduceOp::min).wait();
  if (std::isfinite(room)) limit.bytes = static_cast<uint64_t>(room);
  return limit;
}

// The pipeline stages of the ranks that share this rank's host (and its memory).
std::vector<int> stages_on_my_host(const ProcessGrid& g) {
  std::vector<int> stages;
  const auto& hosts = g.hosts();
  for (int r = 0; r < g.layout().world_size(); ++r)
    if (hosts.empty() ? r == g.rank() : hosts[static_cast<size_t>(r)] == hosts[static_cast<size_t>(g.rank())])
      stages.push_back(g.layout().coord(r).pp);
  return stages;
}

}  // namespace

namespace {

// An HF Llama directory's block as the block flags, where they are not given (a flag that
// disagrees is refused on load when it changes a tensor's name or shape: load_hf_dir).
void fill_block_from(TrainConfig& c, const GptConfig& f) {
  if (!c.normalization) c.normalization = f.norm;
  if (!c.norm_epsilon) c.norm_epsilon = f.norm_eps;
  if (!c.swiglu) c.swiglu = f.swiglu;
  if (!c.position_embedding) c.position_embedding = f.positions;
  // The rotary flags only under rope positions (a flag that turns them off is refused on load,
  // naming both models, not for a rotary flag the command line never gave).
  if (c.position_embedding == PositionEmbedding::rope) {
    if (!c.rotary_base) c.rotary_base = f.rope_theta;
    if (!c.use_rope_scaling) c.use_rope_scaling = f.rope_scaling.llama3;
    if (!c.rope_scaling_factor && f.rope_scaling.llama3 && c.use_rope_scaling == true)
      c.rope_scaling_factor = f.rope_scaling.factor;
  }
  const bool groups = f.kv_heads() != f.n_head;
  if (!c.group_query_attention && !c.num_query_groups) c.group_query_attention = groups;
  // --group-query-attention alone takes the directory's groups, as it takes a preset's.
  if (c.group_query_attention == true && !c.num_query_groups && groups) c.num_query_groups = f.kv_heads();
  if (!c.untie_embeddings) c.untie_embeddings = !f.tied_embeddings;
  if (!c.disable_bias_linear) c.disable_bias_linear = !f.bias;
}

}  // namespace

TrainConfig with_init_from_shape(const TrainConfig& cfg) {
  if (cfg.init_from.empty()) return cfg;
  TrainConfig c = cfg;
  // An HF model directory's config.json, or a GPT-2 weight file's tensors.
  const bool hf = is_hf_dir(cfg.init_from);
  std::error_code ec;
  if (!hf && std::filesystem::is_directory(cfg.init_from, ec))
    TRIAX_THROW(IoError, "--init-from {}: a directory without config.json; --init-from takes a GPT-2 weight file "
                "(HF safetensors or llm.c .bin) or an HF Llama model directory (config.json + model.safetensors "
                "or model.safetensors.index.json)", cfg.init_from);
  const GptConfig f = hf ? read_hf_config(cfg.init_from) : WeightFile(cfg.init_from, cfg.heads.value_or(0)).config();
  // The file's shape fills what the flags leave open; a flag that disagrees is refused on load
  // with both shapes named (WeightFile::load, load_hf_dir).
  if (!c.layers) c.layers = f.n_layer;
  if (!c.heads) c.heads = f.n_head;
  if (!c.hidden) c.hidden = f.n_embd;
  if (!c.ffn) c.ffn = f.ffn_size();
  if (!c.vocab) c.vocab = f.vocab;
  if (!c.max_seq) c.max_seq = f.max_seq;
  if (hf) fill_block_from(c, f);
  return c;
}

namespace {

// resolve_train_config of cfg with --init-from's shape and block; from an HF Llama directory also
// what no flag spells: the llama3 scaling's low/high frequency factors and original context
// (the flags fix them at Megatron's 1, 4, 8192) and the vocabulary padding (128).
ResolvedTrainConfig resolve_with_init_from(const TrainConfig& cfg, Communicator& world) {
  const TrainConfig c = with_init_from_shape(cfg);
  const int world_size = world.size();
  const std::vector<std::string> rank_classes = gather_device_classes(world);
  // Choosing among --tp/--pp sizes needs the hosts (a tp group must stay inside one); every rank
  // has the same configuration, so all gather or none.
  const bool choices = !c.tp_choices.empty() || !c.pp_choices.empty();
  const std::vector<std::string> hosts = choices ? gather_host_names(world) : std::vector<std::string>{};
  ResolvedTrainConfig r;
  try {
    r = resolve_train_config(c, world_size, rank_classes, hosts);
  } catch (const ConfigError& e) {
    if (c.init_from.empty()) throw;
    // The flags a message names include those the file filled in: say where they came from.
    TRIAX_THROW(ConfigError, "{} (the model flags not given come from --init-from {})", e.what(), c.init_from);
  }
  if (!c.init_from.empty() && is_hf_dir(c.init_from)) {
    const GptConfig f = read_hf_config(c.init_from);
    GptConfig& m = r.model;
    if (m.rope_scaling.llama3 && f.rope_scaling.llama3) {
      m.rope_scaling.low_freq_factor = f.rope_scaling.low_freq_factor;
      m.rope_scaling.high_freq_factor = f.rope_scaling.high_freq_factor;
      m.rope_scaling.original_max_positions = f.rope_scaling.original_max_positions;
    }
    m.vocab_pad_to = f.vocab_pad_to;
    try {
      m.validate(c.tp);
    } catch (const ConfigError& e) {
      TRIAX_THROW(ConfigError, "--init-from {}: {}", c.init_from, e.what());
    }
  }
  return r;
}

}  // namespace

Trainer::Trainer(std::shared_ptr<Communicator> world, const TrainConfig& cfg, const TrainerOptions& opts)
    : Trainer(world, resolve_with_init_from(cfg, *world), opts) {}

// Everything below builds from `r` alone: the configuration is resolved once, above, and the
// out-of-memory handlers describe the same resolution (the members are gone by then).
Trainer::Trainer(const std::shared_ptr<Communicator>& world, const ResolvedTrainConfig& r, const TrainerOptions& opts) try
    : opts_(opts),
      cfg_(r.explicit_cfg),
      model_(r.model),
      kind_(r.explicit_cfg.schedule),
      stage_layers_(r.stage_layers),
      T_(r.seq),
      Tl_(r.seq / r.explicit_cfg.cp),
      moe_layers_(r.moe_layers) {
  start_rank(world, r);
  data_ = open_dataset(cfg_.data, model_.vocab, cfg_.seed, DataOptions{cfg_.data_shuffle, cfg_.data_respect_eod});
  require(data_->vocab() <= model_.vocab, "the data's vocabulary {} exceeds the model's {}", data_->vocab(),
          model_.vocab);
  require(data_->num_samples(T_) > 0, "{} holds no sample of {} + 1 tokens", data_->describe(), T_);
  open_validation();
  batches_ = std::make_unique<BatchSchedule>(r.batch, cfg_.rampup);
  build_model(r);
  build_optimizer(r);
  predicted_memory_ = predict_rank_memory(r, grid_->coord().pp);
  flops_per_token_ = 6.0 * static_cast<double>(model_.num_params()) +
                     6.0 * model_.n_layer * static_cast<double>(model_.n_embd) * T_;
} catch (const std::bad_alloc&) {
  // Say what did not fit, and what it should have needed.
  throw OutOfMemoryError(describe_start_up_oom(r, world->size(), world->rank()));
} catch (const MemoryRefused&) {
  throw;  // the start-up refusal says it all already
} catch (const OutOfMemoryError&) {
  // The same from the backend's allocator (the model's buffers are backend allocations).
  throw OutOfMemoryError(describe_start_up_oom(r, world->size(), world->rank()));
}

void Trainer::start_rank(const std::shared_ptr<Communicator>& world, const ResolvedTrainConfig& r) {
  const TrainConfig& cfg = cfg_;
  // r.compute (--bf16/--fp16) is float32 on the cpu and cpu-checked backends (resolve_train_config
  // refuses the others there); the emulated CPU backend computes in it, the CUDA backend takes it
  // as CudaBackendOptions::compute (start_cuda).
  std::vector<std::string> hosts;
  switch (parse_enum<BackendKind>(cfg.backend)) {
    case BackendKind::cpu: backend_ = make_cpu_backend(); break;
    case BackendKind::cpu_checked: backend_ = make_checked_cpu_backend(); break;
    case BackendKind::cpu_emulated: backend_ = make_emulated_backend(r.compute); break;
    case BackendKind::cuda:
      hosts = gather_host_names(*world);  // the local rank picks the device; the grid reuses the names
      start_cuda(world, hosts, r.compute);
      break;
  }
  // The communicator the backend's buffers travel on (the CUDA backend: host spans on world,
  // device buffers on NCCL; cuda/device_comm.h).
  const std::shared_ptr<Communicator> comm = backend_->adapt(world);
  store_ = std::make_unique<ParamStore>(*backend_);
  faults_ = FaultInjector::from_env(comm->rank());
  watchdog_ = std::make_unique<Watchdog>(cfg.stall_timeout, comm->rank());
  spikes_ = LossSpikeDetector(cfg.loss_spike_zscore);
  stragglers_ = StragglerDetector(cfg.straggler_factor);
  grid_ = std::make_unique<ProcessGrid>(comm, GridShape{cfg.tp, cfg.pp, r.dp, cfg.ep, cfg.order, cfg.cp},
                                        GridOptions{cfg.allow_tp_across_hosts, r.rank_classes}, std::move(hosts));
  // Refuse before allocating anything large when the ranks of this host would not fit
  // (docs/ERRORS.md, "Memory at start-up"). A GPU rank has its device's memory to itself.
  const bool own_device = backend_->device().is_cuda();
  refuse_if_over_memory(r, own_device ? std::vector<int>{grid_->coord().pp} : stages_on_my_host(*grid_),
                        job_memory_limit(grid_->world(), backend_->device()),
                        grid_->hosts().empty() ? std::string("?") : grid_->hosts()[static_cast<size_t>(grid_->rank())]);
  // One thread pool per core: unless the user chose (OMP_NUM_THREADS), ranks sharing a host
  // split its cores, so oversubscribed runs do not spin against each other.
  if (!omp_threads_chosen_by_user()) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    omp_set_num_threads(std::max(1, cores / std::max(1, grid_->local_size())));
  }
}

void Trainer::start_cuda(const std::shared_ptr<Communicator>& world, const std::vector<std::string>& hosts,
                         DType compute) {
  // Refused here, before anything is built, with what CUDA said: exit 2 within seconds on a
  // machine without a GPU (or a triax built without CUDA, where the count is 0 too).
  std::string why;
  const int devices = cuda_device_count(&why);
  const std::string& host = hosts.at(static_cast<size_t>(world->rank()));
  if (devices == 0)
    TRIAX_THROW(ConfigError,
                "--backend cuda: CUDA sees 0 devices on host {} (rank {}): {}; run on a GPU machine or use --backend "
                "cpu",
                host, world->rank(), why.empty() ? "no CUDA-capable device" : why);
#if defined(TRIAX_HAVE_CUDA)
  // One GPU per rank: the rank's place on its host, modulo the devices it sees (a launcher that
  // gives each rank one device through CUDA_VISIBLE_DEVICES makes that device 0).
  const int device = local_rank_of(hosts, world->rank()) % devices;
  backend_ = cuda::make_cuda_backend(cuda::CudaBackendOptions{device, compute});
#else
  (void)compute;
  TRIAX_THROW(ConfigError, "--backend cuda: this triax was built without CUDA (configure with -DTRIAX_WITH_CUDA=ON "
              "where nvcc and NCCL are installed)");
#endif
}

void Trainer::build_model(const ResolvedTrainConfig& r) {
  const TrainConfig& cfg = cfg_;
  const int P = cfg.pp, V = cfg.vpp, s = grid_->coord().pp;
  ChunkMoe moe;
  if (cfg.moe_every > 0) {
    moe.every = cfg.moe_every;
    moe.cfg = r.moe;
    moe.ep = &grid_->ep();
    moe.cp = &grid_->cp();
  }
  if (cfg.cp > 1)
    cp_ = std::make_unique<ContextParallel>(grid_->cp(), *backend_,
                                            cfg.cp_comm_type == "allgather" ? CpCommType::allgather : CpCommType::p2p);
  for (int c = 0; c < V; ++c) {
    const int vs = c * P + s;
    const auto [first, count] = virtual_stage_layers(vs);
    const ChunkSpec spec{first, count, vs == 0, vs == P * V - 1};
    chunks_.push_back(std::make_unique<GptChunk>(model_, spec, grid_->tp(), *store_, cfg.recompute,
                                                 /*wte_norm_owner=*/P == 1, cfg.sequence_parallel, moe));
    chunks_.back()->set_context_parallel(cp_.get());
  }
  // A compute copy exists when the backend computes in another type than the masters (or a test
  // forces one); init_params and the weight-file load refresh it.
  // ZeRO-2/3 lay every unit out over the shard group (HSDP: --zero-shard-size ranks of dp).
  if (cfg.zero >= 2) {
    zero_groups_ = make_zero_groups(*grid_, cfg.zero_shard_size);
    store_->finalize_sharded(zero_shard_spec(cfg.zero, zero_groups_, *grid_, opts_.force_compute_copy));
  } else {
    store_->finalize(cfg.zero == 1 ? static_cast<size_t>(grid_->dp_cp().size()) : 1, opts_.force_compute_copy);
  }
  for (auto& ch : chunks_) ch->init_params(cfg.seed);
  if (cfg.init_from.empty()) return;
  if (is_hf_dir(cfg.init_from))
    load_hf_dir(cfg.init_from, *store_, model_, grid_->tp().rank(), grid_->tp().size());
  else
    WeightFile(cfg.init_from, model_.n_head).load(*store_, model_, grid_->tp());
}

void Trainer::build_optimizer(const ResolvedTrainConfig& r) {
  const TrainConfig& cfg = cfg_;
  OptimizerConfig oc;
  oc.adamw = cfg.adamw;
  oc.max_grad_norm = cfg.clip_grad;
  oc.zero = cfg.zero;
  oc.zero_shard_size = cfg.zero_shard_size;
  oc.grad_sync.bucket_bytes = static_cast<size_t>(cfg.bucket_mb * 1024 * 1024);
  oc.grad_sync.overlap = cfg.overlap_grad_reduce;
  oc.sharding.prefetch = cfg.zero_prefetch;
  // The tied embedding's two copies (first and last stage) add their gradients.
  if (cfg.pp > 1 && model_.tied_embeddings && (grid_->is_first_stage() || grid_->is_last_stage()))
    oc.grad_sync.tied_param = store_->find(model_.embedding_param());
  // fp16 needs the dynamic loss scale (float16's range); bf16 has float32's exponent range.
  if (r.compute == DType::f16) oc.loss_scaler = LossScalerConfig{};
  if (opts_.loss_scaler) oc.loss_scaler = *opts_.loss_scaler;
  optimizer_ = std::make_unique<Optimizer>(*store_, *grid_, oc, std::move(zero_groups_));

  std::vector<Stage*> ptrs;
  for (auto& ch : chunks_) ptrs.push_back(ch.get());
  executor_ = std::make_unique<PipelineExecutor>(ptrs, grid_->pp(), static_cast<int>(r.batch.micro_batch), Tl_,
                                                 model_.n_embd);
  watchdog_->set_detail([ex = executor_.get()] { return ex->position(); });
  lr_ = std::make_unique<LrSchedule>(r.lr);
}

Trainer::~Trainer() = default;

std::pair<int, int> Trainer::virtual_stage_layers(int vs) const {
  int first = 0;
  for (int i = 0; i < vs; ++i) first += stage_layers_.at(static_cast<size_t>(i));
  return {first, stage_layers_.at(static_cast<size_t>(vs))};
}

std::string Trainer::resolved_config() const {
  const auto& c = cfg_;
  // Derived facts ride along as comments, so the text stays a --config file of this run.
  auto note = [&](std::string_view key) -> std::string {
    if (key == "model") return model_.describe();
    if (key == "vocab-size") return fmt::format("padded to {} for tp {}", model_.padded_vocab(c.tp), c.tp);
    if (key == "pp") return fmt::format("layers per virtual stage [{}]", fmt::join(stage_layers_, ", "));
    if (key == "data") return data_->describe();
    if (key == "valid-data" && valid_) return valid_->describe();
    if (key == "ep" && moe_layers_ > 0) return fmt::format("{} MoE layers", moe_layers_);
    if (key == "dp-microbatches") return batches_->target().describe();
    return {};
  };
  std::string s = fmt::format("# triax resolved configuration ({} ranks); a --config file that repeats this run\n",
                              grid_->world().size());
  s += to_toml(c, note);
  s += fmt::format("# threads per rank: {} ({} ranks on this host)\n", omp_get_max_threads(), grid_->local_size());
  if (const std::string cls = describe_device_classes(grid_->device_classes()); !cls.empty())
    s += fmt::format("# device classes (TRIAX_DEVICE_CLASS): {}\n", cls);
  size_t act = 0;
  const BatchPlan p = batches_->target();
  for (auto& ch : chunks_) act += ch->activation_floats(static_cast<int>(p.micro_batch), Tl_);
  s += fmt::format("# this rank: {} parameters, {:.2f} MiB of activations per in-flight micro-batch (recompute={})\n",
                   store_->numel(), act * 4.0 / (1 << 20), recompute_name(c.recompute));
  return s;
}

IterationMetrics Trainer::step(bool record_events) {
  using Clock = std::chrono::steady_clock;
  const BatchPlan plan = batches_->plan(consumed_);
  const int d = grid_->coord().dp;
  // This replica's micro-batches (uneven with --dp-microbatches) and the global batch's (M).
  const int m = static_cast<int>(plan.micro_batches_of(d));
  const int64_t first = plan.first_micro_batch_of(d), M = plan.total_micro_batches();
  const int P = cfg_.pp, V = cfg_.vpp;
  if (!schedule_ || schedule_->micro_batches != m) schedule_ = make_schedule(kind_, P, V, m);
  store_->zero_grads();
  if (faults_.any() && faults_.nan_due(iteration_ + 1) && store_->size() > 0) {
    // The nan fault: element 0 of a middle parameter's gradient is NaN before backward adds to
    // it, as if this rank's backward had produced it; the DP sync then spreads it to the other
    // replicas, which is what the attribution must see through. Written through the backend.
    const size_t i = store_->size() / 2;
    backend_->fill(store_->grad_t(i).slice(0, 1), std::numeric_limits<double>::quiet_NaN());
    std::fprintf(stderr, "triax fault injection (TRIAX_FAULT): rank %d at iteration %lld: nan: gradient of %s\n",
                 grid_->world().rank(), static_cast<long long>(iteration_ + 1), store_->info(i).spec.name.c_str());
  }
  const int64_t base = consumed_;
  const int mbs = static_cast<int>(plan.micro_batch);
  auto data = [&](int mb, std::vector<int32_t>& x, std::vector<int32_t>& y) {
    fetch(*data_, base + (first + mb) * mbs, mbs, x, y);
  };
  const double lr = lr_->lr(iteration_);
  const int64_t it = iteration_ + 1;
  watchdog_->progress();
  const auto t0 = Clock::now();
  watchdog_->set_phase(fmt::format("iteration {}: pipeline schedule ({} micro-batches: forward, backward, P2P)", it, m));
  faults_.at_step_start(it);
  // The loss gradient carries the loss scale (1 unless fp16's scaler is on; a power of two, exact) and
  // dp / M: the DP average then weighs every micro-batch 1 / M of the global batch, an uneven split's
  // update equals one process's (and an even split's dp / M is 1 / m, the same float).
  const float dloss = static_cast<float>(optimizer_->loss_scale() * plan.dp) / static_cast<float>(M);
  if (cp_) cp_->reset_stats();  // the iteration line's cp field: this step's exchanges only
  last_ = executor_->run(*schedule_, data, &optimizer_->grad_sink(), dloss, record_events);
  watchdog_->set_phase(fmt::format("iteration {}: optimizer step (DP gradient sync, norm, AdamW)", it));
  faults_.maybe_hang(it);
  const StepReport rep = [&] {
    trace::Span span(trace::Lane::optimizer, "optimizer step (DP sync, grad norm, AdamW)");
    return optimizer_->step(lr);
  }();
  last_report_ = rep;
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  watchdog_->set_phase(fmt::format("iteration {}: metrics all-reduce", it));

  // Loss from the last stage (one TP rank per pipeline), averaged over DP and CP (every CP rank
  // holds the mean of as many tokens); times: max over ranks.
  const bool reporter = grid_->is_last_stage() && grid_->coord().tp == 0;
  double aux = 0;
  for (auto& ch : chunks_) aux += ch->take_aux_loss();
  // Sums, then each rank's own compute time (its step minus waiting for others) in its own slot:
  // the stragglers' data rides on the metrics reduction, no extra collective.
  const int W = grid_->world().size(), me = grid_->world().rank();
  std::vector<double> sums(2 + static_cast<size_t>(W), 0.0);
  sums[0] = reporter ? last_.loss_sum / static_cast<double>(M) / cfg_.cp : 0.0;
  sums[1] = grid_->coord().tp == 0 ? aux / static_cast<double>(M) / cfg_.cp : 0.0;
  const CpStats cps = cp_ ? cp_->stats() : CpStats{};
  sums[2 + static_cast<size_t>(me)] =
      std::max(0.0, elapsed - last_.p2p_wait_s - rep.sync.exposed_s - rep.gather_s - cps.exposed_s);
  grid_->world().all_reduce(std::span<double>(sums), ReduceOp::sum).wait();
  // Seconds, but slot 5: the backend allocator's high-water mark (bytes); 6-7: the ZeRO-3 gathers; 8-9: the
  // CP exchanges (exposed, issue to completion).
  double maxes[10] = {elapsed, rep.sync.exposed_s + rep.gather_s, rep.sync.comm_span_s, last_.p2p_wait_s,
                      last_.compute_s, static_cast<double>(backend_->peak_bytes()), rep.zero3.exposed_s,
                      rep.zero3.total_s, cps.exposed_s, cps.total_s};
  grid_->world().all_reduce(std::span<double>(maxes), ReduceOp::max).wait();

  consumed_ += plan.global_batch;
  ++iteration_;
  // A dataset shorter than the run wraps around: say so once per epoch.
  if (const int64_t n = data_->num_samples(T_); grid_->world().rank() == 0 && consumed_ / n > base / n)
    log::info("epoch {} of {} ended at iteration {} ({} samples of {} tokens per epoch); the next epoch "
              "starts", consumed_ / n, data_->describe(), iteration_, n, T_ + 1);
  IterationMetrics mt;
  mt.iteration = iteration_;
  mt.train_iters = cfg_.train_iters;
  mt.consumed_samples = consumed_;
  const double tokens = static_cast<double>(plan.global_batch) * T_;
  mt.tokens_per_s = tokens / maxes[0];
  mt.tflops = flops_per_token_ * tokens / maxes[0] / grid_->world().size() / 1e12;
  mt.lr = lr;
  mt.global_batch = plan.global_batch;
  mt.micro_batches = plan.num_micro_batches;  // the same on every rank: with uneven shares the most of any replica
  mt.loss = sums[0];
  mt.moe = moe_layers_ > 0;
  mt.moe_aux_loss = moe_layers_ > 0 ? sums[1] / moe_layers_ : 0.0;
  mt.grad_norm = rep.grad_norm;
  mt.skipped = rep.skipped_steps;
  set_max_times(mt, maxes);
  mt.zero3 = optimizer_->zero_level() == 3;
  mt.cp = cp_ != nullptr;
  step_s_sum_ += maxes[0];
  ++steps_run_;
  if (steps_run_ <= 3 && (steps_run_ == 3 || iteration_ == cfg_.train_iters)) report_memory();  // once
  mt.eta_s = step_s_sum_ / static_cast<double>(steps_run_) * static_cast<double>(std::max<int64_t>(0, cfg_.train_iters - iteration_));
  check_step(mt, rep, std::span<const double>(sums).subspan(2));
  watchdog_->progress();
  return mt;
}

void Trainer::fetch(Dataset& ds, int64_t start, int mbs, std::vector<int32_t>& x, std::vector<int32_t>& y) const {
  ds.batch(start, mbs, T_, x, y);
  if (!cp_) return;
  const CpZigzag z = cp_->zigzag(T_);
  cp_slice_rows(z, mbs, x);
  cp_slice_rows(z, mbs, y);
}

void Trainer::report_memory() {
  const int W = grid_->world().size(), me = grid_->world().rank();
  std::vector<double> v(3 * static_cast<size_t>(W), 0.0);  // per rank: measured, predicted, stage
  const auto at = [&](int r, int k) -> double& { return v[3 * static_cast<size_t>(r) + static_cast<size_t>(k)]; };
  at(me, 0) = static_cast<double>(backend_->peak_bytes());
  at(me, 1) = predicted_memory_.total();
  at(me, 2) = predicted_memory_.stage;
  grid_->world().all_reduce(std::span<double>(v), ReduceOp::sum).wait();
  if (me != 0) return;
  int far = 0;
  double lo = 1e300, hi = 0;
  for (int r = 0; r < W; ++r) {
    const double q = at(r, 0) / std::max(1.0, at(r, 1));
    lo = std::min(lo, q), hi = std::max(hi, q);
    if (std::abs(q - 1) > std::abs(at(far, 0) / std::max(1.0, at(far, 1)) - 1)) far = r;
  }
  const double MiB = 1 << 20;
  log::info("# memory: rank {} (pipeline stage {:.0f}) peak {:.2f} MiB measured, {:.2f} MiB predicted (the rank furthest from the model; "
            "measured / predicted {:.3f} to {:.3f} over {} ranks, allocator high-water mark after iteration {}); "
            "rank 0: {:.2f} MiB measured, predicted {}",
            far, at(far, 2), at(far, 0) / MiB, at(far, 1) / MiB, lo, hi, W, iteration_, at(0, 0) / MiB,
            describe_rank_memory(predicted_memory_));
}

void Trainer::check_step(IterationMetrics& mt, const StepReport& rep, std::span<const double> busy) {
  const bool r0 = grid_->world().rank() == 0;
  auto host_of = [&](int r) {
    const auto& h = grid_->hosts();
    return static_cast<size_t>(r) < h.size() ? h[static_cast<size_t>(r)] : std::string("?");
  };
  mt.step_skipped = rep.skipped;
  if (rep.overflow) {
    // fp16's loss scaler skipped the step (an overflow on some rank): its normal work, not a fault.
    if (r0) log::info("iteration {}: loss scale {} overflowed; the step was skipped on every rank, the scale is now {}",
                      mt.iteration, rep.loss_scale, optimizer_->loss_scale());
  } else if (rep.skipped) {
    ++consecutive_skips_;
    const NonFiniteGrad where =
        locate_nonfinite_grad(*store_, grid_->world(), optimizer_->presync_nonfinite());
    mt.nonfinite_rank = where.rank;
    mt.nonfinite_param = where.param;
    if (r0)
      log::warn("iteration {}: non-finite gradient norm ({}); the step was skipped on every rank. {}", mt.iteration,
                rep.grad_norm,
                where.rank < 0 ? std::string("No rank holds a non-finite gradient element after the sync")
                               : fmt::format("First non-finite gradient: rank {} (host {}), parameter '{}' element "
                                             "{}; ranks with non-finite gradients: [{}]",
                                             where.rank, host_of(where.rank),
                                             where.param, where.element, fmt::join(where.ranks, ",")));
    if (cfg_.max_skipped_iterations > 0 && consecutive_skips_ >= cfg_.max_skipped_iterations)
      TRIAX_THROW(Error,
                  "{} consecutive iterations ({} to {}) skipped for a non-finite gradient norm "
                  "(--max-skipped-iterations {}); the last one first appeared on rank {} in parameter '{}'",
                  consecutive_skips_, mt.iteration - consecutive_skips_ + 1, mt.iteration,
                  cfg_.max_skipped_iterations, where.rank, where.param.empty() ? "?" : where.param);
  } else {
    consecutive_skips_ = 0;
  }
  mt.loss_zscore = spikes_.update(mt.loss);
  mt.loss_spike = spikes_.spike(mt.loss_zscore);
  if (mt.loss_spike && r0)
    log::warn("iteration {}: loss spike: lm loss {:.6E} is {:.1f} standard deviations above the mean of the recent "
              "iterations (--loss-spike-zscore {})", mt.iteration, mt.loss, mt.loss_zscore, cfg_.loss_spike_zscore);
  const auto fresh = stragglers_.update(busy);
  mt.stragglers = stragglers_.stragglers();
  if (r0)
    for (int r : fresh)
      log::warn("iteration {}: straggler: rank {} (host {}) computed for {:.1f} ms per iteration, {:.2f}x the median "
                "{:.1f} ms of all ranks, for the last 3 iterations (--straggler-factor {})",
                mt.iteration, r, host_of(r), busy[static_cast<size_t>(r)] * 1e3,
                busy[static_cast<size_t>(r)] / stragglers_.last_median(), stragglers_.last_median() * 1e3,
                cfg_.straggler_factor);
  if (fresh.empty() || !r0) return;
  if (const auto slow = slow_device_class(busy, mt.stragglers, grid_->device_classes()))
    log::warn("iteration {}: device class '{}' ({}: all of its ranks) is persistently slow: {:.2f}x the other "
              "ranks' median compute time. The class is slower than this split assumes; re-plan with its speed "
              "(triax-plan --cluster FILE with the class's rates scaled by 1/{:.2f}, or its train_bench calibration) "
              "and give it less work: fewer --pipeline-layers on its stages, fewer --dp-microbatches for its "
              "replicas (docs/HETEROGENEOUS.md)",
              mt.iteration, slow->name, fmt::format("ranks {}", fmt::join(slow->ranks, ",")), slow->ratio, slow->ratio);
}

void Trainer::restore_progress(int64_t iteration, int64_t consumed_samples) {
  require(iteration >= 0 && consumed_samples >= 0, "restored iteration {} and consumed samples {} must be >= 0",
          iteration, consumed_samples);
  iteration_ = iteration;
  consumed_ = consumed_samples;
}

void Trainer::train(const std::function<void(const IterationMetrics&)>& on_iteration,
                    const std::function<void(const EvalMetrics&)>& on_eval,
                    const std::function<bool()>& should_stop) {
  if (!timeline_) timeline_ = std::make_unique<Timeline>(cfg_.profile_steps, cfg_.profile_dir);
  while (iteration_ < cfg_.train_iters) {
    timeline_->before_step(iteration_ + 1, *grid_);
    const auto m = step();
    // A stop request (should_stop) ends the window early: the file is written at the next check.
    timeline_->after_step(iteration_, iteration_ >= cfg_.train_iters, *grid_, *schedule_);
    trace::set_step(-1);  // evaluation and callbacks are not part of a step's bubble
    if (on_iteration) on_iteration(m);
    if (cfg_.eval_interval > 0 && iteration_ % cfg_.eval_interval == 0) {
      watchdog_->set_phase(fmt::format("evaluation after iteration {}", iteration_));
      const auto e = evaluate();
      watchdog_->progress();
      if (on_eval) on_eval(e);
    }
    if (should_stop && should_stop()) {
      timeline_->after_step(iteration_, true, *grid_, *schedule_);
      break;
    }
  }
}

}  // namespace triax
