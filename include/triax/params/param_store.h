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
  // Allocates the flat buffers (zero-filled), padding the total to a multiple of pad_to (ZeRO-1
  // needs a multiple of dp), and the compute copy when the backend's compute type differs from
  // dtype() or force_compute_copy is set. Call once, after every add().
  void finalize(size_t pad_to = 1, bool force_compute_copy = false);
  bool finalized() const { return finalized_; }
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
};

}  // namespace triax
