// Next-token sampling (see sampler.h).
#include "triax/model/sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "triax/core/error.h"

namespace triax {

void SamplingOptions::validate() const {
  require(std::isfinite(temperature) && temperature >= 0, "sampling temperature {} must be >= 0 (0: greedy)",
          temperature);
  require(top_k >= 0, "top-k {} must be >= 0 (0: all tokens)", top_k);
}

int sample_token(std::span<const float> logits, const SamplingOptions& o, std::mt19937_64& rng) {
  o.validate();
  require(!logits.empty(), "no logits to sample from");
  const int V = static_cast<int>(logits.size());
  for (int v = 0; v < V; ++v)
    require(std::isfinite(logits[static_cast<size_t>(v)]), "logit {} of token {} is not finite", logits[static_cast<size_t>(v)], v);
  std::vector<int> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  const auto larger = [&](int a, int b) {
    const float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
    return la != lb ? la > lb : a < b;
  };
  const int k = o.top_k > 0 ? std::min(o.top_k, V) : V;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), larger);
  if (o.temperature == 0 || k == 1) return idx[0];
  std::vector<double> p(static_cast<size_t>(k));
  const double mx = logits[static_cast<size_t>(idx[0])];
  double z = 0;
  for (int i = 0; i < k; ++i) z += (p[static_cast<size_t>(i)] = std::exp((logits[static_cast<size_t>(idx[static_cast<size_t>(i)])] - mx) / o.temperature));
  // One uniform in [0, 1) from 53 bits of the generator: the same draw on every platform.
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * z;
  double acc = 0;
  for (int i = 0; i < k; ++i) {
    acc += p[static_cast<size_t>(i)];
    if (u < acc) return idx[static_cast<size_t>(i)];
  }
  return idx[static_cast<size_t>(k - 1)];
}

std::string decode_bytes(std::span<const int> tokens) {
  std::string s;
  for (int t : tokens) {
    if (t >= 0 && t < 256) s.push_back(static_cast<char>(t));
    else s += fmt::format("<{}>", t);
  }
  return s;
}

}  // namespace triax
