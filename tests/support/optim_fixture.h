// Test helpers for the optimizer tests: small ParamStores of awkward sizes with mixed
// weight-decay flags, and deterministic fills (by seed and rank) that every rank can recompute.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "triax/params/param_store.h"

namespace triax::test {

struct FakeParam {
  std::string name;
  int64_t numel;
  bool decay = true;
  bool norm_owner = true;
};

// Odd sizes, 259 elements in all (so bucket and shard boundaries cut through parameters), decay on matrices only.
inline std::vector<FakeParam> odd_params() {
  return {{"wte", 37, true}, {"ln1.w", 5, false}, {"ln1.b", 5, false}, {"attn.w", 61, true},
          {"attn.b", 7, false}, {"mlp.w", 129, true}, {"mlp.b", 3, false}, {"lnf.w", 12, false}};
}

// force_copy: a separate compute copy of the masters' type (ParamStore::finalize).
inline ParamStore make_store(const std::vector<FakeParam>& ps, size_t pad_to, bool force_copy = false) {
  ParamStore s;
  for (const auto& p : ps) {
    ParamSpec spec;
    spec.name = p.name;
    spec.full_shape = {p.numel};
    spec.weight_decay = p.decay;
    spec.norm_owner = p.norm_owner;
    s.add(spec, {p.numel});
  }
  s.finalize(pad_to, force_copy);
  return s;
}

// Normal(0, scale) values from (seed, salt); the same on every rank that asks.
inline void fill_normal(std::span<float> x, uint64_t seed, uint64_t salt, float scale = 1.0f) {
  std::mt19937_64 rng(seed * 1000003ULL + salt * 7919ULL + 17ULL);
  std::normal_distribution<float> nd(0.0f, scale);
  for (auto& v : x) v = nd(rng);
}

// Exactly representable values whose sums over a few ranks are exact: multiples of 1/8 in [-6, 6]
// scaled by (rank + 1).
inline void fill_exact(std::span<float> x, int rank, uint64_t salt) {
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(rank + 1) * static_cast<float>(static_cast<int64_t>((i * 31 + salt * 7) % 97) - 48) / 8.0f;
}

// Fills only the parameter elements (padding stays zero, as a real backward leaves it).
inline void fill_grads_normal(ParamStore& s, uint64_t seed, int rank, float scale = 1.0f) {
  for (size_t i = 0; i < s.size(); ++i) fill_normal(s.grad(i), seed, static_cast<uint64_t>(rank) * 1000 + i, scale);
}

}  // namespace triax::test
