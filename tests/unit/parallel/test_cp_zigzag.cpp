// Context parallelism's zigzag split (parallel/context_parallel.h): over the cp ranks the local
// rows' positions are a permutation of [0, seq), each rank holds chunks r and 2 cp - 1 - r in
// order, every rank gets the same causal work (token pairs and chunk blocks), and cp_slice_rows
// hands each rank exactly the tokens at those positions.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>

#include "triax/parallel/context_parallel.h"

using namespace triax;

namespace {
// (cp, seq) pairs: seq a multiple of 2 cp, chunks of 1 token up to several.
std::vector<std::pair<int, int>> cp_seqs() {
  std::vector<std::pair<int, int>> out;
  for (int cp : {1, 2, 3, 4, 8})
    for (int per_chunk : {1, 2, 5, 8}) out.push_back({cp, 2 * cp * per_chunk});
  return out;
}
}  // namespace

TEST_CASE("zigzag positions are a permutation of the sequence, chunks r and 2cp-1-r in order", "[cp][zigzag]") {
  for (const auto& [cp, seq] : cp_seqs()) {
    INFO("cp " << cp << " seq " << seq);
    std::vector<int> seen(static_cast<size_t>(seq), 0);
    for (int r = 0; r < cp; ++r) {
      const CpZigzag z{cp, r, seq};
      REQUIRE(z.chunk() * 2 * cp == seq);
      REQUIRE(z.local() == seq / cp);
      const auto pos = z.positions();
      REQUIRE(static_cast<int>(pos.size()) == z.local());
      const int c = z.chunk();
      for (int t = 0; t < z.local(); ++t) {
        REQUIRE(pos[static_cast<size_t>(t)] == z.position(t));
        const int chunk = t < c ? r : 2 * cp - 1 - r;
        REQUIRE(pos[static_cast<size_t>(t)] == int64_t{chunk} * c + t % c);
        ++seen[static_cast<size_t>(pos[static_cast<size_t>(t)])];
      }
      REQUIRE(std::is_sorted(pos.begin(), pos.end()));  // the second chunk lies after the first
    }
    for (int s : seen) REQUIRE(s == 1);
  }
}

TEST_CASE("zigzag balances causal attention: every rank has the same work", "[cp][zigzag]") {
  for (const auto& [cp, seq] : cp_seqs()) {
    INFO("cp " << cp << " seq " << seq);
    std::vector<int64_t> pairs, blocks;
    for (int r = 0; r < cp; ++r) {
      const CpZigzag z{cp, r, seq};
      // Causal (query, key) pairs of this rank's queries: a query at position p sees p + 1 keys.
      const auto pos = z.positions();
      pairs.push_back(std::accumulate(pos.begin(), pos.end(), int64_t{0}) + z.local());
      // Chunk blocks a ring computes: query chunk q against key chunks 0..q.
      blocks.push_back(int64_t{z.chunk_of(r, 0)} + 1 + z.chunk_of(r, 1) + 1);
    }
    REQUIRE(std::all_of(pairs.begin(), pairs.end(), [&](int64_t p) { return p == pairs[0]; }));
    REQUIRE(std::all_of(blocks.begin(), blocks.end(), [&](int64_t b) { return b == 2 * cp + 1; }));
    // Together they are all the causal pairs of the sequence.
    REQUIRE(pairs[0] * cp == int64_t{seq} * (seq + 1) / 2);
  }
}

TEST_CASE("cp_slice_rows keeps each rank's zigzag tokens of every sequence", "[cp][zigzag]") {
  for (const auto& [cp, seq] : cp_seqs()) {
    for (int B : {1, 3}) {
      INFO("cp " << cp << " seq " << seq << " B " << B);
      std::vector<int32_t> all(static_cast<size_t>(B) * seq);
      for (int b = 0; b < B; ++b)
        for (int p = 0; p < seq; ++p) all[static_cast<size_t>(b) * seq + p] = 1000 * b + p;
      std::vector<int> seen(all.size(), 0);
      for (int r = 0; r < cp; ++r) {
        const CpZigzag z{cp, r, seq};
        std::vector<int32_t> v = all;
        cp_slice_rows(z, B, v);
        REQUIRE(v.size() == static_cast<size_t>(B) * z.local());
        for (int b = 0; b < B; ++b)
          for (int t = 0; t < z.local(); ++t) {
            const int32_t tok = v[static_cast<size_t>(b) * z.local() + t];
            REQUIRE(tok == 1000 * b + z.position(t));
            ++seen[static_cast<size_t>(b) * seq + tok % 1000];
          }
      }
      for (int s : seen) REQUIRE(s == 1);
    }
  }
}

TEST_CASE("cp_slice_rows refuses a batch of the wrong size, naming the counts", "[cp][zigzag]") {
  using Catch::Matchers::Contains;
  std::vector<int32_t> v(30);
  REQUIRE_THROWS_WITH(cp_slice_rows(CpZigzag{2, 0, 16}, 2, v),
                      Contains("30 tokens are not 2 sequences of 16"));
  std::vector<int32_t> one = {1, 2, 3};
  cp_slice_rows(CpZigzag{1, 0, 3}, 1, one);  // cp 1: nothing to cut
  REQUIRE(one == std::vector<int32_t>{1, 2, 3});
}
