// Catch2 main for CUDA tests. With a GPU it runs everything. Without one (CI, no driver) it runs
// only the tests tagged [nogpu] (error paths that need no device) and then exits 77, which ctest
// reports as "skipped": a machine without a GPU never reports the device tests as passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include "triax/core/gpu_count.h"

int main(int argc, char** argv) {
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  std::string why;
  if (triax::cuda_device_count(&why) > 0) return session.run();
  std::printf("skipped: no GPU (%s); running only the [nogpu] checks of this CUDA test\n", why.c_str());
  std::fflush(stdout);
  auto data = session.configData();
  data.testsOrTags = {"[nogpu]"};
  session.useConfigData(data);
  const int rc = session.run();
  return rc != 0 ? rc : 77;
}
