// Deterministic parameter initialisation from (seed, name) on the full shape, and the
// TP shard / gather maps, so every tp size starts from, and saves, the same model.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "triax/params/param_store.h"

namespace triax {

// Normal(0, std) values for a tensor of n elements, a pure function of (seed, name, index):
// the same on every rank, every tp size and every platform.
std::vector<float> init_normal(uint64_t seed, const std::string& name, size_t n, float std);

// Local shape of a full shape under a split at tp rank r of tp ranks (ConfigError if it does
// not divide).
std::vector<int64_t> shard_shape(const std::vector<int64_t>& full, TpSplit split, int tp, const std::string& name);

// Copies this rank's shard out of a full row-major tensor.
std::vector<float> shard_of(std::span<const float> full, const std::vector<int64_t>& full_shape, TpSplit split,
                            int rank, int tp);
// Writes a shard back into its place in a full tensor (the inverse of shard_of).
void place_shard(std::span<const float> shard, std::span<float> full, const std::vector<int64_t>& full_shape,
                 TpSplit split, int rank, int tp);

}  // namespace triax
