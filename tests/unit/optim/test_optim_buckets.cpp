// Bucket planning (cover, order, boundaries, alignment, tied bucket), ZeRO shard segments for
// every rank of a simulated DP group, and GradBuffer's start order and bad-use errors on one rank.
#include <catch2/catch.hpp>

#include <algorithm>

#include "support/optim_fixture.h"
#include "triax/distributed/comm/self_comm.h"
#include "triax/optim/grad_buffer.h"
#include "triax/optim/zero.h"

using namespace triax;
using triax::test::make_store;
using triax::test::odd_params;

namespace {
bool is_param_start(const ParamStore& s, size_t x) {
  for (const auto& p : s.infos())
    if (p.offset == x) return true;
  return false;
}

void check_plan(const ParamStore& s, const std::vector<GradBucket>& bs, size_t align, size_t target,
                std::optional<size_t> tied) {
  // Disjoint cover of [0, padded).
  std::vector<int> seen(s.padded_numel(), 0);
  for (const auto& b : bs) {
    REQUIRE(b.begin < b.end);
    for (size_t i = b.begin; i < b.end; ++i) ++seen[i];
    CHECK(b.size() % align == 0);
    CHECK(b.begin % align == 0);
    if (align == 1 && b.begin > 0 && !b.tied) CHECK(is_param_start(s, b.begin));
    // params: exactly those overlapping.
    std::vector<size_t> want;
    for (size_t i = 0; i < s.size(); ++i)
      if (s.info(i).offset < b.end && s.info(i).offset + s.info(i).numel > b.begin) want.push_back(i);
    CHECK(b.params == want);
  }
  for (int c : seen) REQUIRE(c == 1);
  // Launch order: descending flat ranges (reverse parameter order) within each region, the tied
  // bucket last.
  const size_t plain = tied ? bs.size() - 1 : bs.size();
  if (tied) {
    CHECK(bs.back().tied);
    const auto& t = s.info(*tied);
    CHECK(bs.back().begin <= t.offset);
    CHECK(bs.back().end >= t.offset + t.numel);
  }
  for (size_t b = 0; b + 1 < plain; ++b) {
    CHECK_FALSE(bs[b].tied);
    const bool contiguous = bs[b].begin == bs[b + 1].end;
    const bool region_jump = tied && bs[b].begin == bs.back().end && bs[b + 1].end == bs.back().begin;
    CHECK((contiguous || region_jump));
  }
  if (plain > 0) {
    const bool tied_on_top = tied && bs.back().end == s.padded_numel();
    CHECK(bs[0].end == (tied_on_top ? bs.back().begin : s.padded_numel()));
  }
  // Every bucket that is not the lowest of its region holds at least target elements.
  for (size_t b = 0; b < plain; ++b) {
    const bool lowest = bs[b].begin == 0 || (tied && bs[b].begin == bs.back().end);
    if (!lowest) CHECK(bs[b].size() >= target);
  }
}
}  // namespace

TEST_CASE("plan_grad_buckets: cover, reverse order, boundaries, target size") {
  const size_t align = GENERATE(1, 2, 3, 4, 8);
  const size_t target = GENERATE(0, 1, 16, 40, 100, 1000);
  auto s = make_store(odd_params(), align);
  auto bs = plan_grad_buckets(s.infos(), s.padded_numel(), align, target);
  INFO("align " << align << " target " << target << " buckets " << bs.size());
  check_plan(s, bs, align, target == 0 ? SIZE_MAX : target, std::nullopt);
  if (target == 0 || target >= 1000) CHECK(bs.size() == 1);
  if (target == 1 && align == 1) CHECK(bs.size() == s.size());  // one bucket per parameter
  // Bucket 0 holds the last parameter (backward finishes it first).
  CHECK(bs.front().params.back() == s.size() - 1);
}

TEST_CASE("plan_grad_buckets: the tied embedding gets its own bucket, started last") {
  const size_t align = GENERATE(1, 2, 4);
  const size_t tied = GENERATE(0, 3, 7);  // first, middle, last parameter
  auto s = make_store(odd_params(), align);
  auto bs = plan_grad_buckets(s.infos(), s.padded_numel(), align, 40, tied);
  INFO("align " << align << " tied " << tied);
  check_plan(s, bs, align, 40, tied);
  CHECK(std::count_if(bs.begin(), bs.end(), [](const GradBucket& b) { return b.tied; }) == 1);
}

TEST_CASE("plan_grad_buckets: bad inputs") {
  auto s = make_store(odd_params(), 1);  // 259 elements, not a multiple of 4
  CHECK_THROWS_WITH(plan_grad_buckets(s.infos(), s.padded_numel(), 4, 10),
                    Catch::Contains("must hold them all and be a multiple of 4"));
  CHECK_THROWS_WITH(plan_grad_buckets(s.infos(), 10, 1, 10), Catch::Contains("flat buffer has 10 elements for 259"));
  CHECK_THROWS_WITH(plan_grad_buckets(s.infos(), s.padded_numel(), 1, 10, 99), Catch::Contains("tied parameter index 99"));
  CHECK_THROWS_AS(plan_grad_buckets(s.infos(), s.padded_numel(), 0, 10), ConfigError);
}

TEST_CASE("plan_shard_segments: the ranks' shards cover every parameter element exactly once") {
  const int dp = GENERATE(1, 2, 3, 4, 8);
  const size_t target = GENERATE(0, 8, 50);
  auto s = make_store(odd_params(), static_cast<size_t>(dp));
  INFO("dp " << dp << " target " << target << " padded " << s.padded_numel());
  std::vector<int> covered(s.padded_numel(), 0);
  bool cut = false;  // some parameter is split between two ranks
  for (int r = 0; r < dp; ++r) {
    auto bs = plan_grad_buckets(s.infos(), s.padded_numel(), static_cast<size_t>(dp), target);
    auto segs = plan_shard_segments(bs, s.infos(), dp, r);
    std::vector<int> shard_used(s.padded_numel() / static_cast<size_t>(dp), 0);
    for (const auto& g : segs) {
      REQUIRE(g.count > 0);
      const auto& p = s.info(g.param);
      CHECK(g.flat_offset >= p.offset);
      CHECK(g.flat_offset + g.count <= p.offset + p.numel);
      if (g.count < p.numel) cut = true;
      for (size_t i = 0; i < g.count; ++i) {
        ++covered[g.flat_offset + i];
        ++shard_used.at(g.shard_offset + i);
      }
      // The shard element maps back into this rank's piece of its bucket.
      bool inside = false;
      for (const auto& b : bs) {
        const size_t piece = b.size() / static_cast<size_t>(dp), pb = b.begin + static_cast<size_t>(r) * piece;
        if (g.shard_offset >= b.shard_offset && g.shard_offset < b.shard_offset + piece)
          inside = g.flat_offset == pb + (g.shard_offset - b.shard_offset);
      }
      CHECK(inside);
    }
    for (int u : shard_used) CHECK(u <= 1);
  }
  for (size_t i = 0; i < s.numel(); ++i) REQUIRE(covered[i] == 1);
  for (size_t i = s.numel(); i < s.padded_numel(); ++i) REQUIRE(covered[i] == 0);  // padding: no segment
  if (dp > 1) CHECK(cut);
  auto bs = plan_grad_buckets(s.infos(), s.padded_numel(), static_cast<size_t>(dp), target);
  CHECK_THROWS_AS(plan_shard_segments(bs, s.infos(), dp, dp), ConfigError);
}

TEST_CASE("update_ranges merge parameters with the same decay flag") {
  auto s = make_store(odd_params(), 1);
  auto rs = update_ranges(s);
  // wte | ln1.w ln1.b | attn.w | attn.b | mlp.w | mlp.b lnf.w
  REQUIRE(rs.size() == 6);
  CHECK(rs[0].count == 37);
  CHECK(rs[0].decay);
  CHECK(rs[1].count == 10);
  CHECK_FALSE(rs[1].decay);
  CHECK(rs[5].count == 15);
  size_t total = 0;
  for (const auto& r : rs) {
    CHECK(r.flat_offset == r.state_offset);
    total += r.count;
  }
  CHECK(total == s.numel());
}

TEST_CASE("GradBuffer on one rank: buckets start in order as their params are marked") {
  auto s = make_store(odd_params(), 1);
  test::fill_grads_normal(s, 5, 0);
  const std::vector<float> before(s.flat_grads().begin(), s.flat_grads().end());
  auto dp = make_self_communicator("dp");
  GradBufferOptions o;
  o.bucket_bytes = 40 * sizeof(float);
  GradBuffer gb(s, *dp, o);
  REQUIRE(gb.num_buckets() >= 3);
  std::vector<size_t> order;
  gb.set_start_hook([&](size_t b) { order.push_back(b); });
  for (int step = 0; step < 2; ++step) {
    order.clear();
    // Mark bucket 1's params first: nothing may start before bucket 0 is complete.
    for (size_t p : gb.bucket(1).params)
      if (std::find(gb.bucket(0).params.begin(), gb.bucket(0).params.end(), p) == gb.bucket(0).params.end())
        gb.mark_ready(p);
    CHECK(order.empty());
    CHECK_FALSE(gb.started(1));
    for (size_t p : gb.bucket(0).params) gb.mark_ready(p);
    REQUIRE(order.size() == 2);
    CHECK(order[0] == 0);
    CHECK(order[1] == 1);
    CHECK(gb.started(0));
    CHECK_FALSE(gb.started(2));
    gb.progress();
    CHECK(gb.done(0));
    const auto st = gb.finish();
    CHECK(st.buckets == gb.num_buckets());
    CHECK(st.started_early == 2);
    for (size_t b = 0; b < gb.num_buckets(); ++b) CHECK(order.at(b) == b);
    CHECK(st.bytes == s.padded_numel() * sizeof(float));
  }
  // One rank: the average is the data itself.
  CHECK(std::equal(before.begin(), before.end(), s.flat_grads().begin()));
}

TEST_CASE("GradBuffer: no-overlap mode and finish without marks start everything in finish") {
  auto s = make_store(odd_params(), 1);
  auto dp = make_self_communicator("dp");
  GradBufferOptions o;
  o.bucket_bytes = 40 * sizeof(float);
  o.overlap = false;
  GradBuffer gb(s, *dp, o);
  for (size_t p = s.size(); p-- > 0;) gb.mark_ready(p);
  CHECK_FALSE(gb.started(0));
  gb.progress();
  CHECK_FALSE(gb.started(0));
  auto st = gb.finish();
  CHECK(st.started_early == 0);
  for (const auto& t : gb.timings()) CHECK(t.started_in_finish);
  GradBufferOptions o2;
  GradBuffer gb2(s, *dp, o2);
  st = gb2.finish();
  CHECK(st.started_early == 0);
  CHECK(st.buckets == 1);
}

TEST_CASE("GradBuffer refuses bad use") {
  auto dp = make_self_communicator("dp");
  auto s = make_store(odd_params(), 1);
  GradBuffer gb(s, *dp);
  gb.mark_ready(2);
  CHECK_THROWS_WITH(gb.mark_ready(2), Catch::Contains("parameter 'ln1.b' (index 2) marked ready twice"));
  CHECK_THROWS_WITH(gb.mark_ready(8), Catch::Contains("parameter index 8 out of range (8 parameters)"));
  gb.finish();
  CHECK_NOTHROW(gb.mark_ready(2));  // a new step
  gb.finish();

  ParamStore unfinalized;
  unfinalized.add(ParamSpec{"w", {4}}, {4});
  CHECK_THROWS_WITH(GradBuffer(unfinalized, *dp), Catch::Contains("not finalized"));
  GradBufferOptions bad;
  bad.op = ReduceOp::max;
  CHECK_THROWS_WITH(GradBuffer(s, *dp, bad), Catch::Contains("must be avg or sum, not max"));
  GradBufferOptions tied;
  tied.tied_param = 42;
  CHECK_THROWS_WITH(GradBuffer(s, *dp, tied), Catch::Contains("tied parameter index 42"));
  CHECK_THROWS_WITH(all_reduce_tied_embedding(s, 42, nullptr), Catch::Contains("index 42 out of range"));
  CHECK_NOTHROW(all_reduce_tied_embedding(s, 0, nullptr));  // middle stage: nothing to do
  CHECK_THROWS_AS(update_ranges(s, gb), ConfigError);       // not a ZeRO buffer
}
