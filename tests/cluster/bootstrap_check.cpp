// bootstrap_check: what a launcher gives a triax process. `bootstrap_check hostlist LIST` prints
// triax's expansion of a Slurm host list (compared with scontrol's by the Slurm test);
// `bootstrap_check` bootstraps, all-gathers "rank host local_rank" and prints one line per rank on
// rank 0 after checking that every rank took part exactly once.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <set>
#include <string>

#include "triax/distributed/bootstrap/bootstrap.h"
#include "triax/distributed/bootstrap/slurm.h"

int main(int argc, char** argv) {
  try {
    if (argc == 3 && std::string(argv[1]) == "hostlist") {
      for (const auto& h : triax::expand_slurm_hostlist(argv[2])) std::printf("%s\n", h.c_str());
      return 0;
    }
    auto boot = triax::Bootstrap::create();
    const std::string mine = fmt::format("{} {} {}", boot->rank(), triax::host_name(), boot->local_rank());
    const auto all = boot->all_gather(mine);
    if (static_cast<int>(all.size()) != boot->world_size()) {
      std::fprintf(stderr, "bootstrap_check: %zu contributions for world %d\n", all.size(), boot->world_size());
      return 1;
    }
    std::set<int> ranks;
    for (const auto& s : all) ranks.insert(std::stoi(s));
    if (static_cast<int>(ranks.size()) != boot->world_size() || *ranks.begin() != 0 || *ranks.rbegin() != boot->world_size() - 1) {
      std::fprintf(stderr, "bootstrap_check: ranks {%s} are not 0..%d\n", fmt::format("{}", fmt::join(ranks, ",")).c_str(),
                   boot->world_size() - 1);
      return 1;
    }
    if (boot->rank() == 0) {
      std::printf("launch %s world %d\n", std::string(triax::launch_kind_name(boot->kind())).c_str(), boot->world_size());
      for (const auto& s : all) std::printf("rank %s\n", s.c_str());
    }
    boot->barrier();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bootstrap_check: %s\n", e.what());
    return 1;
  }
}
