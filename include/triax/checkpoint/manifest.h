// The on-disk description of one checkpoint (docs/CHECKPOINTS.md): manifest.json lists the
// training state's scalars, the model and layout it was written with, every file with its size
// and SHA-256, and every slice of every tensor (which file, where). Reading validates all of it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "triax/model/config.h"
#include "triax/params/param_store.h"

namespace triax {

// Version 1: f32 slices of TP-local tensors, one file per rank (docs/CHECKPOINTS.md). A reader
// refuses a manifest of a higher version.
inline constexpr int kCheckpointFormatVersion = 1;
// Every shard file starts with these 8 bytes.
inline constexpr std::string_view kCheckpointShardMagic = "TRIAXCK1";

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
  bool zero1 = false;
  std::string schedule;
  std::string loss_scaler = "none";  // fp32 training: no loss scaling state
  std::string config_toml;           // the run's resolved configuration
  std::vector<CheckpointFileInfo> files;
  std::vector<CheckpointSlice> slices;
};

std::string checkpoint_manifest_json(const CheckpointManifest& m);
// Parses and validates a manifest: JSON syntax, every field present with its type and range, a
// format version this build reads, a valid model, known split kinds, shapes that divide by the
// slice's tp size, slices inside their tensor and inside their file (by the listed size), files
// listed once. IoError naming `source` and the problem; never reads out of bounds.
CheckpointManifest parse_checkpoint_manifest(std::string_view json_text, const std::string& source);

// Reads a listed file of the checkpoint in `dir` and verifies its size, magic and SHA-256
// against the manifest: IoError naming the file and what is wrong (missing, truncated, hash).
std::vector<std::byte> read_checkpoint_file(const std::string& dir, const CheckpointFileInfo& f);
// Validates a shard file's bytes against its manifest entry (the checks above, without the file system).
void check_checkpoint_file(std::span<const std::byte> bytes, const CheckpointFileInfo& f, const std::string& where);

// The values of slice s from its file's bytes (validated by check_checkpoint_file).
std::vector<float> checkpoint_slice_values(std::span<const std::byte> file_bytes, const CheckpointSlice& s);

// Numbered checkpoint directories "iter_0000042" under dir that hold a manifest.json, newest
// first (incomplete "*.tmp" directories are not listed). Empty when dir does not exist.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir);
std::string checkpoint_dir_name(int64_t iteration);  // "iter_0000042"

}  // namespace triax
