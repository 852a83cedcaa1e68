// A small complete checkpoint held in memory for the manifest tests: tp 2 (two shard files), a
// rows-split tensor "w" (4, 3) (tp rank 0 writes it in two runs, as ZeRO-1 does) and a replicated
// "b" (3) (tp rank 0 only), every kind, non-zero values; iteration 7 at global batch 8. And
// load_sample(): what a resume would take from a manifest text, or nullopt where it refuses it.
#pragma once
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "triax/checkpoint/manifest.h"
#include "triax/core/error.h"
#include "triax/io/sha256.h"
#include "triax/model/param_shards.h"

namespace triax::test {

struct ManifestSample {
  CheckpointManifest m;
  std::map<std::string, std::vector<std::byte>> files;  // name -> bytes
};

inline ManifestSample manifest_sample() {
  ManifestSample s;
  CheckpointManifest& m = s.m;
  m.model.n_layer = 2, m.model.n_head = 2, m.model.n_embd = 8, m.model.vocab = 10, m.model.max_seq = 16;
  m.iteration = 7, m.consumed_samples = 56, m.applied_steps = 6, m.skipped_steps = 1, m.seed = 99, m.seq = 8;
  m.tp = 2, m.schedule = "1f1b";
  m.batch = CheckpointBatch{8, 2, 4, std::nullopt, 0, 0};
  float next = 0.25f;
  // rank, tensor, shape, split, runs [begin, end) of the local tensor
  const std::tuple<int, const char*, std::vector<int64_t>, TpSplit, std::vector<std::pair<int64_t, int64_t>>> writes[] = {
      {0, "w", {4, 3}, TpSplit::rows, {{0, 4}, {4, 6}}},
      {0, "b", {3}, TpSplit::none, {{0, 3}}},
      {1, "w", {4, 3}, TpSplit::rows, {{0, 6}}}};
  for (int rank = 0; rank < 2; ++rank) {
    const std::string file = checkpoint_shard_name(rank);
    auto& bytes = s.files[file];
    bytes.resize(kCheckpointShardMagic.size());
    std::memcpy(bytes.data(), kCheckpointShardMagic.data(), kCheckpointShardMagic.size());
    for (const auto& [r, name, shape, split, runs] : writes) {
      if (r != rank) continue;
      for (const auto& [b, e] : runs)
        for (const StateKind k : {StateKind::param, StateKind::exp_avg, StateKind::exp_avg_sq}) {
          m.slices.push_back({name, k, shape, split, split == TpSplit::none ? 0 : rank, 2, b, e, file, bytes.size()});
          for (int64_t i = b; i < e; ++i, next += 1.0f) {
            const auto* p = reinterpret_cast<const std::byte*>(&next);
            bytes.insert(bytes.end(), p, p + 4);
          }
        }
    }
    m.files.push_back({file, bytes.size(), io::sha256_hex(bytes)});
  }
  return s;
}

// What a resume takes from a checkpoint: the scalars, the batch settings it adopts and carries
// on, and every tensor of every kind at its full shape.
struct SampleState {
  std::tuple<int64_t, int64_t, int64_t, int64_t> progress;  // iteration, consumed, applied, skipped
  std::tuple<int64_t, int64_t, bool, int64_t, int64_t> batch;  // global, micro, ramp?, since it., since consumed
  std::map<std::pair<std::string, int>, std::vector<float>> tensors;
  bool operator==(const SampleState&) const = default;
};

// The resume path on a manifest text against the sample's files and run (model, seed, seq, the
// tensor shapes of its model): nullopt where an IoError refuses it (any other exception escapes).
inline std::optional<SampleState> load_sample(const std::string& text, const ManifestSample& s) {
  try {
    const CheckpointManifest m = parse_checkpoint_manifest(text, "m.json");
    check_checkpoint_matches_run(m, s.m.model, s.m.seed, s.m.seq, "m.json");
    SampleState st;
    st.progress = {m.iteration, m.consumed_samples, m.applied_steps, m.skipped_steps};
    if (m.batch)
      st.batch = {m.batch->global_batch, m.batch->micro_batch, m.batch->rampup.has_value(), m.batch->since_iteration,
                  m.batch->since_consumed_samples};
    for (const auto& f : m.files) {
      auto it = s.files.find(f.name);
      if (it == s.files.end()) return std::nullopt;  // a missing file
      check_checkpoint_file(it->second, f, f.name);
    }
    const std::map<std::string, std::vector<int64_t>> want = {{"w", {4, 3}}, {"b", {3}}};  // the run's model
    for (const auto& [name, shape] : want)
      for (const StateKind k : {StateKind::param, StateKind::exp_avg, StateKind::exp_avg_sq}) {
        const CheckpointSlice* first = nullptr;
        for (const auto& sl : m.slices)
          if (sl.name == name && sl.kind == k) first = first ? first : &sl;
        if (!first || first->full_shape != shape) return std::nullopt;  // read_state refuses these
        int64_t n = 1;
        for (auto d : shape) n *= d;
        std::vector<float> full(static_cast<size_t>(n));
        const int ranks = first->split == TpSplit::none ? 1 : first->tp_size;
        for (int r = 0; r < ranks; ++r) {
          std::vector<float> local(full.size() / static_cast<size_t>(first->split == TpSplit::none ? 1 : ranks));
          for (const auto& sl : m.slices)
            if (sl.name == name && sl.kind == k && sl.tp_rank == r) {
              const auto v = checkpoint_slice_values(s.files.at(sl.file), sl);
              std::copy(v.begin(), v.end(), local.begin() + sl.begin);
            }
          if (first->split == TpSplit::none) full = local;
          else place_shard(local, full, shape, first->split, r, ranks);
        }
        st.tensors[{name, static_cast<int>(k)}] = std::move(full);
      }
    return st;
  } catch (const IoError&) {
    return std::nullopt;
  }
}

}  // namespace triax::test
