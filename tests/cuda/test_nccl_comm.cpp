// NCCL communicator on a GPU: every collective and dtype against closed forms of rank-derived
// inputs (exact in bf16/fp16 too), output buffers poisoned before each call, splits, stream
// ordering (input stream -> NCCL -> consumer stream) and the blocking mode. Written for any number
// of ranks (Bootstrap::create: one process without a launcher, torchrun-style env for more); CI
// has no GPU and runs only the [nogpu] error paths, then reports the test as skipped.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <thread>
#include <type_traits>

#include "support/cuda_buffer.h"
#include "triax/core/cuda_check.h"
#include "triax/core/gpu_count.h"
#include "triax/distributed/bootstrap/bootstrap.h"
#include "triax/distributed/comm/nccl_comm.h"
#include "triax/distributed/comm/self_comm.h"

#include <cublas_api.h>
#include <nccl.h>

using namespace triax;
using triax::test::DeviceBuffer;

namespace {

Bootstrap& boot() {
  static std::unique_ptr<Bootstrap> b = Bootstrap::create();
  return *b;
}

int my_device() { return boot().local_rank() % std::max(1, cuda_device_count()); }

std::unique_ptr<Communicator> make_world(NcclOptions opts = {}) {
  return make_nccl_communicator(boot(), my_device(), "world", opts);
}

NcclCommunicator& as_nccl(Communicator& c) { return dynamic_cast<NcclCommunicator&>(c); }

template <class T>
constexpr bool kHalf = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

template <class T>
T make(double v) {
  if constexpr (kHalf<T>) return T(static_cast<float>(v));
  else return static_cast<T>(v);
}
template <class T>
double value(T x) {
  if constexpr (kHalf<T>) return static_cast<float>(x);
  else return static_cast<double>(x);
}

// Rank-derived inputs: small positive integers, so sums over <= 8 ranks stay exact even in bf16.
double v(int rank, size_t i) { return 1.0 + static_cast<double>((i + 3 * static_cast<size_t>(rank)) % 11); }
// What rank `from` puts in element i of the block it sends to rank `to`.
double w(int from, int to, size_t i) {
  return 1.0 + static_cast<double>((5 * static_cast<size_t>(from) + 3 * static_cast<size_t>(to) + i) % 13);
}

double reduce(ReduceOp op, int n, bool is_int, auto&& f) {
  double acc = f(0);
  for (int r = 1; r < n; ++r) {
    const double x = f(r);
    acc = op == ReduceOp::max ? std::max(acc, x) : op == ReduceOp::min ? std::min(acc, x) : acc + x;
  }
  if (op == ReduceOp::avg) acc = is_int ? std::trunc(acc / n) : acc / n;
  return acc;
}

// Tolerance: exact, except a float average over a group size that is not a power of two (NCCL
// multiplies each input by 1/n before summing).
template <class T>
double tolerance(ReduceOp op, int n) {
  if (op != ReduceOp::avg || (n & (n - 1)) == 0 || !std::is_floating_point_v<T> && !kHalf<T>) return 0;
  if constexpr (std::is_same_v<T, bf16>) return 1.0 / 64;
  if constexpr (std::is_same_v<T, f16>) return 1.0 / 512;
  if constexpr (std::is_same_v<T, float>) return 1e-6;
  return 1e-12;
}

// Counts elements outside tolerance and reports the first, so one failure is one line.
template <class T>
void check_all(const std::vector<T>& got, auto&& expected, double tol, const std::string& what) {
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = expected(i), g = value(got[i]);
    if (!(std::abs(g - e) <= tol * std::abs(e))) {
      if (bad++ == 0) first = i;
    }
  }
  INFO(what << ": " << bad << " of " << got.size() << " wrong; first at " << first << ": got "
            << (bad ? value(got[first]) : 0.0) << ", expected " << (bad ? expected(first) : 0.0));
  CHECK(bad == 0);
}

void sleep_host_fn(void* ms) { std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<intptr_t>(ms))); }

}  // namespace

// ---------------- no GPU needed ----------------

TEST_CASE("a missing CUDA device is refused with the device count", "[nogpu]") {
  for (int dev : {-1, 9999}) {
    try {
      make_nccl_communicator(boot(), dev, "world");
      FAIL("no error for device " << dev);
    } catch (const DeviceError& e) {
      const std::string msg = e.what();
      INFO(msg);
      CHECK(msg.find(fmt::format("CUDA device {} does not exist", dev)) != std::string::npos);
      CHECK(msg.find("'world'") != std::string::npos);
      CHECK(msg.find("visible") != std::string::npos);
    }
  }
}

TEST_CASE("TRIAX_CHECK_{CUDA,NCCL,CUBLAS} throw DeviceError naming the expression and the code", "[nogpu]") {
  auto message = [](auto&& fn) {
    try {
      fn();
    } catch (const DeviceError& e) {
      return std::string(e.what());
    }
    return std::string("no exception");
  };
  const auto cuda = message([] { TRIAX_CHECK_CUDA(cudaErrorInvalidValue); });
  INFO(cuda);
  CHECK(cuda.find("cudaErrorInvalidValue") != std::string::npos);
  CHECK(cuda.find("`cudaErrorInvalidValue`") != std::string::npos);
  CHECK(cuda.find("test_nccl_comm.cpp:") != std::string::npos);
  const auto nccl = message([] { TRIAX_CHECK_NCCL(ncclInvalidArgument); });
  INFO(nccl);
  CHECK(nccl.find("NCCL error 4") != std::string::npos);
  CHECK(nccl.find("invalid argument") != std::string::npos);
  const auto cublas = message([] { TRIAX_CHECK_CUBLAS(CUBLAS_STATUS_NOT_INITIALIZED); });
  INFO(cublas);
  CHECK(cublas.find("CUBLAS_STATUS_NOT_INITIALIZED") != std::string::npos);
  // Success passes through without evaluating anything twice.
  int calls = 0;
  TRIAX_CHECK_CUDA((++calls, cudaSuccess));
  CHECK(calls == 1);
}

TEST_CASE("wait_on_stream refuses work of another backend", "[nogpu]") {
  auto self = make_self_communicator();
  Work work = self->barrier();
  CHECK_THROWS_AS(wait_on_stream(work, nullptr), ConfigError);
  CHECK_THROWS_AS(wait_on_stream(Work{}, nullptr), ConfigError);
}

// ---------------- GPU ----------------

TEMPLATE_TEST_CASE("all_reduce sum, avg, max, min match closed forms", "[gpu]", float, double, int32_t, int64_t, bf16,
                   f16) {
  using T = TestType;
  auto c = make_world();
  const int n = c->size(), me = c->rank();
  const bool is_int = std::is_integral_v<T>;
  for (size_t count : {size_t{1031}, size_t{1}, size_t{0}}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
      std::vector<T> h(count);
      for (size_t i = 0; i < count; ++i) h[i] = make<T>(v(me, i));
      DeviceBuffer<T> d(h);
      const uint64_t seq = c->calls();
      Work work = c->all_reduce(d.span(), op);
      CHECK(work.info().seq == seq);
      work.wait();
      check_all(d.download(), [&](size_t i) { return reduce(op, n, is_int, [&](int r) { return v(r, i); }); },
                tolerance<T>(op, n), fmt::format("all_reduce {} x {}", reduce_op_name(op), count));
    }
  }
}

TEMPLATE_TEST_CASE("reduce_scatter, all_gather, all_to_all, broadcast, batch ring", "[gpu]", float, double, int32_t,
                   int64_t, bf16, f16) {
  using T = TestType;
  auto c = make_world();
  const int n = c->size(), me = c->rank();
  const size_t block = 257;
  const auto N = static_cast<size_t>(n);

  SECTION("reduce_scatter sum and max") {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
      std::vector<T> h(N * block);
      for (size_t j = 0; j < h.size(); ++j) h[j] = make<T>(v(me, j));
      DeviceBuffer<T> in(h), out(block);
      out.poison();
      c->reduce_scatter(in.cspan(), out.span(), op).wait();
      check_all(out.download(),
                [&](size_t i) { return reduce(op, n, false, [&](int r) { return v(r, static_cast<size_t>(me) * block + i); }); },
                0, "reduce_scatter");
    }
  }
  SECTION("all_gather") {
    std::vector<T> h(block);
    for (size_t i = 0; i < block; ++i) h[i] = make<T>(v(me, i));
    DeviceBuffer<T> in(h), out(N * block);
    out.poison();
    c->all_gather(in.cspan(), out.span()).wait();
    check_all(out.download(), [&](size_t j) { return v(static_cast<int>(j / block), j % block); }, 0, "all_gather");
  }
  SECTION("all_to_all") {
    std::vector<T> h(N * block);
    for (size_t j = 0; j < h.size(); ++j) h[j] = make<T>(w(me, static_cast<int>(j / block), j % block));
    DeviceBuffer<T> in(h), out(N * block);
    out.poison();
    c->all_to_all(in.cspan(), out.span()).wait();
    check_all(out.download(), [&](size_t j) { return w(static_cast<int>(j / block), me, j % block); }, 0, "all_to_all");
  }
  SECTION("all_to_all_v, with zero counts") {
    for (int variant : {0, 1}) {
      // variant 0: 1..3 elements per pair; variant 1: some pairs (and with one rank, all) send nothing.
      auto count = [&](int from, int to) -> int64_t {
        return variant == 0 ? 1 + (from + 2 * to) % 3 : (from + to + 2 * n) % 3 == 2 ? 0 : (from * 7 + to) % 4;
      };
      std::vector<int64_t> sc(N), rc(N);
      for (int r = 0; r < n; ++r) {
        sc[static_cast<size_t>(r)] = count(me, r);
        rc[static_cast<size_t>(r)] = count(r, me);
      }
      std::vector<T> h;
      for (int r = 0; r < n; ++r)
        for (int64_t k = 0; k < sc[static_cast<size_t>(r)]; ++k) h.push_back(make<T>(w(me, r, static_cast<size_t>(k))));
      std::vector<double> expect;
      for (int r = 0; r < n; ++r)
        for (int64_t k = 0; k < rc[static_cast<size_t>(r)]; ++k) expect.push_back(w(r, me, static_cast<size_t>(k)));
      DeviceBuffer<T> in(h), out(expect.size());
      out.poison();
      c->all_to_all_v(in.cspan(), std::span<const int64_t>(sc), out.span(), std::span<const int64_t>(rc)).wait();
      check_all(out.download(), [&](size_t j) { return expect[j]; }, 0, fmt::format("all_to_all_v variant {}", variant));
    }
  }
  SECTION("broadcast from the last rank") {
    const int root = n - 1;
    DeviceBuffer<T> d(block);
    if (me == root) {
      std::vector<T> h(block);
      for (size_t i = 0; i < block; ++i) h[i] = make<T>(v(root, i));
      d.upload(h);
    } else {
      d.poison();
    }
    c->broadcast(d.span(), root).wait();
    check_all(d.download(), [&](size_t i) { return v(root, i); }, 0, "broadcast");
  }
  SECTION("batch_send_recv around the ring, two dtypes in one batch") {
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    std::vector<T> h(block);
    for (size_t i = 0; i < block; ++i) h[i] = make<T>(v(me, i));
    std::vector<int64_t> h64(block / 2);
    for (size_t i = 0; i < h64.size(); ++i) h64[i] = 1000 * me + static_cast<int64_t>(i);
    DeviceBuffer<T> sbuf(h), rbuf(block);
    DeviceBuffer<int64_t> s64(h64), r64(h64.size());
    rbuf.poison();
    r64.poison();
    const P2POp ops[] = {P2POp::send<T>(sbuf.cspan(), next), P2POp::recv<T>(rbuf.span(), prev),
                         P2POp::send<int64_t>(s64.cspan(), next), P2POp::recv<int64_t>(r64.span(), prev)};
    c->batch_send_recv(ops).wait();
    check_all(rbuf.download(), [&](size_t i) { return v(prev, i); }, 0, "batch ring");
    check_all(r64.download(), [&](size_t i) { return 1000.0 * prev + static_cast<double>(i); }, 0, "batch ring int64");
  }
  SECTION("send and recv between ranks 0 and 1 (needs two ranks)") {
    if (n < 2) return;  // an unmatched send to oneself outside a group is not allowed by NCCL
    DeviceBuffer<T> d(block);
    if (me == 0) {
      std::vector<T> h(block);
      for (size_t i = 0; i < block; ++i) h[i] = make<T>(v(0, i));
      d.upload(h);
      c->send(d.cspan(), 1).wait();
    } else if (me == 1) {
      d.poison();
      c->recv(d.span(), 0).wait();
      check_all(d.download(), [&](size_t i) { return v(0, i); }, 0, "recv");
    }
  }
}

TEST_CASE("barrier and call numbering", "[gpu]") {
  auto c = make_world();
  CHECK(c->backend() == CommBackend::nccl);
  CHECK(c->name() == "world");
  c->barrier().wait();
  c->barrier().wait();
  CHECK(c->calls() == 2);
  DeviceBuffer<float> d(std::vector<float>(16, 1.0f));
  Work a = c->all_reduce(d.span());
  Work b = c->barrier();
  CHECK(a.info().seq == 2);
  CHECK(b.info().seq == 3);
  CHECK(b.info().op == "barrier");
  // Two calls in flight, completed in reverse order of waiting.
  b.wait();
  a.wait();
  check_all(d.download(), [&](size_t) { return static_cast<double>(c->size()); }, 0, "all_reduce of ones");
}

TEST_CASE("split by parity, reverse key order; NOCOLOR gives nullptr", "[gpu]") {
  auto c = make_world();
  const int n = c->size(), me = c->rank();
  const uint64_t before = c->calls();
  auto sub = c->split(me % 2, -me, "parity");
  CHECK(c->calls() == before + 1);  // the (color, key, world rank) exchange is one call
  REQUIRE(sub);
  CHECK(sub->backend() == CommBackend::nccl);
  CHECK(sub->name() == "parity");
  std::vector<int> expect;  // same parity, descending (key = -rank)
  for (int r = n - 1; r >= 0; --r)
    if (r % 2 == me % 2) expect.push_back(r);
  CHECK(sub->world_ranks() == expect);
  CHECK(sub->size() == static_cast<int>(expect.size()));
  CHECK(sub->world_rank() == me);
  CHECK(sub->timeout() == c->timeout());

  DeviceBuffer<int64_t> d(std::vector<int64_t>(33, me + 1));
  sub->all_reduce(d.span()).wait();
  int64_t sum = 0;
  for (int r : expect) sum += r + 1;
  check_all(d.download(), [&](size_t) { return static_cast<double>(sum); }, 0, "all_reduce on the split");

  // A split of the split, and a split that nobody joins.
  auto again = sub->split(0, sub->rank(), "again");
  REQUIRE(again);
  CHECK(again->world_ranks() == expect);
  CHECK(c->split(-1, 0, "none") == nullptr);
  // Splits where only some ranks join: rank 0 alone.
  auto lone = c->split(me == 0 ? 0 : -1, 0, "lone");
  CHECK((lone != nullptr) == (me == 0));
  if (lone) {
    CHECK(lone->size() == 1);
    lone->barrier().wait();
  }
}

TEST_CASE("the NCCL stream waits for the input stream; wait_on_stream orders a consumer", "[gpu]") {
  auto c = make_world();
  auto& nc = as_nccl(*c);
  const int n = c->size(), me = c->rank();
  const size_t count = 4096;
  cudaStream_t compute = nullptr, consumer = nullptr;
  TRIAX_CHECK_CUDA(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  TRIAX_CHECK_CUDA(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));
  float *h_in = nullptr, *h_out = nullptr;  // pinned, so the copies are truly asynchronous
  TRIAX_CHECK_CUDA(cudaMallocHost(reinterpret_cast<void**>(&h_in), count * sizeof(float)));
  TRIAX_CHECK_CUDA(cudaMallocHost(reinterpret_cast<void**>(&h_out), count * n * sizeof(float)));
  for (size_t i = 0; i < count; ++i) h_in[i] = static_cast<float>(v(me, i));
  DeviceBuffer<float> in(count), out(count * static_cast<size_t>(n));
  in.poison();
  out.poison();

  // The input only arrives after 300 ms of host work on the compute stream.
  TRIAX_CHECK_CUDA(cudaLaunchHostFunc(compute, sleep_host_fn, reinterpret_cast<void*>(intptr_t{300})));
  TRIAX_CHECK_CUDA(cudaMemcpyAsync(in.data(), h_in, count * sizeof(float), cudaMemcpyHostToDevice, compute));
  nc.set_input_stream(compute);
  CHECK(nc.input_stream() == compute);
  const auto t0 = std::chrono::steady_clock::now();
  Work work = c->all_gather(in.cspan(), out.span());
  const auto issue = std::chrono::steady_clock::now() - t0;
  CHECK(issue < std::chrono::milliseconds(200));  // issuing does not wait for the input
  CHECK_FALSE(work.test());                        // ... and the call is not done yet

  wait_on_stream(work, consumer);
  TRIAX_CHECK_CUDA(cudaMemcpyAsync(h_out, out.data(), out.size() * sizeof(float), cudaMemcpyDeviceToHost, consumer));
  TRIAX_CHECK_CUDA(cudaStreamSynchronize(consumer));
  std::vector<float> got(h_out, h_out + out.size());
  check_all(got, [&](size_t j) { return v(static_cast<int>(j / count), j % count); }, 0,
            "all_gather read by the consumer stream");
  work.wait();
  CHECK(work.test());

  nc.set_input_stream(nullptr);
  TRIAX_CHECK_CUDA(cudaFreeHost(h_in));
  TRIAX_CHECK_CUDA(cudaFreeHost(h_out));
  TRIAX_CHECK_CUDA(cudaStreamDestroy(compute));
  TRIAX_CHECK_CUDA(cudaStreamDestroy(consumer));
}

TEST_CASE("blocking mode runs the same calls", "[gpu]") {
  NcclOptions opts;
  opts.blocking = true;
  opts.timeout = std::chrono::seconds(60);
  auto c = make_world(opts);
  CHECK(c->timeout() == std::chrono::seconds(60));
  const int n = c->size(), me = c->rank();
  DeviceBuffer<bf16> d(std::vector<bf16>(100, bf16(static_cast<float>(me + 1))));
  c->all_reduce(d.span(), ReduceOp::sum).wait();
  check_all(d.download(), [&](size_t) { return n * (n + 1) / 2.0; }, 0, "blocking all_reduce");
  auto sub = c->split(0, me, "all");
  REQUIRE(sub);
  sub->barrier().wait();
}

TEST_CASE("uint8 moves but does not reduce", "[gpu]") {
  auto c = make_world();
  const int n = c->size(), me = c->rank();
  std::vector<unsigned char> h(64);
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<unsigned char>(me * 16 + i % 16);
  DeviceBuffer<unsigned char> in(h), out(h.size() * static_cast<size_t>(n));
  c->all_gather(in.cspan(), out.span()).wait();
  const auto got = out.download();
  for (size_t j = 0; j < got.size(); ++j) REQUIRE(got[j] == (j / h.size()) * 16 + j % 16);
  CHECK_THROWS_AS(c->all_reduce(in.span()), CommError);
}
