// ProcessGrid under mpirun: for every factorisation tp x pp x dp of the world size, both axis
// orders and every ep dividing dp, each split communicator has the size, the rank and the
// members GridLayout says (checked by an all_gather of world ranks over the group itself).
#include <catch2/catch.hpp>

#include <fmt/ranges.h>

#include "support/multirank.h"
#include "triax/distributed/grid.h"

using namespace triax;
using namespace triax::test;

namespace {

// Gathers every member's world rank over c and compares with the expected group.
void check_members(Communicator& c, const std::vector<int>& want, const std::string& what) {
  INFO(what << " at world rank " << world().rank() << ": expected [" << fmt::format("{}", fmt::join(want, ","))
            << "]");
  REQUIRE(c.size() == static_cast<int>(want.size()));
  const int me[1] = {world().rank()};
  std::vector<int> got(want.size());
  c.all_gather(std::span<const int>(me), std::span<int>(got)).wait();
  CHECK(got == want);
  CHECK(c.world_ranks() == want);
  CHECK(want.at(static_cast<size_t>(c.rank())) == world().rank());
  CHECK(c.name() == what);
}

struct Shape {
  int tp, pp, dp, ep;
};

std::vector<Shape> factorisations(int n) {
  std::vector<Shape> out;
  for (int tp = 1; tp <= n; ++tp)
    for (int pp = 1; pp <= n; ++pp)
      if (n % (tp * pp) == 0) {
        const int dp = n / (tp * pp);
        for (int ep = 1; ep <= dp; ++ep)
          if (dp % ep == 0) out.push_back({tp, pp, dp, ep});
      }
  return out;
}

}  // namespace

TEST_CASE("ProcessGrid groups match GridLayout for every factorisation and order", "[grid][comm]") {
  Communicator& w = world();
  const int n = w.size(), me = w.rank();
  // Host names gathered once here; the first grid also discovers them itself.
  bool first = true;
  for (const Shape& s : factorisations(n)) {
    for (const char* order : {"tp-dp-pp", "tp-pp-dp"}) {
      GridShape shape{s.tp, s.pp, s.dp, s.ep, order};
      const GridLayout layout(n, shape);
      INFO(layout.describe());
      std::vector<std::string> hosts;
      if (!first) hosts.assign(static_cast<size_t>(n), "host");
      ProcessGrid grid(world_ptr(), shape, {}, hosts);
      if (first) {
        CHECK(static_cast<int>(grid.hosts().size()) == n);
        CHECK(grid.hosts().at(static_cast<size_t>(me)) == host_name());
        first = false;
      }
      CHECK(grid.coord() == layout.coord(me));
      check_members(grid.tp(), layout.group(Axis::tp, me), "tp");
      check_members(grid.pp(), layout.group(Axis::pp, me), "pp");
      check_members(grid.dp(), layout.group(Axis::dp, me), "dp");
      check_members(grid.mp(), layout.model_parallel_group(me), "mp");
      check_members(grid.ep(), layout.ep_group(me), "ep");
      check_members(grid.expert_dp(), layout.expert_dp_group(me), "expert_dp");
      const auto emb = layout.embedding_group(me);
      if (emb.empty()) {
        CHECK(grid.embedding() == nullptr);
      } else {
        REQUIRE(grid.embedding() != nullptr);
        check_members(*grid.embedding(), emb, "embedding");
      }
      // Neighbour stages: pp-communicator ranks that map back to GridLayout's world ranks.
      const auto& pp_members = grid.pp().world_ranks();
      CHECK((grid.prev_stage() < 0 ? -1 : pp_members.at(grid.prev_stage())) == layout.prev_stage(me));
      CHECK((grid.next_stage() < 0 ? -1 : pp_members.at(grid.next_stage())) == layout.next_stage(me));
      CHECK(grid.is_first_stage() == layout.is_first_stage(me));
      CHECK(grid.is_last_stage() == layout.is_last_stage(me));
      // A sum over tp then dp then pp covers the world exactly once per rank: the groups are
      // disjoint within each axis and the collectives on different groups do not interfere.
      int v[1] = {me + 1};
      grid.tp().all_reduce(std::span<int>(v)).wait();
      grid.dp().all_reduce(std::span<int>(v)).wait();
      grid.pp().all_reduce(std::span<int>(v)).wait();
      CHECK(v[0] == n * (n + 1) / 2);
    }
  }
}

TEST_CASE("ProcessGrid refuses a layout whose product is not the world size", "[grid][comm]") {
  const int n = world().size();
  GridShape shape{n + 1, 1, 1, 1, "tp-dp-pp"};
  CHECK_THROWS_AS(ProcessGrid(world_ptr(), shape, {}, std::vector<std::string>(static_cast<size_t>(n), "h")),
                  ConfigError);
  // The refusal is local and collective-free: the world is still in step.
  world().barrier().wait();
}

TEST_CASE("ProcessGrid refuses a tp group spanning hosts unless allowed", "[grid][comm]") {
  Communicator& w = world();
  const int n = w.size();
  if (n < 2) {
    SUCCEED("one rank: no tp group can span hosts");
    return;
  }
  // Pretend every rank is on its own host.
  std::vector<std::string> hosts;
  for (int r = 0; r < n; ++r) hosts.push_back(fmt::format("node{}", r));
  GridShape shape{n, 1, 1, 1, "tp-dp-pp"};
  try {
    ProcessGrid g(world_ptr(), shape, {}, hosts);
    FAIL("a tp group over " << n << " hosts was accepted");
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("node0") != std::string::npos);
    CHECK(msg.find(fmt::format("node{}", n - 1)) != std::string::npos);
  }
  ProcessGrid allowed(world_ptr(), shape, GridOptions{true}, hosts);
  CHECK(allowed.tp().size() == n);
}
