// ParamStore units and the ZeRO-2/3 sharded layout (finalize_sharded): units from begin_unit()
// and from changes of the expert flag, each unit padded to a multiple of its group, every rank's
// pieces and shard segments covering each parameter element exactly once, ZeRO-3's per-rank
// master shards written by param_from_host and read back by ranges with param_to_host, and the
// errors (a whole master under ZeRO-3 names the parameter; views without a provider).
#include <catch2/catch.hpp>

#include <cstring>

#include "support/optim_fixture.h"
#include "triax/params/param_store.h"

using namespace triax;
using Catch::Matchers::Contains;
using triax::test::fill_normal;

namespace {

// embedding | layer 0: ln, attn, 2 experts, a dense bias after them | (an empty unit) | head.
// Odd sizes, so units and pieces cut through parameters.
void add_model(ParamStore& s) {
  auto add = [&](const char* name, int64_t n, bool expert = false) {
    ParamSpec spec;
    spec.name = name;
    spec.full_shape = {n};
    spec.expert = expert;
    s.add(spec, {n});
  };
  s.begin_unit("embedding");
  add("wte", 37);
  s.begin_unit("layer 0");
  add("ln.w", 5);
  add("attn.w", 61);
  add("moe.experts.0.w", 29, true);
  add("moe.experts.1.w", 13, true);
  add("mlp.b", 3);
  s.begin_unit("never used");  // no parameter follows before the next begin_unit: dropped
  s.begin_unit("head");
  add("lnf.w", 11);
}

ParamStore sharded(int level, int group, int rank, int egroup = 1, int erank = 0) {
  ParamStore s;
  add_model(s);
  ShardSpec spec;
  spec.level = level;
  spec.group = group;
  spec.rank = rank;
  spec.expert_group = egroup;
  spec.expert_rank = erank;
  s.finalize_sharded(spec);
  return s;
}

std::vector<float> values_of(const ParamStore& s, size_t i) {
  std::vector<float> v(s.info(i).numel);
  fill_normal(v, 11, i);
  return v;
}

}  // namespace

TEST_CASE("units come from begin_unit and from changes of the expert flag", "[param][zero]") {
  ParamStore s;
  add_model(s);
  s.finalize();
  const auto& u = s.units();
  REQUIRE(u.size() == 5);
  const std::vector<std::string> names = {"embedding", "layer 0", "layer 0 experts", "layer 0 (dense)", "head"};
  const std::vector<size_t> first = {0, 1, 3, 5, 6}, count = {1, 2, 2, 1, 1};
  for (size_t k = 0; k < u.size(); ++k) {
    INFO("unit " << k);
    CHECK(u[k].name == names[k]);
    CHECK(u[k].first == first[k]);
    CHECK(u[k].count == count[k]);
    CHECK(u[k].expert == (k == 2));
    CHECK(u[k].group == 1);  // unsharded: nothing padded, add()'s offsets kept
    CHECK(u[k].begin == s.info(u[k].first).offset);
    CHECK(u[k].end == s.info(u[k].first + u[k].count - 1).offset + s.info(u[k].first + u[k].count - 1).numel);
    for (size_t i = u[k].first; i < u[k].first + u[k].count; ++i) CHECK(s.unit_of(i) == k);
  }
  CHECK(s.zero_level() == 0);
  CHECK(s.padded_numel() == s.numel());
  CHECK_FALSE(s.views_move());
}

TEST_CASE("each unit is padded to its group and every rank's pieces cover it exactly once", "[param][zero]") {
  const int level = GENERATE(2, 3);
  const int group = GENERATE(1, 2, 3, 4);
  const int egroup = GENERATE(1, 2);
  if (egroup > group) return;  // expert-DP (dp / ep) is never larger than the dense group
  INFO("level " << level << " group " << group << " expert group " << egroup);
  std::vector<ParamStore> ranks;
  for (int r = 0; r < group; ++r) ranks.push_back(sharded(level, group, r, egroup, r % egroup));
  const ParamStore& s0 = ranks[0];
  CHECK(s0.zero_level() == level);
  CHECK(s0.views_move());
  // The layout (offsets, units) is the same on every rank; only the pieces differ.
  size_t cursor = 0;
  for (const auto& u : s0.units()) {
    INFO(u.name);
    const int g = u.expert ? egroup : group;
    CHECK(u.group == g);
    CHECK(u.begin == cursor);  // units follow each other
    CHECK(u.size() % static_cast<size_t>(g) == 0);
    const size_t last = u.first + u.count - 1;
    const size_t used = s0.info(last).offset + s0.info(last).numel - u.begin;
    CHECK(u.size() >= used);
    CHECK(u.size() < used + static_cast<size_t>(g));  // padded by less than one element per rank
    cursor = u.end;
  }
  CHECK(s0.padded_numel() == cursor);
  // Every element of every parameter is in exactly one segment of one rank (over the unit's group:
  // an expert unit's pieces are split over the expert group, whose ranks repeat in the dense group).
  std::vector<int> covered(s0.padded_numel(), 0);
  for (int r = 0; r < group; ++r) {
    const ParamStore& s = ranks[static_cast<size_t>(r)];
    size_t shard = 0;
    for (const auto& u : s.units()) {
      CHECK(u.rank == (u.expert ? r % egroup : r));
      CHECK(u.shard_offset == shard);
      CHECK(u.piece_begin() == u.begin + static_cast<size_t>(u.rank) * u.piece());
      shard += u.piece();
    }
    CHECK(s.shard_size() == shard);
    std::vector<int> in_shard(s.shard_size(), 0);
    for (const auto& sg : s.shard_segments()) {
      const ParamInfo& p = s.info(sg.param);
      const ParamUnit& u = s.units()[s.unit_of(sg.param)];
      REQUIRE(sg.flat_offset >= p.offset);
      REQUIRE(sg.flat_offset + sg.count <= p.offset + p.numel);
      REQUIRE(sg.flat_offset >= u.piece_begin());
      REQUIRE(sg.flat_offset + sg.count <= u.piece_begin() + u.piece());
      CHECK(sg.shard_offset == u.shard_offset + (sg.flat_offset - u.piece_begin()));
      for (size_t k = 0; k < sg.count; ++k) {
        ++in_shard.at(sg.shard_offset + k);
        // Expert pieces repeat on the ranks that share an expert-group rank: count the first only.
        if (!u.expert || r < egroup) ++covered.at(sg.flat_offset + k);
      }
    }
    for (int c : in_shard) CHECK(c <= 1);
  }
  for (size_t i = 0; i < s0.size(); ++i)
    for (size_t k = 0; k < s0.info(i).numel; ++k) REQUIRE(covered[s0.info(i).offset + k] == 1);
  size_t in_params = 0;
  for (int c : covered) in_params += static_cast<size_t>(c);
  CHECK(in_params == s0.numel());  // padding belongs to no segment
}

TEST_CASE("ZeRO-3 masters: param_from_host writes this rank's pieces, param_to_host reads ranges of them", "[param][zero]") {
  const int group = GENERATE(2, 3);
  INFO("group " << group);
  std::vector<ParamStore> ranks;
  for (int r = 0; r < group; ++r) ranks.push_back(sharded(3, group, r, group, r));  // experts split alike (ep 1)
  for (auto& s : ranks) {
    CHECK(s.params_t().numel() == static_cast<int64_t>(s.shard_size()));
    for (size_t i = 0; i < s.size(); ++i) s.param_from_host(i, values_of(s, i));
  }
  // Reassemble every parameter from the ranks' segments, read by ranges.
  for (size_t i = 0; i < ranks[0].size(); ++i) {
    const std::vector<float> want = values_of(ranks[0], i);
    std::vector<float> got(want.size(), -1234.0f);
    size_t read = 0;
    for (const auto& s : ranks)
      for (const auto& sg : s.shard_segments()) {
        if (sg.param != i) continue;
        const size_t b = sg.flat_offset - s.info(i).offset;
        s.param_to_host(i, b, b + sg.count, std::as_writable_bytes(std::span<float>(got).subspan(b, sg.count)));
        // The same values sit at the segment's offset of the flat shard.
        std::vector<float> raw(sg.count);
        s.backend().copy_to_host(raw.data(), s.params_t().slice(static_cast<int64_t>(sg.shard_offset),
                                                                static_cast<int64_t>(sg.shard_offset + sg.count)),
                                 raw.size() * sizeof(float));
        CHECK(std::equal(raw.begin(), raw.end(), want.begin() + static_cast<ptrdiff_t>(b)));
        read += sg.count;
      }
    INFO(ranks[0].info(i).spec.name);
    CHECK(read == want.size());
    CHECK(got == want);
  }
  // A range crossing out of this rank's piece names the parameter.
  const ParamStore& s = ranks[0];
  const size_t big = s.find("attn.w");
  std::vector<float> all(s.info(big).numel);
  CHECK_THROWS_WITH(s.param_to_host(big, 0, all.size(), std::as_writable_bytes(std::span<float>(all))),
                    Contains("attn.w") && Contains("outside this rank's ZeRO-3 shard"));
  CHECK_THROWS_WITH(ranks[0].param_from_host(big, std::vector<float>(3)), Contains("attn.w") && Contains("61 elements"));
}

TEST_CASE("sharded stores refuse whole masters under ZeRO-3 and views without a provider", "[param][zero]") {
  ParamStore s3 = sharded(3, 2, 1);
  const size_t i = s3.find("attn.w");
  CHECK_THROWS_AS(s3.param_t(i), ConfigError);
  CHECK_THROWS_WITH(s3.param_t(i), Contains("'attn.w'") && Contains("ZeRO-3"));
  CHECK_THROWS_WITH(s3.param_to_host(i), Contains("'attn.w'"));
  CHECK_THROWS_WITH(s3.flat_params(), Contains("ZeRO-3"));
  CHECK_THROWS_WITH(s3.weight_t(i), Contains("weight_t") && Contains("no ZeRO engine"));
  CHECK_THROWS_WITH(s3.weights_of(0, 2), Contains("weights_of") && Contains("no ZeRO engine"));
  CHECK_THROWS_WITH(s3.grad_t(i), Contains("grad_t") && Contains("no ZeRO engine"));
  ParamStore s2 = sharded(2, 2, 0);
  CHECK_NOTHROW(s2.param_t(i));  // level 2: masters and weights whole
  CHECK(s2.weight_t(i).numel() == 61);
  CHECK_THROWS_WITH(s2.grad_t(i), Contains("ZeRO-2") && Contains("no ZeRO engine"));
  CHECK_THROWS_WITH(s2.grads_of(0, 2), Contains("grads_range"));
  CHECK_THROWS_WITH(s2.grads_range(0, s2.padded_numel() + 1), Contains("outside"));
  s2.zero_grads();  // no provider: nothing to zero, no throw

  ParamStore bad;
  add_model(bad);
  CHECK_THROWS_WITH(bad.finalize_sharded(ShardSpec{1}), Contains("ZeRO level 1"));
  CHECK_THROWS_WITH(bad.finalize_sharded(ShardSpec{3, 2, 2}), Contains("shard group 2 (rank 2)"));
  CHECK_THROWS_WITH(bad.finalize_sharded(ShardSpec{3, 2, 0, 0, 0}), Contains("expert group 0"));
  CHECK_FALSE(bad.finalized());
  bad.finalize_sharded(ShardSpec{2, 2, 0});
  CHECK_THROWS_WITH(bad.finalize_sharded(ShardSpec{2, 2, 0}), Contains("finalized"));
  CHECK_THROWS_WITH(bad.begin_unit("late"), Contains("'late'"));
}
