// The on-disk description of one checkpoint (docs/CHECKPOINTS.md): manifest.json lists the
// training state's scalars, the model, layout and batch it was written with, every file with its
// size and SHA-256, and every slice of every tensor (which file, where); manifest.sha256 holds the
// manifest's own SHA-256. Reading validates all of it, structure included.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "triax/config/batch.h"
#include "triax/model/config.h"
#include "triax/params/param_store.h"

namespace triax {

// Version 3: f32 slices of TP-local tensors, one file per rank, the batch settings, the manifest's
// digest in manifest.sha256, and the model's block (norm, MLP, positions, key/value heads, biases;
// docs/CHECKPOINTS.md). Version 2 (no block: GPT-2's) and version 1 (no batch, no digest, with a
// warning) are still read. A reader refuses a manifest of a higher version.
inline constexpr int kCheckpointFormatVersion = 3;
// Every shard file starts with these 8 bytes.
inline constexpr std::string_view kCheckpointShardMagic = "TRIAXCK1";
inline constexpr std::string_view kManifestName = "manifest.json";
inline constexpr std::string_view kManifestDigestName = "manifest.sha256";

// What a slice holds: the parameter or one of AdamW's moments of it.
enum class StateKind { param = 0, exp_avg = 1, exp_avg_sq = 2 };
std::string_view state_kind_name(StateKind k);

// Elements [begin, end) of the row-major TP-local tensor that tp rank tp_rank of tp_size holds
// of `name` (full shape full_shape, split `split`), stored as f32 at byte `offset` of `file`.
struct CheckpointSlice {
  std::string name;
  StateKind kind = StateKind::param;
  std::vector<int64_t> full_shape;
  TpSplit split = TpSplit::none;
  int tp_rank = 0, tp_size = 1;
  int64_t begin = 0, end = 0;
  std::string file;
  uint64_t offset = 0;
};

struct CheckpointFileInfo {
  std::string name;  // relative to the checkpoint directory
  uint64_t bytes = 0;
  std::string sha256;
};

// The batch settings of the run that wrote the checkpoint (version 2): what a resume adopts
// unless its command line gives others. The global batch of every step since since_iteration
// followed from global_batch and rampup, which makes consumed_samples checkable.
struct CheckpointBatch {
  int64_t global_batch = 0, micro_batch = 0, num_micro_batches = 0;  // the target (after any ramp)
  std::optional<BatchRampup> rampup;
  int64_t since_iteration = 0, since_consumed_samples = 0;  // where these settings began
  // Uneven data-parallel shares (--dp-microbatches): micro-batches of each DP replica, summing to
  // global_batch / micro_batch (num_micro_batches is then the most of any replica); empty: even.
  std::vector<int64_t> dp_microbatches;
};

struct CheckpointManifest {
  int format_version = kCheckpointFormatVersion;
  // Training progress: with the seed these fix the LR schedule, the batch ramp-up, the data
  // position (the sample order is a pure function of seed, epoch and index) and Adam's step.
  int64_t iteration = 0, consumed_samples = 0, applied_steps = 0, skipped_steps = 0;
  uint64_t seed = 0;
  int seq = 0;
  GptConfig model;
  // The layout it was written with (information; any layout the model allows can load it).
  int tp = 1, pp = 1, dp = 1, vpp = 1;
  int cp = 1;  // context parallel (absent before it existed: 1); weights do not depend on it
  // The ZeRO level (0..3; layout.zero). layout.zero1 is written as zero >= 1 (the optimizer state
  // was sharded) for readers that predate the level; a manifest without "zero" (written before
  // ZeRO-2/3) reads as level 1 or 0 from zero1. Neither constrains the loading run's level.
  int zero = 0;
  bool zero1 = false;
  std::string schedule;
  std::string loss_scaler = "none";  // fp32 training: no loss scaling state
  std::string config_toml;           // the run's resolved configuration
  std::optional<CheckpointBatch> batch;  // absent in version 1
  std::vector<CheckpointFileInfo> files;
  std::vector<CheckpointSlice> slices;
};

// The whole of a checkpoint's small text file (a manifest, its digest, a rank's part). IoError naming it.
std::string read_checkpoint_text(const std::string& path);

// "rank_00003.bin": the shard file rank r writes.
std::string checkpoint_shard_name(int rank);

std::string checkpoint_manifest_json(const CheckpointManifest& m);
// Parses and validates a manifest: JSON syntax, every field present with its type and range, a
// format version this build reads, a valid model, known split kinds, shapes that divide by the
// slice's tp size, and the structure (check_checkpoint_manifest_structure). IoError naming
// `source` and the problem; never reads out of bounds.
CheckpointManifest parse_checkpoint_manifest(std::string_view json_text, const std::string& source);
// The same checks without the structure of the whole checkpoint: one rank's part (rank_r.json,
// its own file and slices) that rank 0 merges during a save.
CheckpointManifest parse_checkpoint_part(std::string_view json_text, const std::string& source);
// The structure of a parsed manifest: one file per rank of the layout; slices 4-byte aligned
// (F32) that tile each file from the magic to its last byte, without gap or overlap; for every
// tensor and kind, each tp rank's elements covered exactly once, with one shape, split and tp
// size; applied + skipped steps = iteration; consumed samples consistent with the iteration and
// the batch settings. IoError naming `source` and the first problem.
void check_checkpoint_manifest_structure(const CheckpointManifest& m, const std::string& source);

// The text of manifest.sha256 for a manifest's bytes: "<64 hex>  manifest.json\n" (the format of
// `sha256sum`, so `sha256sum -c manifest.sha256` checks it by hand).
std::string checkpoint_manifest_digest(std::string_view manifest_text);
// IoError naming `where` unless digest_text is a well-formed manifest.sha256 matching manifest_text.
void check_checkpoint_manifest_digest(std::string_view manifest_text, std::string_view digest_text,
                                      const std::string& where);

// The manifest of checkpoint directory `dir`: manifest.json checked against manifest.sha256, then
// parsed and validated; its iteration must equal dir_iteration (from the directory's name) when
// that is >= 0. A version-1 manifest without manifest.sha256 (written before the digest existed)
// is accepted with *digest_checked = false; any other missing or mismatching digest is an IoError.
CheckpointManifest read_checkpoint_manifest(const std::string& dir, int64_t dir_iteration,
                                            bool* digest_checked = nullptr);

// IoError unless the checkpoint was written by a run of this model, seed and sequence length
// (what the data order, position and every tensor's shape depend on). `where` names it.
void check_checkpoint_matches_run(const CheckpointManifest& m, const GptConfig& model, uint64_t seed, int seq,
                                  const std::string& where);

// Reads a listed file of the checkpoint in `dir` and verifies its size, magic and SHA-256
// against the manifest: IoError naming the file and what is wrong (missing, truncated, hash).
std::vector<std::byte> read_checkpoint_file(const std::string& dir, const CheckpointFileInfo& f);
// Validates a shard file's bytes against its manifest entry (the checks above, without the file system).
void check_checkpoint_file(std::span<const std::byte> bytes, const CheckpointFileInfo& f, const std::string& where);

// The values of slice s from its file's bytes (validated by check_checkpoint_file).
std::vector<float> checkpoint_slice_values(std::span<const std::byte> file_bytes, const CheckpointSlice& s);

// Numbered checkpoint directories "iter_0000042" (7 digits or more: "iter_10000000") under dir
// that hold a manifest.json, newest first. Only names checkpoint_dir_name writes are listed
// (not "iter_42", "iter_0000007.tmp" or a checkpoint set aside as "iter_0000007.refused"). Empty
// when dir does not exist.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir);
// What --load PATH names: PATH itself when it is one complete checkpoint directory (iter_N/ with
// its manifest: exactly that one, no fallback), else list_checkpoints(PATH).
std::vector<std::pair<int64_t, std::string>> checkpoints_to_load(const std::string& path);
std::string checkpoint_dir_name(int64_t iteration);  // "iter_0000042", "iter_10000000"

}  // namespace triax
