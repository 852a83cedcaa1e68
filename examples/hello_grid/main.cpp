// The smallest program that links triax: bootstrap (mpirun, torchrun-style env, or one
// process), build a tp x pp x dp grid, and check each group with an all-reduce of known values.
//   mpirun -np 8 hello_grid --tp 2 --pp 2 --dp 2
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <triax/core/log.h>
#include <triax/distributed/bootstrap/bootstrap.h>
#include <triax/distributed/grid.h>

#include <cstdio>

int main(int argc, char** argv) {
  CLI::App app{"triax hello_grid: bootstrap, process grid and one all-reduce per group"};
  triax::GridShape shape;
  bool allow_cross = false;
  app.add_option("--tp", shape.tp, "tensor-parallel size")->check(CLI::PositiveNumber);
  app.add_option("--pp", shape.pp, "pipeline-parallel size")->check(CLI::PositiveNumber);
  app.add_option("--dp", shape.dp, "data-parallel size (default: world / (tp*pp))");
  app.add_option("--order", shape.order, "axis order, fastest first");
  app.add_flag("--allow-tp-across-hosts", allow_cross, "allow TP groups that span hosts");
  CLI11_PARSE(app, argc, argv);
  try {
    auto boot = triax::Bootstrap::create();
    auto world = boot->world();
    triax::log::set_rank(world->rank());
    if (!app.count("--dp")) shape.dp = world->size() / (shape.tp * shape.pp);
    triax::ProcessGrid grid(world, shape, {allow_cross});
    // Each group sums its members' world ranks; the closed form checks the membership.
    int bad = 0;
    for (auto* c : {&grid.tp(), &grid.pp(), &grid.dp(), &grid.mp()}) {
      int64_t v[1] = {world->rank()};
      c->all_reduce(std::span<int64_t>(v)).wait();
      int64_t expect = 0;
      for (int r : c->world_ranks()) expect += r;
      bad += v[0] != expect;
    }
    const auto co = grid.coord();
    std::printf("rank %d on %s (local %d/%d): tp %d pp %d dp %d  groups %s\n", world->rank(),
                grid.hosts()[static_cast<size_t>(world->rank())].c_str(), grid.local_rank(), grid.local_size(), co.tp,
                co.pp, co.dp, bad ? "WRONG" : "ok");
    return bad ? 1 : 0;
  } catch (const triax::Error& e) {
    std::fprintf(stderr, "hello_grid: %s\n", e.what());
    return 1;
  }
}
