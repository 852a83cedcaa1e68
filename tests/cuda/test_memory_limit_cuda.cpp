// available_memory on a GPU: cudaMemGetInfo's free bytes, within the device's total and down by
// about what a live allocation holds; TRIAX_MEMORY_LIMIT_MIB still replaces it. Needs a GPU
// (tests/support/cuda_main.cpp skips without one).
#include <catch2/catch.hpp>
#include <cuda_runtime_api.h>

#include <cstdlib>

#include "triax/core/memory_limit.h"

using namespace triax;

TEST_CASE("available_memory(cuda:0) is cudaMemGetInfo's free memory", "[cuda]") {
  ::unsetenv("TRIAX_MEMORY_LIMIT_MIB");
  size_t free_b = 0, total_b = 0;
  REQUIRE(cudaMemGetInfo(&free_b, &total_b) == cudaSuccess);
  const MemoryLimit before = available_memory(Device::cuda(0));
  REQUIRE(before.bytes);
  CHECK(*before.bytes <= total_b);
  CHECK(before.source.find("cudaMemGetInfo on cuda:0") == 0);
  // 1 GiB allocated: the free memory drops by at least most of it (other processes may allocate too).
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, size_t{1} << 30) == cudaSuccess);
  const MemoryLimit during = available_memory(Device::cuda(0));
  cudaFree(p);
  REQUIRE(during.bytes);
  CHECK(*during.bytes + (size_t{1} << 29) < *before.bytes);
  ::setenv("TRIAX_MEMORY_LIMIT_MIB", "7", 1);
  CHECK(available_memory(Device::cuda(0)).bytes == uint64_t{7} << 20);
  ::unsetenv("TRIAX_MEMORY_LIMIT_MIB");
}
