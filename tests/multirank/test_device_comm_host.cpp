// The device communicator (cuda/device_comm.h) over a real host communicator (MPI under mpirun,
// Gloo without): host spans of every call kind pass through it with the results of the host
// communicator itself (closed forms of rank-derived inputs), across ranks, and split() gives groups
// that do the same. CUDA builds only; needs no GPU (host spans never reach CUDA), so it runs in CI.
#include <catch2/catch.hpp>

#include <numeric>

#include "support/multirank.h"
#include "triax/cuda/device_comm.h"

using namespace triax;

namespace {
std::shared_ptr<Communicator> device_world() {
  static auto c =
      cuda::make_device_communicator(test::world_ptr(), cuda::DeviceCommOptions{0, nullptr, cuda::DevicePath::staged});
  return c;
}
}  // namespace

TEST_CASE("device comm over the host communicator: collectives on host spans", "[comm][cuda]") {
  auto c = device_world();
  const int n = c->size(), r = c->rank();
  REQUIRE(n == test::world().size());
  CHECK(c->backend() == test::world().backend());

  std::vector<double> a = {1.0 + r, 10.0 * r};
  c->all_reduce(std::span<double>(a), ReduceOp::sum).wait();
  CHECK(a[0] == n + n * (n - 1) / 2.0);
  CHECK(a[1] == 10.0 * n * (n - 1) / 2.0);

  int32_t mx = 3 * r;
  c->all_reduce(std::span<int32_t>(&mx, 1), ReduceOp::max).wait();
  CHECK(mx == 3 * (n - 1));

  std::vector<float> mine = {float(r), float(r) + 0.5f}, all(2 * static_cast<size_t>(n), -1.0f);
  c->all_gather(std::span<const float>(mine), std::span<float>(all)).wait();
  for (int q = 0; q < n; ++q) {
    CHECK(all[2 * q] == float(q));
    CHECK(all[2 * q + 1] == float(q) + 0.5f);
  }

  // reduce_scatter: block q of rank p holds p + q; rank r receives the sum over p of p + r.
  std::vector<int64_t> rs_in(static_cast<size_t>(n)), rs_out(1, -1);
  for (int q = 0; q < n; ++q) rs_in[q] = r + q;
  c->reduce_scatter(std::span<const int64_t>(rs_in), std::span<int64_t>(rs_out), ReduceOp::sum).wait();
  CHECK(rs_out[0] == int64_t(n) * (n - 1) / 2 + int64_t(n) * r);

  // all_to_all_v: rank p sends q + 1 copies of 100 p + q to rank q.
  std::vector<int64_t> sc(static_cast<size_t>(n)), rc(static_cast<size_t>(n), r + 1);
  std::vector<int32_t> send, recv(static_cast<size_t>((r + 1) * n), -1);
  for (int q = 0; q < n; ++q) {
    sc[q] = q + 1;
    for (int k = 0; k <= q; ++k) send.push_back(100 * r + q);
  }
  c->all_to_all_v(std::span<const int32_t>(send), std::span<const int64_t>(sc), std::span<int32_t>(recv),
                  std::span<const int64_t>(rc))
      .wait();
  for (int p = 0; p < n; ++p)
    for (int k = 0; k <= r; ++k) CHECK(recv[static_cast<size_t>(p * (r + 1) + k)] == 100 * p + r);

  std::vector<uint8_t> b = {uint8_t(r), uint8_t(7)};
  c->broadcast(std::span<uint8_t>(b), n - 1).wait();
  CHECK(b[0] == uint8_t(n - 1));

  // A ring of sends and receives: each rank receives its left neighbour's rank.
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  std::vector<float> out = {float(r)}, in = {-1.0f};
  const P2POp ops[] = {P2POp::send(std::span<const float>(out), right, 5), P2POp::recv(std::span<float>(in), left, 5)};
  c->batch_send_recv(std::span<const P2POp>(ops)).wait();
  CHECK(in[0] == float(left));
  c->barrier().wait();
}

TEST_CASE("device comm over the host communicator: split groups", "[comm][cuda]") {
  auto c = device_world();
  const int r = c->rank();
  auto sub = c->split(r % 2, -r, "parity");  // reversed keys: the highest rank first
  REQUIRE(sub);
  CHECK(sub->name() == "parity");
  int64_t v = r;
  sub->all_reduce(std::span<int64_t>(&v, 1), ReduceOp::sum).wait();
  int64_t expect = 0;
  for (int q = r % 2; q < c->size(); q += 2) expect += q;
  CHECK(v == expect);
  CHECK(sub->world_rank() == r);
  CHECK(c->split(-1, 0, "none") == nullptr);
}
