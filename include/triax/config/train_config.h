// The training configuration in one place: TrainConfig (typed values, std::optional where "not
// given" differs from a value), the table of its options (flag = TOML key, section, help, valid
// range), reading a command line and a TOML file, range checks, and printing it back as a
// sectioned --config file.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "triax/core/enum_names.h"
#include "triax/core/error.h"
#include "triax/model/config.h"
#include "triax/model/gpt.h"
#include "triax/model/moe.h"
#include "triax/ops/adamw.h"
#include "triax/optim/lr_schedule.h"
#include "triax/pipeline/schedule.h"
#include "triax/config/batch.h"

namespace triax {

// Where the step runs (backend/backend.h): "cpu" (the reference), "cpu-checked" (buffers
// mapped PROT_NONE outside the backend's own calls: proves no code outside the backend touches them),
// "cpu-emulated" (backend/emulated_backend.h: the CPU in the compute type of --bf16/--fp16, the
// CUDA backend's buffer types checked at every op), or "cuda" (cuda/cuda_backend.h: one GPU per
// rank, device = local rank; CUDA builds only).
enum class BackendKind { cpu, cpu_checked, cpu_emulated, cuda };
template <>
struct EnumNames<BackendKind> {
  static constexpr std::string_view what = "backend";
  static constexpr std::array<EnumName<BackendKind>, 4> table{{{"cpu", BackendKind::cpu},
                                                                  {"cpu-checked", BackendKind::cpu_checked},
                                                                  {"cpu-emulated", BackendKind::cpu_emulated},
                                                                  {"cuda", BackendKind::cuda}}};
};

// One entry of --dp-microbatches: a DP replica's micro-batches per step ("6,2": device_class empty,
// one entry per replica in order) or a device class's ("fast=6,slow=2": every replica of that class).
struct DpShare {
  std::string device_class;
  int64_t count = 0;
  bool operator==(const DpShare&) const = default;
};

struct TrainConfig {
  // Model: a preset, optionally overridden shape by shape (unset = keep the preset's value).
  std::string model = "tiny";
  std::optional<int> layers, heads, hidden, ffn, vocab, max_seq;
  std::optional<int> seq;  // sequence length of a sample; unset = the model's max_seq
  // The block's choices in Megatron's flags (unset = the preset's; docs/LLAMA.md): the norm, its
  // epsilon, the SwiGLU MLP, the position embedding, RoPE's base and Llama 3.1 scaling (factor;
  // low 1, high 4, original context 8192 as Megatron), grouped-query attention (num_query_groups
  // only together with group_query_attention), an untied LM head, and no linear biases.
  std::optional<Norm> normalization;
  std::optional<double> norm_epsilon;
  std::optional<bool> swiglu;
  std::optional<PositionEmbedding> position_embedding;
  std::optional<double> rotary_base;
  std::optional<bool> use_rope_scaling;
  std::optional<double> rope_scaling_factor;
  std::optional<bool> group_query_attention;
  std::optional<int> num_query_groups;
  std::optional<bool> untie_embeddings;
  std::optional<bool> disable_bias_linear;
  // Layout.
  int tp = 1, pp = 1;
  // --tp 2,1 / --pp 2,1: sizes in order of preference (empty: tp / pp only). resolve_train_config
  // takes the first (tp, pp) pair, tp's list outermost, whose layout fits the world and the model;
  // tp and pp hold the first of each list until then, the chosen pair after (docs/FAULTS.md).
  std::vector<int> tp_choices, pp_choices;
  std::optional<int> dp;  // unset: world / (tp * cp * pp)
  // Context parallelism (docs/CONTEXT_PARALLEL.md): each sequence split over cp ranks (zigzag chunks),
  // attention by ring exchange of K/V ("p2p") or one all-gather of K/V per layer ("allgather").
  int cp = 1;
  std::string cp_comm_type = "p2p";
  int vpp = 1;            // virtual chunks per stage (interleaved schedule)
  std::string order = "tp-dp-pp";
  bool allow_tp_across_hosts = false;
  std::vector<int> pipeline_layers;  // explicit layers per stage (uneven split, vpp = 1)
  // Heterogeneous clusters (docs/HETEROGENEOUS.md): uneven data-parallel shares, micro-batches per
  // replica or per device class (TRIAX_DEVICE_CLASS; empty: every replica runs as many), and the
  // device class each pipeline stage runs on (checked against the ranks' classes; empty: any).
  std::vector<DpShare> dp_microbatches;
  std::vector<std::string> stage_classes;
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  // Batch knobs: any two of these (micro-batch alone: one micro-batch per step; none: 4 x 2pp).
  std::optional<int64_t> micro_batch, global_batch, num_micro_batches;
  std::optional<BatchRampup> rampup;
  int64_t train_iters = 50;
  uint64_t seed = 1234;
  // Optimizer.
  double lr = 3e-3, min_lr = 0.0;
  int64_t warmup_iters = 0;
  std::optional<int64_t> decay_iters;  // unset: train_iters
  LrDecay lr_decay = LrDecay::cosine;
  AdamWConfig adamw;
  double clip_grad = 1.0;  // 0: off
  // ZeRO level (docs/OPTIM.md): 0 none, 1 optimizer state, 2 + gradients, 3 + parameters sharded over
  // dp (--zero1 is --zero 1). zero_shard_size: HSDP, shard inside groups of this many DP ranks (0: all).
  int zero = 0;
  int zero_shard_size = 0;
  // ZeRO-3: gather the next unit while this one computes (--no-zero-prefetch: every gather blocks,
  // the baseline of the overlap figure).
  bool zero_prefetch = true;
  double bucket_mb = 16.0;
  bool overlap_grad_reduce = true;
  Recompute recompute = Recompute::none;
  bool sequence_parallel = false;
  // Mixture of experts (docs/MOE.md): layer l is MoE when moe_every > 0 and (l + 1) % moe_every == 0.
  int moe_every = 0;
  int experts = 8;
  int topk = 2;
  double capacity_factor = 1.25;
  bool no_drop = false;
  double moe_aux_coef = 0.01;
  int moe_chunks = 1;
  int ep = 1;  // expert-parallel size, carved from dp
  // Data: "" or "synthetic" (built in), llm.c shards "a.bin,b.bin" or a glob "train_*.bin", a
  // Megatron indexed dataset (PREFIX, PREFIX.bin or PREFIX.idx), or a text file (docs/DATA.md).
  std::string data;
  bool data_shuffle = true;       // seeded per-epoch shuffle of the training samples
  bool data_respect_eod = false;  // samples inside documents (Megatron format)
  // Validation: every eval_interval iterations (0: never), eval_iters batches of the global
  // batch size from valid_data, in file order from its first sample.
  std::string valid_data;
  int64_t eval_interval = 0;
  int64_t eval_iters = 10;
  std::string metrics_jsonl;
  std::string backend = "cpu";  // a name of BackendKind
  // Mixed precision (Megatron's flags; fp32 when neither): activations and the compute copy of the
  // weights in bfloat16 or float16; master weights, gradients and Adam moments stay float32
  // (docs/CUDA.md). Mutually exclusive; the CPU backends compute in float32 only and refuse both.
  bool bf16 = false;
  bool fp16 = false;
  // Faults (docs/FAULTS.md): the watchdog's stall timeout in seconds (0: off), the consecutive
  // skipped (non-finite) iterations that end the run (0: never), the factor over the median
  // compute time that marks a straggler, and the z-score of a loss spike (0: off).
  double stall_timeout = 0;
  int64_t max_skipped_iterations = 0;
  double straggler_factor = 1.2;
  double loss_spike_zscore = 5.0;
  // Prometheus (docs/CLUSTER.md): rank 0 serves /metrics on metrics_port (0: any free port) at
  // metrics_bind, and/or rewrites metrics_textfile atomically after each iteration; metrics_linger
  // keeps the endpoint up that many seconds after the last iteration.
  std::optional<int> metrics_port;
  std::string metrics_bind = "0.0.0.0";
  std::string metrics_textfile;
  double metrics_linger = 0;
  // Timeline (docs/OBSERVE.md): iterations A..B ("A:B", 1-based, inclusive; "" off) recorded per rank
  // into profile_dir/trace_rank{R}.json and merged by rank 0 into profile_dir/trace.json.
  std::string profile_steps;
  std::string profile_dir;
  // Checkpoints (docs/CHECKPOINTS.md): save the whole training state under `save` every
  // save_interval iterations (0: only at the end and on SIGTERM/SIGUSR1), keeping the newest
  // keep_last (0: all); resume from the newest complete checkpoint under `load`; start from
  // pretrained weights (HF safetensors or llm.c .bin); export the trained model for HF.
  std::string save;
  int64_t save_interval = 0;
  double save_interval_minutes = 0;  // also save once this much wall time passed since the last save (0: off)
  int keep_last = 2;
  std::string load;
  std::string init_from;
  std::string export_hf;
};

// One value as it arrives: the text of a flag's arguments (one or more words), or a TOML node
// (passed opaquely so that this header does not include toml++).
struct OptionInput {
  std::vector<std::string> words;  // command line
  const void* toml_node = nullptr; // toml::node*, from a --config file
  std::string where;               // "--train-iters" or "run.toml:3: key 'train-iters'"
};

// The sections of a --config file, in the order they are printed (docs/TRAINING.md lists what
// each holds). Every option belongs to exactly one.
enum class ConfigSection { model, parallel, training, optimizer, data, checkpoint, metrics, faults };
template <>
struct EnumNames<ConfigSection> {
  static constexpr std::string_view what = "config section";
  static constexpr std::array<EnumName<ConfigSection>, 8> table{{{"model", ConfigSection::model},
                                                                 {"parallel", ConfigSection::parallel},
                                                                 {"training", ConfigSection::training},
                                                                 {"optimizer", ConfigSection::optimizer},
                                                                 {"data", ConfigSection::data},
                                                                 {"checkpoint", ConfigSection::checkpoint},
                                                                 {"metrics", ConfigSection::metrics},
                                                                 {"faults", ConfigSection::faults}}};
};

// An option of TrainConfig. Adding a flag is one call in train_options() (src/config/train_config.cpp):
// its key is both the command-line flag (--key) and the TOML key inside [section].
struct ConfigOption {
  std::string key;    // "micro-batch-size"
  ConfigSection section = ConfigSection::training;
  std::string help;   // one line for --help
  std::string range;  // what is valid, for messages: "an integer >= 1"
  int arity = 1;      // command-line words after the flag: 0 (a switch), 1, or 3
  std::function<void(TrainConfig&, const OptionInput&)> set;  // parse + check range; ConfigError naming `where`
  std::function<std::string(const TrainConfig&)> check;       // "" or why the current value is out of range
  std::function<std::optional<std::string>(const TrainConfig&)> toml;  // TOML literal; nullopt when not given
  // Another spelling of an option (--zero1 = --zero 1): accepted in flags and files, never printed.
  std::string alias_of;
};

const std::vector<ConfigOption>& train_options();
const ConfigOption* find_train_option(std::string_view key);
// The nearest known key to a misspelled one ("train_iters" -> "train-iters"), or "".
std::string nearest_train_option(std::string_view key);

// Applies a TOML file of `key = value` lines (keys as the flags, without "--"), each inside its
// section ([parallel] tp = 2) or, as files written before sections, at the top level. An unknown
// section or key, a key in another option's section, an option given twice, a nested table, a
// malformed file or a value of the wrong type or range is a ConfigError naming the file, the
// line and the key (with the nearest valid key for a typo, and the right section).
void apply_config_file(TrainConfig& cfg, const std::string& path);
void apply_config_text(TrainConfig& cfg, std::string_view text, const std::string& source_name);

// The command line of a trainer: --config FILE is read first, then every other flag overrides
// it. `extra` lists keys the program handles itself (returned in `extra_values`, not applied).
struct CommandLine {
  TrainConfig cfg;
  bool help = false;          // --help / -h was given: print help_text and exit 0
  std::string help_text;
  std::vector<std::pair<std::string, std::string>> extra_values;
};
CommandLine parse_train_command_line(int argc, const char* const* argv, std::string_view program,
                                     std::string_view description);

// Range checks of every option (what a config file or flag is checked against on the way in),
// for configurations built in code. ConfigError with the valid range.
void check_ranges(const TrainConfig& cfg);

// Every option as `key = value` lines under its [section] header, which apply_config_text reads
// back to the same TrainConfig (options not given are left out; so are sections left empty).
// comment(key), when not empty, is appended as "  # ...".
std::string to_toml(const TrainConfig& cfg,
                    const std::function<std::string(std::string_view key)>& comment = nullptr);

// The whole configuration resolved for a world size: presets applied, dp, seq and the batch
// derived, layers split over stages, the MoE and learning-rate settings built, everything
// cross-checked. `explicit_cfg` has every derived optional filled in, so printed with to_toml it
// reproduces the run. The Trainer builds from this alone.
struct ResolvedTrainConfig {
  TrainConfig explicit_cfg;
  GptConfig model;
  int dp = 1;
  int seq = 0;
  BatchPlan batch;
  std::vector<int> stage_layers;  // per virtual stage
  int moe_layers = 0;             // layers that are MoE (0: a dense model; moe is then unused)
  MoeConfig moe;
  LrScheduleConfig lr;
  // The backend's compute type: f32, or bf16 / f16 from --bf16 / --fp16 (CudaBackendOptions::compute).
  DType compute = DType::f32;
  // Every world rank's device class (TRIAX_DEVICE_CLASS; "default" for all when not given).
  std::vector<std::string> rank_classes;
};
// rank_classes: every world rank's device class (gather_device_classes); empty: all "default". Needed
// by --dp-microbatches per class and --stage-classes (config/hetero.h).
// hosts: every world rank's host name, or empty; given, a tp group spanning hosts is refused (unless
// --allow-tp-across-hosts) while resolving, so that a list of --tp sizes moves on to the next.
ResolvedTrainConfig resolve_train_config(const TrainConfig& cfg, int world_size,
                                         std::vector<std::string> rank_classes = {},
                                         const std::vector<std::string>& hosts = {});
// --profile-steps "A:B" as (A, B), nullopt for ""; ConfigError naming the text otherwise.
std::optional<std::pair<int64_t, int64_t>> parse_profile_steps(const std::string& text);

}  // namespace triax
