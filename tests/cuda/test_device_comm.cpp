// The device communicator (cuda/device_comm.h). Without a GPU ([nogpu], runs in CI): host spans
// pass through to the wrapped host communicator unchanged on every call kind (results equal the
// host communicator's own), split() keeps the wrapper, and wrapping twice is refused. With a GPU:
// device spans on NCCL and on the staged path give the host path's results, the compute stream is
// ordered after the call (a consumer kernel-free check: a copy enqueued on it after wait() sees
// the result), and a call mixing host and device buffers is a ConfigError naming the call.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <numeric>

#include "support/cuda_buffer.h"
#include "triax/core/cuda_check.h"
#include "triax/core/gpu_count.h"
#include "triax/cuda/device_comm.h"
#include "triax/distributed/comm/self_comm.h"

using namespace triax;
using triax::test::DeviceBuffer;

namespace {

std::shared_ptr<Communicator> host_world() { return make_self_communicator("world", 0); }

std::vector<float> iota_f(size_t n, float start) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

}  // namespace

TEST_CASE("device comm: host spans pass through to the host communicator", "[nogpu]") {
  // Staged: no NCCL is built, so this needs no device (host spans never touch CUDA).
  auto c = cuda::make_device_communicator(host_world(), cuda::DeviceCommOptions{0, nullptr, cuda::DevicePath::staged});
  REQUIRE(c->size() == 1);
  CHECK(c->name() == "world");
  CHECK(c->backend() == CommBackend::self);
  CHECK_FALSE(cuda::has_nccl(*c));

  std::vector<float> a = iota_f(7, 1.0f);
  c->all_reduce(std::span<float>(a), ReduceOp::sum).wait();
  CHECK(a == iota_f(7, 1.0f));  // one rank: the sum is the input

  std::vector<float> g(7, -1.0f);
  c->all_gather(std::span<const float>(a), std::span<float>(g)).wait();
  CHECK(g == a);

  std::vector<double> rs_in = {1.5, 2.5, 3.5}, rs_out(3, 0.0);
  c->reduce_scatter(std::span<const double>(rs_in), std::span<double>(rs_out), ReduceOp::sum).wait();
  CHECK(rs_out == rs_in);

  std::vector<int64_t> counts = {4};
  std::vector<int32_t> v_in = {9, 8, 7, 6}, v_out(4, 0);
  c->all_to_all_v(std::span<const int32_t>(v_in), std::span<const int64_t>(counts), std::span<int32_t>(v_out),
                  std::span<const int64_t>(counts))
      .wait();
  CHECK(v_out == v_in);

  std::vector<uint8_t> b = {1, 2, 3};
  c->broadcast(std::span<uint8_t>(b), 0).wait();
  CHECK(b == std::vector<uint8_t>{1, 2, 3});

  // A send to oneself and its receive in one batch (Self matches them by tag).
  std::vector<float> s = {4.0f, 5.0f}, r(2, 0.0f);
  const P2POp ops[] = {P2POp::send(std::span<const float>(s), 0, 3), P2POp::recv(std::span<float>(r), 0, 3)};
  c->batch_send_recv(std::span<const P2POp>(ops)).wait();
  CHECK(r == s);

  c->barrier().wait();
  // Every call is numbered on the wrapper (the host communicator numbers its own as well).
  CHECK(c->calls() == 7);
  CHECK(cuda::memory_place(a.data()) == cuda::MemoryPlace::host);
  CHECK(cuda::memory_place(nullptr) == cuda::MemoryPlace::host);
  cuda::poll(*c);                    // nothing outstanding
  cuda::settle_device_waits(nullptr);  // nor for the (default) stream of this family
}

TEST_CASE("device comm: split keeps both halves; wrapping twice is refused", "[nogpu]") {
  auto c = cuda::make_device_communicator(host_world(), cuda::DeviceCommOptions{0, nullptr, cuda::DevicePath::staged});
  auto sub = c->split(0, 0, "tp");
  REQUIRE(sub);
  CHECK(sub->name() == "tp");
  std::vector<double> x = {2.0, 3.0};
  sub->all_reduce(std::span<double>(x), ReduceOp::max).wait();
  CHECK(x == std::vector<double>{2.0, 3.0});
  CHECK(c->split(-1, 0, "none") == nullptr);
  CHECK_THROWS_WITH(cuda::make_device_communicator(c, cuda::DeviceCommOptions{}),
                    Catch::Contains("is a device communicator already"));
}

TEST_CASE("device comm: TRIAX_DEVICE_COMM picks the device path", "[nogpu]") {
  ::unsetenv("TRIAX_DEVICE_COMM");
  CHECK(cuda::device_path_from_env() == cuda::DevicePath::nccl);
  ::setenv("TRIAX_DEVICE_COMM", "staged", 1);
  CHECK(cuda::device_path_from_env() == cuda::DevicePath::staged);
  ::setenv("TRIAX_DEVICE_COMM", "mpi", 1);
  CHECK_THROWS_WITH(cuda::device_path_from_env(), Catch::Contains("TRIAX_DEVICE_COMM") && Catch::Contains("staged"));
  ::unsetenv("TRIAX_DEVICE_COMM");
}

namespace {

void device_round_trip(cuda::DevicePath path) {
  cudaStream_t stream = nullptr;
  TRIAX_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto c = cuda::make_device_communicator(host_world(), cuda::DeviceCommOptions{0, stream, path});
  CHECK(cuda::has_nccl(*c) == (path == cuda::DevicePath::nccl));

  const auto src = iota_f(1031, 0.5f);
  DeviceBuffer<float> in(src), out(src.size());
  out.poison();
  // all_gather over one rank: out = in, read back on the compute stream after wait().
  Work w = c->all_gather(in.cspan(), out.span());
  w.wait();
  cuda::settle_device_waits(stream);  // the host waits (with the deadline) before it reads back
  std::vector<float> host(src.size(), 0.0f);
  TRIAX_CHECK_CUDA(cudaMemcpyAsync(host.data(), out.data(), host.size() * sizeof(float), cudaMemcpyDeviceToHost, stream));
  TRIAX_CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK(host == src);

  // test() is the plain question; once it (or wait()) says complete, the result is ordered.
  Work t = c->all_gather(in.cspan(), out.span());
  while (!t.test()) {
  }
  // all_reduce in place (sum over one rank) and a reduce_scatter into a poisoned output.
  c->all_reduce(in.span(), ReduceOp::sum).wait();
  DeviceBuffer<float> rs(src.size());
  rs.poison();
  c->reduce_scatter(in.cspan(), rs.span(), ReduceOp::sum).wait();
  TRIAX_CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK(rs.download() == src);

  // Host and device buffers in one call.
  std::vector<float> h(src.size());
  CHECK_THROWS_WITH(c->all_gather(in.cspan(), std::span<float>(h)),
                    Catch::Contains("all_gather #") && Catch::Contains("not both"));
  cuda::poll(*c);
  c.reset();
  TRIAX_CHECK_CUDA(cudaStreamDestroy(stream));
}

}  // namespace

TEST_CASE("device comm: device spans on NCCL", "[gpu]") {
  DeviceBuffer<float> probe(4);
  CHECK(cuda::memory_place(probe.data()) == cuda::MemoryPlace::device);
  device_round_trip(cuda::DevicePath::nccl);
}

TEST_CASE("device comm: device spans staged through pinned host memory", "[gpu]") {
  device_round_trip(cuda::DevicePath::staged);
}
