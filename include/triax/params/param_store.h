// ParamStore: every parameter of one pipeline stage lives in one flat buffer of master weights
// (fp32; fp64 on a CPU backend built for gradient checks) in a Backend's storage, with its gradient
// at the same offset of a second flat buffer (parameter gradients keep their own type whatever the
// activations are). Flat buffers are what DP buckets, ZeRO-1 shards and the fused AdamW walk;
// named views (Tensor slices) are what layers hand to the backend.
//
// Mixed precision: when the backend computes in another type than the masters (bf16/fp16 on the
// CUDA backend), a third flat buffer, the compute copy, holds the weights in the compute type at
// the same offsets; layers read weight_t(i), the optimizer updates param_t(i) and rounds into the
// copy in the same pass. Without one (fp32 compute), weight_t(i) is param_t(i): no copy, no cost.
// finalize(pad_to, force_compute_copy = true) makes a copy of the masters' own type, which the CPU
// tests use to prove the copy is kept current (training with it equals training without it).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "triax/backend/backend.h"
#include "triax/core/error.h"

namespace triax {

// How a parameter's full tensor is split over the tensor-parallel group.
enum class TpSplit {
  none,    // replicated on every TP rank (LayerNorm, row-parallel bias, position embedding)
  rows,    // dim 0 split (column-parallel weight (out/tp, in) and its bias, vocab-parallel embedding)
  cols,    // dim 1 split (row-parallel weight (out, in/tp))
  qkv_rows // fused QKV (3C, C): each of Q, K, V split by heads along dim 0
};

struct ParamSpec {
  std::string name;                 // HF-style: "h.3.attn.c_attn.weight"
  std::vector<int64_t> full_shape;  // before TP sharding
  TpSplit split = TpSplit::none;
  bool weight_decay = true;         // false for biases and LayerNorm
  // Counted once in the global gradient norm: false on the copies that another rank also
  // holds (TP-replicated params on tp rank > 0, the tied embedding on the last stage).
  bool norm_owner = true;
  // An expert of a MoE layer (model/moe.h): held by one rank of each expert-parallel group, so
  // its gradient is reduced over the expert-data-parallel group (dp / ep ranks) instead of DP,
  // and counted in the gradient norm by the first such group (docs/MOE.md).
  bool expert = false;
};

// A run of this rank's ZeRO shard that lies inside one parameter: shard elements
// [shard_offset, shard_offset + count) are flat elements [flat_offset, flat_offset + count).
// Padding elements belong to no segment.
struct ShardSegment {
  size_t shard_offset = 0;
  size_t flat_offset = 0;
  size_t count = 0;
  size_t param = 0;
};

// ZeRO-2/3 (docs/OPTIM.md): how finalize_sharded lays the flat buffers out and what this rank holds.
struct ShardSpec {
  int level = 2;                          // 2: gradients and optimizer state sharded; 3: parameters too
  int group = 1, rank = 0;                // the shard group (dp, or --zero-shard-size DP ranks) and this rank in it
  int expert_group = 1, expert_rank = 0;  // MoE experts' shard group (expert-DP) and this rank in it
  bool force_compute_copy = false;        // as finalize()'s (level 2; level 3 gathers into the compute type)
};

// A unit: the parameters [first, first + count) that ZeRO-3 gathers together (one transformer layer,
// the embedding, the head) and ZeRO-2/3 reduce-scatter together. Declared by begin_unit(); a unit
// also ends where ParamSpec::expert changes (experts shard over their own group). Its flat range
// [begin, end) is padded to a multiple of its group; this rank owns piece `rank` of it, stored at
// shard_offset of the rank's shard. Without finalize_sharded, group is 1 and nothing is padded.
struct ParamUnit {
  std::string name;
  size_t first = 0, count = 0;
  size_t begin = 0, end = 0;
  bool expert = false;
  int group = 1, rank = 0;
  size_t shard_offset = 0;
  size_t size() const { return end - begin; }
  size_t piece() const { return size() / static_cast<size_t>(group); }
  size_t piece_begin() const { return begin + static_cast<size_t>(rank) * piece(); }
};

// What serves a sharded store's weight and gradient views (the ZeRO-2/3 engine, optim/zero_sharding.h):
// flat ranges inside one unit, valid until the provider evicts (weights) or reduces (gradients) that
// unit's buffer; views keep their storage alive, so a stale view is never a dangling one.
class ParamProvider {
 public:
  virtual ~ParamProvider() = default;
  virtual Tensor weights(size_t begin, size_t end) = 0;  // ZeRO-3 only: the unit gathered
  virtual Tensor grads(size_t begin, size_t end) = 0;    // the unit's gradient buffer of this backward
  virtual void zero_grads() = 0;                         // a new step: the gradient shard to zero
  virtual void weights_changed() = 0;                    // masters written: gathered units are stale
};

struct ParamInfo {
  ParamSpec spec;
  std::vector<int64_t> local_shape;  // after TP sharding
  size_t offset = 0;                 // in the flat buffers (elements)
  size_t numel = 0;
};

class ParamStore {
 public:
  // Parameters in be's storage; be must outlive the store.
  explicit ParamStore(Backend& be);
  // A store with a private plain CPU backend (tests, tools).
  ParamStore();
  ~ParamStore();
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;
  // Movable: the buffers, and a private backend, move with it (a given backend stays where it is).
  ParamStore(ParamStore&&) noexcept = default;
  ParamStore& operator=(ParamStore&&) noexcept = default;

  Backend& backend() const { return *be_; }
  // The element type of the master weights and gradients (float32, or float64 on a float64 CPU backend).
  DType dtype() const { return dtype_; }

  // Registers a parameter; returns its index. Offsets follow registration order.
  size_t add(ParamSpec spec, std::vector<int64_t> local_shape);
  // Starts a new unit (ParamUnit) at the next add(): models call it per layer, embedding and head.
  void begin_unit(std::string name);
  // Allocates the flat buffers (zero-filled), padding the total to a multiple of pad_to (ZeRO-1
  // needs a multiple of dp), and the compute copy when the backend's compute type differs from
  // dtype() or force_compute_copy is set. Call once, after every add().
  void finalize(size_t pad_to = 1, bool force_compute_copy = false);
  bool finalized() const { return finalized_; }
  // ZeRO-2/3: every unit padded to a multiple of its group; this rank's shard is its pieces in unit
  // order (shard_size() elements; shard_segments()). Level 2: masters and weights whole, no flat
  // gradient buffer (the provider serves gradients per unit). Level 3: params_t() is the master
  // SHARD (shard_size() elements, flat element x of a piece at its shard offset), no flat weights:
  // the provider gathers units. Call instead of finalize(), then set_provider() before any view.
  void finalize_sharded(const ShardSpec& spec);
  int zero_level() const { return spec_.level; }  // 0 unless finalize_sharded
  const ShardSpec& shard_spec() const { return spec_; }
  const std::vector<ParamUnit>& units() const { return units_; }
  size_t unit_of(size_t param) const { return unit_of_.at(param); }
  const std::vector<ShardSegment>& shard_segments() const { return segments_; }
  size_t shard_size() const { return shard_size_; }
  void set_provider(ParamProvider* p) { provider_ = p; }
  ParamProvider* provider() const { return provider_; }
  // Whether views move between calls (a sharded store): models must not cache them.
  bool views_move() const { return spec_.level >= 2; }
  // Whether a separate compute copy exists, and its element type (dtype() when none).
  bool has_compute_copy() const { return weights_.defined() && weights_.raw_data() != params_.raw_data(); }
  DType compute_dtype() const { return compute_dtype_; }

  size_t size() const { return infos_.size(); }
  const ParamInfo& info(size_t i) const { return infos_.at(i); }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  size_t find(const std::string& name) const;  // throws ConfigError naming the missing parameter

  // Backend views: what the model and the optimizer hand to backend ops and communicators.
  // weight_t: the weights layers compute with (the compute copy, or the master itself when there
  // is none); param_t: the fp32 master that AdamW updates, checkpoints save and files load.
  Tensor weight_t(size_t i) const;
  Tensor weights_t() const { return weights_; }  // (padded_numel), the compute copy or params_t()
  Tensor param_t(size_t i) const;
  Tensor grad_t(size_t i) const;
  Tensor params_t() const { return params_; }  // (padded_numel)
  Tensor grads_t() const { return grads_; }
  Tensor grads_range(size_t begin, size_t end) const;  // [begin, end) of the flat gradients
  // Parameters [first, first + count) as one view (adjacent: a fused weight), compute weights or gradients.
  Tensor weights_of(size_t first, size_t count) const;
  Tensor grads_of(size_t first, size_t count) const;

  // Host values of one parameter's master weights: copies, for any backend.
  std::vector<float> param_to_host(size_t i) const;
  // Elements [begin, end) of parameter i as float32 into dst (dst.size() == 4 (end - begin) bytes,
  // any alignment): checkpoints copy into their reused staging buffer with no temporary.
  void param_to_host(size_t i, size_t begin, size_t end, std::span<std::byte> dst) const;
  void param_from_host(size_t i, std::span<const float> values);

  // Direct host views, only where backend().host_accessible() (the plain fp32 CPU backend):
  // tests, benchmarks and tools. ConfigError otherwise. The library itself never uses them.
  std::span<float> param(size_t i);
  std::span<float> grad(size_t i);
  std::span<const float> param(size_t i) const;
  std::span<float> flat_params();
  std::span<float> flat_grads();
  std::span<const float> flat_params() const;
  std::span<const float> flat_grads() const;

  size_t numel() const { return used_; }          // without padding
  size_t padded_numel() const { return padded_; }
  void zero_grads();

  // Casts every master into the compute copy (nothing without one). After anything that writes
  // masters other than AdamW: initialisation, a weight-file load, a checkpoint load. ConfigError
  // while masters are stale (below): the copy would receive old values.
  void refresh_compute_copy();

  // ZeRO-1 with a compute copy gathers only the copy, so this rank's masters are current only in
  // its own shard. mark_masters_sharded records those flat ranges [begin, end); until every
  // parameter is written again (param_from_host, or mark_masters_current after a gather of the
  // masters) whole-parameter reads of a stale master throw a ConfigError naming it, and range
  // reads must fall inside a current range (a checkpoint writes exactly its shard).
  void mark_masters_sharded(std::vector<std::pair<size_t, size_t>> current_ranges);
  void mark_masters_current();
  bool masters_current() const;

 private:
  std::span<float> host_span(const Tensor& t, size_t off, size_t n) const;
  void layout_units(size_t pad_to);
  // Level 3: the shard offset of flat elements [b, e) of this rank's pieces; npos when not all inside.
  size_t shard_offset_of(size_t b, size_t e) const;
  ParamProvider& need_provider(const char* what) const;
  void need_current(size_t i, const char* what) const;
  std::unique_ptr<Backend> own_;  // the private backend of ParamStore()
  Backend* be_;
  DType dtype_ = DType::f32;
  DType compute_dtype_ = DType::f32;
  std::vector<ParamInfo> infos_;
  Tensor params_, grads_;
  Tensor weights_;                      // the compute copy, or params_ itself
  std::vector<char> stale_;             // per parameter: its master is not current (ZeRO-1 with a copy)
  std::vector<std::pair<size_t, size_t>> current_ranges_;  // flat ranges whose masters are current
  size_t used_ = 0, padded_ = 0;
  bool finalized_ = false;
  ShardSpec spec_{0};
  std::vector<std::pair<size_t, std::string>> unit_starts_;  // begin_unit(): (first param, name)
  std::vector<ParamUnit> units_;
  std::vector<size_t> unit_of_;
  std::vector<ShardSegment> segments_;
  size_t shard_size_ = 0;
  ParamProvider* provider_ = nullptr;
};

}  // namespace triax
