// ParamStore: every parameter of one pipeline stage lives in one flat buffer of master weights
// (fp32; fp64 on a CPU backend built for gradient checks) in a Backend's storage, with its gradient
// at the same offset of a second flat buffer (parameter gradients keep their own type whatever the
// activations are). Flat buffers are what DP buckets, ZeRO-1 shards and the fused AdamW walk;
// named views (Tensor slices) are what layers hand to the backend.
#pragma once
#include <cstdint>
#include <span>
#include <string>
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
  // needs a multiple of dp). Call once, after every add().
  void finalize(size_t pad_to = 1);
  bool finalized() const { return finalized_; }

  size_t size() const { return infos_.size(); }
  const ParamInfo& info(size_t i) const { return infos_.at(i); }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  size_t find(const std::string& name) const;  // throws ConfigError naming the missing parameter

  // Backend views: what the model and the optimizer hand to backend ops and communicators.
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

 private:
  std::span<float> host_span(const Tensor& t, size_t off, size_t n) const;
  std::unique_ptr<Backend> own_;  // the private backend of ParamStore()
  Backend* be_;
  DType dtype_ = DType::f32;
  std::vector<ParamInfo> infos_;
  Tensor params_, grads_;
  size_t used_ = 0, padded_ = 0;
  bool finalized_ = false;
};

}  // namespace triax
