// Next-token sampling: greedy and top-k 1 take the largest logit, top-k never leaves the k
// largest, frequencies follow softmax(logits / temperature), a seed reproduces a draw, bad options.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>

#include "triax/core/error.h"
#include "triax/model/sampler.h"

using namespace triax;

TEST_CASE("sampling: greedy, top-k, temperature and seeds", "[sampler]") {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 1.0f, 2.0f, 0.0f};
  std::mt19937_64 rng(7);
  CHECK(sample_token(logits, {0.0, 0}, rng) == 1);  // ties: the lower id
  CHECK(sample_token(logits, {1.0, 1}, rng) == 1);
  for (int i = 0; i < 200; ++i) {
    const int t = sample_token(logits, {1.0, 3}, rng);
    REQUIRE((t == 1 || t == 4 || t == 3));
  }
  // Frequencies against softmax at temperature 2 over all tokens.
  const double temp = 2.0;
  std::vector<double> p(logits.size());
  double z = 0;
  for (size_t v = 0; v < logits.size(); ++v) z += (p[v] = std::exp(logits[v] / temp));
  std::map<int, int> count;
  const int n = 60000;
  for (int i = 0; i < n; ++i) ++count[sample_token(logits, {temp, 0}, rng)];
  for (size_t v = 0; v < logits.size(); ++v) {
    const double f = static_cast<double>(count[static_cast<int>(v)]) / n, q = p[v] / z;
    INFO("token " << v << " frequency " << f << " probability " << q);
    CHECK(std::abs(f - q) < 5 * std::sqrt(q * (1 - q) / n));
  }
  // The same seed draws the same tokens.
  std::mt19937_64 a(123), b(123);
  for (int i = 0; i < 50; ++i) CHECK(sample_token(logits, {1.0, 0}, a) == sample_token(logits, {1.0, 0}, b));
  CHECK_THROWS_AS(sample_token(logits, {-1.0, 0}, rng), ConfigError);
  CHECK_THROWS_AS(sample_token(logits, {1.0, -2}, rng), ConfigError);
  const std::vector<float> bad = {0.0f, NAN};
  CHECK_THROWS_AS(sample_token(bad, {1.0, 0}, rng), ConfigError);
  const std::vector<int> toks = {104, 105, 300};
  CHECK(decode_bytes(toks) == "hi<300>");
}
