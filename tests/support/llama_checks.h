// Test helpers: a model config's Llama block and a train config's Llama flags against the values
// a test expects. The block itself (RMSNorm, SwiGLU, RoPE with llama3 scaling, no linear biases)
// is always checked; its numbers against `want`. For the tests that read a Llama block back from
// a file or a command line (checkpoint manifest, HF directory, train config, --init-from).
#pragma once
#include <catch2/catch.hpp>

#include "triax/config/train_config.h"
#include "triax/model/config.h"

namespace triax::test {

struct LlamaBlock {
  int kv_heads;
  double norm_eps;
  double rope_theta;
  RopeScaling rope_scaling;  // its llama3 is not read: checked true
  bool tied_embeddings;
};

inline void check_llama_block(const GptConfig& c, const LlamaBlock& want) {
  CHECK(c.kv_heads() == want.kv_heads);
  CHECK(c.norm == Norm::rmsnorm);
  CHECK(c.norm_eps == want.norm_eps);
  CHECK(c.swiglu);
  CHECK(c.positions == PositionEmbedding::rope);
  CHECK(c.rope_theta == want.rope_theta);
  CHECK(c.rope_scaling.llama3);
  CHECK(c.rope_scaling.factor == want.rope_scaling.factor);
  CHECK(c.rope_scaling.low_freq_factor == want.rope_scaling.low_freq_factor);
  CHECK(c.rope_scaling.high_freq_factor == want.rope_scaling.high_freq_factor);
  CHECK(c.rope_scaling.original_max_positions == want.rope_scaling.original_max_positions);
  CHECK(c.tied_embeddings == want.tied_embeddings);
  CHECK(!c.bias);
}

struct LlamaFlags {
  double norm_epsilon;
  double rotary_base;
  double rope_scaling_factor;
  int num_query_groups;
};

// Every Llama flag set (RMSNorm, SwiGLU, RoPE with scaling, grouped-query attention, an untied
// head, no linear biases), the numbers as `want`.
inline void check_llama_flags(const TrainConfig& c, const LlamaFlags& want) {
  CHECK(c.normalization == Norm::rmsnorm);
  CHECK(c.norm_epsilon == want.norm_epsilon);
  CHECK(c.swiglu == true);
  CHECK(c.position_embedding == PositionEmbedding::rope);
  CHECK(c.rotary_base == want.rotary_base);
  CHECK(c.use_rope_scaling == true);
  CHECK(c.rope_scaling_factor == want.rope_scaling_factor);
  CHECK(c.group_query_attention == true);
  CHECK(c.num_query_groups == want.num_query_groups);
  CHECK(c.untie_embeddings == true);
  CHECK(c.disable_bias_linear == true);
}

}  // namespace triax::test
