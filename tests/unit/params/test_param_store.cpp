// ParamStore's compute copy (mixed precision's flat weight copy in the compute type): absent when
// the backend computes in the masters' type (the compute view is the master), separate when forced,
// refreshed by refresh_compute_copy() and by the optimizer's AdamW pass, and the stale-master
// bookkeeping of ZeRO-1 (a gather of the copy alone) that refuses reads of masters that are not current,
// and ZeRO-3 range reads of a rank's master piece.
#include <catch2/catch.hpp>

#include <cstring>

#include "support/optim_fixture.h"
#include "triax/distributed/comm/self_comm.h"
#include "triax/optim/optimizer.h"

using namespace triax;
using Catch::Matchers::Contains;
using triax::test::fill_grads_normal;
using triax::test::fill_normal;
using triax::test::make_store;
using triax::test::odd_params;

namespace {
bool same_bits(Backend& be, const Tensor& a, const Tensor& b) {
  REQUIRE(a.numel() == b.numel());
  REQUIRE(a.dtype() == b.dtype());
  std::vector<std::byte> x(a.nbytes()), y(b.nbytes());
  be.copy_to_host(x.data(), a, x.size());
  be.copy_to_host(y.data(), b, y.size());
  return x == y;
}
}  // namespace

TEST_CASE("without a different compute type the compute view is the master itself", "[param]") {
  ParamStore s = make_store(odd_params(), 4);
  CHECK_FALSE(s.has_compute_copy());
  CHECK(s.compute_dtype() == DType::f32);
  for (size_t i = 0; i < s.size(); ++i) CHECK(s.weight_t(i).raw_data() == s.param_t(i).raw_data());
  CHECK(s.weights_t().raw_data() == s.params_t().raw_data());
  s.refresh_compute_copy();  // nothing to do, no throw
}

TEST_CASE("a forced compute copy is separate memory, refreshed from the masters on request", "[param]") {
  for (DType dt : {DType::f32, DType::f64}) {
    INFO(dtype_name(dt));
    auto be = make_cpu_backend(dt);
    ParamStore s(*be);
    s.add(ParamSpec{"a", {7}}, {7});
    s.add(ParamSpec{"b", {3, 5}}, {3, 5});
    s.finalize(4, /*force_compute_copy=*/true);
    REQUIRE(s.has_compute_copy());
    CHECK(s.compute_dtype() == dt);
    CHECK(s.weights_t().dtype() == dt);
    CHECK(s.weights_t().numel() == static_cast<int64_t>(s.padded_numel()));
    CHECK(s.weight_t(1).raw_data() != s.param_t(1).raw_data());
    std::vector<float> v(15);
    fill_normal(v, 3, 1);
    s.param_from_host(1, v);
    CHECK_FALSE(same_bits(*be, s.weight_t(1), s.param_t(1)));  // not yet refreshed
    s.refresh_compute_copy();
    CHECK(same_bits(*be, s.weights_t(), s.params_t()));
  }
}

TEST_CASE("the optimizer's AdamW pass keeps a forced compute copy equal to the masters", "[param][optim]") {
  const bool zero = GENERATE(false, true);
  INFO("zero1 " << zero);
  auto grid = std::make_unique<ProcessGrid>(std::shared_ptr<Communicator>(make_self_communicator()), GridShape{});
  ParamStore s = make_store(odd_params(), 1, /*force_copy=*/true);
  ParamStore ref = make_store(odd_params(), 1);
  for (auto* st : {&s, &ref}) fill_normal(st->flat_params().subspan(0, st->numel()), 5, 5);
  s.refresh_compute_copy();
  OptimizerConfig cfg;
  cfg.zero = (zero) ? 1 : 0;
  Optimizer a(s, *grid, cfg), b(ref, *grid, cfg);
  for (int step = 1; step <= 3; ++step) {
    for (auto* st : {&s, &ref}) {
      st->zero_grads();
      fill_grads_normal(*st, 70 + static_cast<uint64_t>(step), 0);
    }
    a.step(1e-2);
    b.step(1e-2);
    CHECK(same_bits(s.backend(), s.weights_t(), s.params_t()));
    CHECK(same_bits(s.backend(), s.params_t(), ref.params_t()));
  }
  CHECK(s.masters_current());  // dp 1: this rank's shard is everything
}

TEST_CASE("stale masters (ZeRO-1 gathered only the copy) refuse whole reads and the refresh", "[param]") {
  ParamStore s = make_store(odd_params(), 1, /*force_copy=*/true);
  const size_t mlp = s.find("mlp.w");
  const ParamInfo& info = s.info(mlp);
  // This rank's shard: the first 20 elements of mlp.w and nothing else.
  s.mark_masters_sharded({{info.offset, info.offset + 20}});
  CHECK_FALSE(s.masters_current());
  CHECK_THROWS_WITH(s.param_to_host(mlp), Contains("mlp.w") && Contains("stale") && Contains("gather_master_weights"));
  CHECK_THROWS_WITH(s.param(0), Contains("wte") && Contains("stale"));
  CHECK_THROWS_WITH(s.refresh_compute_copy(), Contains("stale"));
  std::vector<std::byte> buf(20 * sizeof(float));
  s.param_to_host(mlp, 0, 20, buf);  // inside the shard: current
  std::vector<std::byte> more(21 * sizeof(float));
  CHECK_THROWS_WITH(s.param_to_host(mlp, 0, 21, more), Contains("outside this rank's ZeRO-1 shard"));
  // Writing a whole parameter makes it current; the rest stays stale.
  s.param_from_host(0, std::vector<float>(info.numel == 0 ? 0 : s.info(0).numel, 1.0f));
  CHECK(s.param_to_host(0).front() == 1.0f);
  CHECK_THROWS(s.param_to_host(mlp));
  s.mark_masters_current();
  CHECK(s.masters_current());
  CHECK_NOTHROW(s.param_to_host(mlp));
  CHECK_NOTHROW(s.refresh_compute_copy());
}

TEST_CASE("ZeRO-3: param_to_host(i, begin, end) reads this rank's piece where it starts inside a parameter",
          "[param][zero]") {
  // One unit of 6 + 10 elements over a group of 2: rank 1's piece is flat [8, 16), elements
  // [2, 10) of "b" (what a checkpoint save writes; the piece starts inside the parameter).
  auto be = make_cpu_backend(DType::f32);
  ParamStore s(*be);
  s.begin_unit("u");
  s.add(ParamSpec{"a", {6}}, {6});
  s.add(ParamSpec{"b", {10}}, {10});
  ShardSpec spec;
  spec.level = 3, spec.group = 2, spec.rank = 1;
  s.finalize_sharded(spec);
  REQUIRE(s.shard_size() == 8);
  std::vector<float> v(10);
  for (size_t k = 0; k < v.size(); ++k) v[k] = 0.5f + static_cast<float>(k);
  s.param_from_host(1, v);  // keeps elements [2, 10), this rank's piece
  auto read = [&](size_t b, size_t e) {
    std::vector<float> out(e - b);
    s.param_to_host(1, b, e, std::as_writable_bytes(std::span<float>(out)));
    return out;
  };
  CHECK(read(2, 10) == std::vector<float>(v.begin() + 2, v.end()));
  CHECK(read(5, 7) == std::vector<float>(v.begin() + 5, v.begin() + 7));
  std::vector<float> out(2);
  CHECK_THROWS_WITH(s.param_to_host(1, 0, 2, std::as_writable_bytes(std::span<float>(out))),
                    Contains("master elements [0, 2) are outside this rank's ZeRO-3 shard"));
  CHECK_THROWS_WITH(s.param_to_host(0, 0, 2, std::as_writable_bytes(std::span<float>(out))),
                    Contains("parameter 'a': master elements [0, 2) are outside this rank's ZeRO-3 shard"));
}
