// Token + position embedding against naive loops; backward by finite differences (double) and
// float against double; vocab-parallel shards add up to the full table.
#include <catch2/catch.hpp>

#include <limits>

#include "triax/core/error.h"
#include "triax/ops/embedding.h"
#include "unit/ops_testing.h"

using namespace triax::ops;
using namespace triax::test;
using Catch::Matchers::Contains;

namespace {

std::vector<double> ref_embedding(const std::vector<int32_t>& tok, const std::vector<double>& wte,
                                  const std::vector<double>& wpe, int B, int T, int C) {
  std::vector<double> out(static_cast<size_t>(B) * T * C);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c)
        out[(b * T + t) * C + c] = wte[tok[b * T + t] * C + c] + wpe[t * C + c];
  return out;
}

}  // namespace

TEST_CASE("embedding forward matches the gather") {
  for (auto [B, T, C, V] : {std::tuple{2, 5, 7, 11}, std::tuple{4, 64, 200, 300}}) {
    auto tok = random_ints(B * T, 0, V);
    auto wte = random_vec(V * C), wpe = random_vec((T + 3) * C);  // wpe may hold more positions than T
    auto want = ref_embedding(tok, wte, wpe, B, T, C);
    auto wtef = cast<float>(wte), wpef = cast<float>(wpe);
    std::vector<float> out(B * T * C, std::numeric_limits<float>::quiet_NaN());
    embedding_forward<float>(out.data(), tok.data(), wtef.data(), wpef.data(), B, T, C, V);
    require_close(out, want, 1.2e-7, 1.2e-7, "embedding float");  // rounded inputs, one rounded sum
  }
}

TEST_CASE("embedding backward: finite differences in double, float against double, accumulation") {
  const int B = 3, T = 4, C = 5, V = 6;  // few tokens: repeats are certain, exercising the scatter-add
  auto tok = random_ints(B * T, 0, V);
  auto wte = random_vec(V * C), wpe = random_vec(T * C), dout = random_vec(B * T * C);
  auto dwte0 = random_vec(V * C), dwpe0 = random_vec(T * C);
  std::vector<double> dwte = dwte0, dwpe = dwpe0;
  embedding_backward<double>(dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C, V);
  std::vector<double> gte(V * C), gpe(T * C);
  for (size_t i = 0; i < gte.size(); ++i) gte[i] = dwte[i] - dwte0[i];
  for (size_t i = 0; i < gpe.size(); ++i) gpe[i] = dwpe[i] - dwpe0[i];
  auto loss = [&] { return dot(dout, ref_embedding(tok, wte, wpe, B, T, C)); };
  fd_check(wte, gte, loss, "dwte");
  fd_check(wpe, gpe, loss, "dwpe");

  auto doutf = cast<float>(dout);
  auto dwtef = cast<float>(dwte0), dwpef = cast<float>(dwpe0);
  embedding_backward<float>(dwtef.data(), dwpef.data(), doutf.data(), tok.data(), B, T, C, V);
  require_close(dwtef, dwte, 1e-6, 1e-6, "float dwte");
  require_close(dwpef, dwpe, 1e-6, 1e-6, "float dwpe");
}

TEST_CASE("embedding backward on a large batch (parallel channel blocks)") {
  const int B = 4, T = 64, C = 200, V = 50;
  auto tok = random_ints(B * T, 0, V);
  auto dout = random_vec(B * T * C);
  std::vector<double> want_te(V * C, 0.0), want_pe(T * C, 0.0);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c) {
        want_te[tok[b * T + t] * C + c] += dout[(b * T + t) * C + c];
        want_pe[t * C + c] += dout[(b * T + t) * C + c];
      }
  auto doutf = cast<float>(dout);
  std::vector<float> dwte(V * C, 0.0f), dwpe(T * C, 0.0f);
  embedding_backward<float>(dwte.data(), dwpe.data(), doutf.data(), tok.data(), B, T, C, V);
  require_close(dwte, want_te, 1e-5, 1e-5, "dwte");
  require_close(dwpe, want_pe, 1e-5, 1e-5, "dwpe");
}

TEST_CASE("vocab-parallel shards sum to the full embedding and split its gradient") {
  const int B = 2, T = 6, C = 8, V = 13;
  auto tok = random_ints(B * T, 0, V);
  auto wte = random_vec(V * C), wpe = random_vec(T * C), dout = random_vec(B * T * C);
  std::vector<double> full(B * T * C), sum(B * T * C, 0.0);
  embedding_forward<double>(full.data(), tok.data(), wte.data(), wpe.data(), B, T, C, V);
  std::vector<double> dwte_full(V * C, 0.0), dwte_shards(V * C, 0.0);
  embedding_backward<double>(dwte_full.data(), nullptr, dout.data(), tok.data(), B, T, C, V);
  const int cuts[] = {0, 4, 9, 13};  // uneven shards
  for (int s = 0; s < 3; ++s) {
    const int v0 = cuts[s], v1 = cuts[s + 1];
    std::vector<double> part(B * T * C, std::numeric_limits<double>::quiet_NaN());
    // The position term on the first shard only, as the TP model adds it once.
    embedding_forward<double>(part.data(), tok.data(), wte.data() + v0 * C, s == 0 ? wpe.data() : nullptr, B, T, C, V,
                              v0, v1);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
    embedding_backward<double>(dwte_shards.data() + v0 * C, nullptr, dout.data(), tok.data(), B, T, C, V, v0, v1);
  }
  require_close(sum, full, 0, 0, "sum of shards");  // exactly one nonzero token term per element
  require_close(dwte_shards, dwte_full, 0, 0, "shard gradients");
}

TEST_CASE("embedding rejects bad tokens and shards") {
  const int B = 1, T = 3, C = 2, V = 4;
  std::vector<float> out(B * T * C), wte(V * C, 1.0f), wpe(T * C, 1.0f);
  std::vector<int32_t> bad = {0, 4, 1};
  CHECK_THROWS_WITH(embedding_forward<float>(out.data(), bad.data(), wte.data(), wpe.data(), B, T, C, V),
                    Contains("token 4") && Contains("t=1") && Contains("[0, 4)"));
  bad[1] = -2;
  CHECK_THROWS_WITH(embedding_backward<float>(wte.data(), wpe.data(), out.data(), bad.data(), B, T, C, V),
                    Contains("token -2"));
  std::vector<int32_t> ok = {0, 1, 2};
  CHECK_THROWS_WITH(embedding_forward<float>(out.data(), ok.data(), wte.data(), wpe.data(), B, T, C, V, 2, 5),
                    Contains("[2, 5)"));
  CHECK_THROWS_AS(embedding_forward<float>(out.data(), ok.data(), wte.data(), wpe.data(), B, T, C, V, 2, 2),
                  triax::ConfigError);
  CHECK_THROWS_WITH(embedding_forward<float>(out.data(), ok.data(), nullptr, wpe.data(), B, T, C, V),
                    Contains("wte is null"));
  CHECK_THROWS_WITH(embedding_forward<float>(out.data(), ok.data(), wte.data(), wpe.data(), B, 0, C, V),
                    Contains("T must be positive"));
}
