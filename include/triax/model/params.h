// ParamStore: every parameter of one pipeline stage lives in one flat fp32 buffer, with its
// gradient at the same offset of a second flat buffer. Flat buffers are what DP buckets,
// ZeRO-1 shards and the fused AdamW walk; named views are what layers use.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

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
  // Registers a parameter; returns its index. Offsets follow registration order.
  size_t add(ParamSpec spec, std::vector<int64_t> local_shape);
  // Allocates the flat buffers, padding the total to a multiple of pad_to (ZeRO-1 needs a
  // multiple of dp). Call once, after every add().
  void finalize(size_t pad_to = 1);

  size_t size() const { return infos_.size(); }
  const ParamInfo& info(size_t i) const { return infos_.at(i); }
  const std::vector<ParamInfo>& infos() const { return infos_; }
  size_t find(const std::string& name) const;  // throws ConfigError naming the missing parameter

  std::span<float> param(size_t i) { return std::span<float>(params_).subspan(infos_[i].offset, infos_[i].numel); }
  std::span<float> grad(size_t i) { return std::span<float>(grads_).subspan(infos_[i].offset, infos_[i].numel); }
  std::span<const float> param(size_t i) const {
    return std::span<const float>(params_).subspan(infos_[i].offset, infos_[i].numel);
  }
  std::span<float> flat_params() { return params_; }
  std::span<float> flat_grads() { return grads_; }
  std::span<const float> flat_params() const { return params_; }
  std::span<const float> flat_grads() const { return grads_; }
  // Parameter i's values copied to / from host memory: the only way checkpoint code touches
  // parameter values (on a device backend the store's buffers are not host memory).
  std::vector<float> param_to_host(size_t i) const;
  void param_from_host(size_t i, std::span<const float> values);  // ConfigError unless values.size() == numel
  size_t numel() const { return used_; }          // without padding
  size_t padded_numel() const { return params_.size(); }
  void zero_grads();

 private:
  std::vector<ParamInfo> infos_;
  std::vector<float> params_, grads_;
  size_t used_ = 0;
  bool finalized_ = false;
};

}  // namespace triax
