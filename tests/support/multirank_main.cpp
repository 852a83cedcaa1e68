// Catch2 main for multi-rank tests: bootstraps (mpirun or single process), runs the session on
// every rank, and makes the process exit status non-zero if any rank failed, so mpirun reports it.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "support/multirank.h"
#include "triax/core/log.h"

namespace triax::test {
namespace {
std::unique_ptr<Bootstrap> g_boot;
std::shared_ptr<Communicator> g_world;
}  // namespace
Bootstrap& bootstrap() { return *g_boot; }
Communicator& world() { return *g_world; }
std::shared_ptr<Communicator> world_ptr() { return g_world; }
}  // namespace triax::test

int main(int argc, char** argv) {
  using namespace triax;
  int failed = 0;
  try {
    test::g_boot = Bootstrap::create();
    test::g_world = test::g_boot->world();
    log::set_rank(test::g_world->rank());
    // The Gloo runs (tests/CMakeLists.txt: triax_add_gloo_runs) say which backend they test.
    if (const char* want = std::getenv("TRIAX_TEST_EXPECT_BACKEND"); want && *want &&
        backend_name(test::g_world->backend()) != want) {
      std::fprintf(stderr, "dist test main: the world communicator's backend is %s, expected %s\n",
                   std::string(backend_name(test::g_world->backend())).c_str(), want);
      return 2;
    }
    Catch::Session session;
    if (int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
    failed = session.run();
    // Every rank learns whether any rank failed, so all exit alike.
    int any[1] = {failed ? 1 : 0};
    test::g_world->all_reduce(std::span<int>(any), ReduceOp::max).wait();
    if (any[0] && !failed) std::fprintf(stderr, "rank %d: another rank failed\n", test::g_world->rank());
    failed = any[0];
    test::g_world.reset();
    test::g_boot.reset();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dist test main: %s\n", e.what());
    return 2;
  }
  return failed ? 1 : 0;
}
