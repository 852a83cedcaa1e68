// NCCL error and timeout paths on a GPU, in their own executable because they abort NCCL
// communicators: an argument error NCCL reports at enqueue, and a call whose input never becomes
// ready in time. Each must raise an error naming the call, its sequence number and the group,
// abort the NCCL communicator, poison the triax communicator, and leave the device usable.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "support/cuda_buffer.h"
#include "triax/core/cuda_check.h"
#include "triax/distributed/bootstrap/bootstrap.h"
#include "triax/distributed/comm/nccl_comm.h"

using namespace triax;
using triax::test::DeviceBuffer;

namespace {

// NCCL checks that buffers are device memory only when asked; it reads the variable when a
// communicator is created, so set it before main.
const bool kCheckPointers = [] {
  setenv("NCCL_CHECK_POINTERS", "1", 1);
  return true;
}();

std::unique_ptr<Communicator> make_world(std::chrono::milliseconds timeout) {
  static std::unique_ptr<Bootstrap> boot = make_single_bootstrap();
  NcclOptions opts;
  opts.timeout = timeout;
  return make_nccl_communicator(*boot, 0, "world", opts);
}

void sleep_host_fn(void* ms) { std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<intptr_t>(ms))); }

// The device still runs ordinary work after an abort.
void check_device_usable() {
  DeviceBuffer<int> d(std::vector<int>{1, 2, 3});
  CHECK(d.download() == std::vector<int>{1, 2, 3});
  CHECK(cudaGetLastError() == cudaSuccess);
}

}  // namespace

TEST_CASE("an argument error reported by NCCL aborts and poisons the communicator", "[gpu]") {
  REQUIRE(kCheckPointers);
  auto c = make_world(std::chrono::seconds(30));
  auto& nc = dynamic_cast<NcclCommunicator&>(*c);
  c->barrier().wait();  // seq 0
  std::vector<float> host(64, 1.0f);  // host memory: NCCL_CHECK_POINTERS makes NCCL refuse it
  try {
    Work work = c->all_reduce(std::span<float>(host));
    work.wait();
    FAIL("no error for a host pointer");
  } catch (const TimeoutError& e) {
    FAIL("a timeout instead of an argument error: " << e.what());
  } catch (const CommError& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("all_reduce #1") != std::string::npos);
    CHECK(msg.find("group 'world'") != std::string::npos);
    CHECK(msg.find("world rank 0") != std::string::npos);
    CHECK(msg.find("aborted") != std::string::npos);
  }
  CHECK(c->poisoned());
  CHECK(nc.aborted());
  CHECK(nc.handle() == nullptr);
  CHECK_THROWS_WITH(c->barrier(), Catch::Contains("cannot be used again"));
  check_device_usable();
}

TEST_CASE("a call whose input is late times out, aborts, and the device stays usable", "[gpu]") {
  auto c = make_world(std::chrono::milliseconds(300));
  auto& nc = dynamic_cast<NcclCommunicator&>(*c);
  cudaStream_t compute = nullptr;
  TRIAX_CHECK_CUDA(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  DeviceBuffer<float> d(std::vector<float>(256, 2.0f));
  // The input stream is busy for 1.5 s: far past the 0.3 s timeout.
  TRIAX_CHECK_CUDA(cudaLaunchHostFunc(compute, sleep_host_fn, reinterpret_cast<void*>(intptr_t{1500})));
  nc.set_input_stream(compute);
  Work work = c->all_reduce(d.span());
  const auto t0 = std::chrono::steady_clock::now();
  try {
    work.wait();
    FAIL("no timeout");
  } catch (const TimeoutError& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("all_reduce #0") != std::string::npos);
    CHECK(msg.find("group 'world'") != std::string::npos);
    CHECK(msg.find("timed out after 0.300 s") != std::string::npos);
  }
  const auto waited = std::chrono::steady_clock::now() - t0;
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(waited).count();
  std::printf("timeout after %lld ms (0.3 s timeout + ncclCommAbort; the input stream was busy for 1.5 s)\n",
              static_cast<long long>(ms));
  CHECK(waited >= std::chrono::milliseconds(300));
  CHECK(waited < std::chrono::seconds(10));  // the abort itself is bounded
  CHECK(c->poisoned());
  CHECK(nc.aborted());
  CHECK_THROWS_AS(work.wait(), CommError);  // the handle reports the abort, not success
  CHECK_THROWS_WITH(c->all_reduce(d.span()), Catch::Contains("cannot be used again"));
  TRIAX_CHECK_CUDA(cudaStreamSynchronize(compute));
  TRIAX_CHECK_CUDA(cudaStreamDestroy(compute));
  c.reset();  // destroying an aborted communicator neither hangs nor throws
  check_device_usable();
}
