// The Backend seam's CPU implementations: the element-wise and row ops against direct loops on
// random data, float32 and float64, allocator accounting, the checking backend computing the same
// bits, and the checking backend's point - a read of its buffer memory outside its calls kills
// the process with SIGSEGV and a message naming the buffer (run in a forked child).
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "triax/backend/backend.h"
#include "triax/distributed/comm/self_comm.h"
#include "triax/backend/comm_ops.h"

using namespace triax;
using Catch::Matchers::Contains;

namespace {

std::vector<float> rnd(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = u(g);
  return v;
}

Tensor up(Backend& be, const std::vector<float>& v) {
  Tensor t = be.empty(Shape{static_cast<int64_t>(v.size())}, DType::f32);
  from_host_f32(be, t, v);
  return t;
}

Tensor up_i32(Backend& be, const std::vector<int32_t>& v) {
  Tensor t = be.empty(Shape{static_cast<int64_t>(v.size())}, DType::i32);
  be.copy_from_host(t, v.data(), v.size() * sizeof(int32_t));
  return t;
}

// Runs a fixed sequence of ops and returns every result, for comparing two backends.
std::vector<std::vector<float>> run_ops(Backend& be) {
  const int N = 5, C = 7, T = 3;
  std::vector<std::vector<float>> out;
  Tensor x = up(be, rnd(N * C, 1)), y = up(be, rnd(N * C, 2)), b = up(be, rnd(C, 3)), wpe = up(be, rnd(T * C, 4));
  be.add_bias(x, b, N, C);
  out.push_back(to_host_f32(be, x));
  Tensor db = be.zeros(Shape{C}, DType::f32);
  be.bias_grad(db, y, N, C);
  out.push_back(to_host_f32(be, db));
  be.add_rows_periodic(x, wpe, N, C, 1, T);
  out.push_back(to_host_f32(be, x));
  Tensor dwpe = be.zeros(Shape{T * C}, DType::f32);
  be.sum_rows_periodic(dwpe, y, N, C, 2, T);
  out.push_back(to_host_f32(be, dwpe));
  be.axpy(x, 0.5, y);
  out.push_back(to_host_f32(be, x));
  be.scale(x, -2.0);
  out.push_back(to_host_f32(be, x));
  Tensor r = be.empty(Shape{N * C}, DType::f32);
  be.residual(r, x, y);
  out.push_back(to_host_f32(be, r));
  Tensor idx = up_i32(be, {4, 0, 0, 2});
  Tensor g = be.empty(Shape{4 * C}, DType::f32);
  be.gather_rows(g, y, idx, 4, C);
  out.push_back(to_host_f32(be, g));
  Tensor sc = up(be, {0.5f, -1.0f, 2.0f, 1.5f});
  Tensor acc = be.zeros(Shape{N * C}, DType::f32);
  be.scatter_add_rows(acc, g, idx, sc, 4, C);
  out.push_back(to_host_f32(be, acc));
  Tensor sr = be.empty(Shape{4 * C}, DType::f32);
  be.scale_rows(sr, g, sc, 4, C);
  out.push_back(to_host_f32(be, sr));
  Tensor dots = be.empty(Shape{4}, DType::f64);
  be.row_dots(dots, g, sr, 4, C);
  std::vector<double> hd(4);
  be.copy_to_host(hd.data(), dots, sizeof(double) * 4);
  out.emplace_back(hd.begin(), hd.end());
  Tensor sq = be.zeros(Shape{2}, DType::f64);
  be.sum_squares_into(sq, 1, y);
  be.count_nonfinite_into(sq, 0, y);
  std::vector<double> hs(2);
  be.copy_to_host(hs.data(), sq, sizeof hs[0] * 2);
  out.emplace_back(hs.begin(), hs.end());
  out.push_back({static_cast<float>(be.sum(y))});
  return out;
}

}  // namespace

TEST_CASE("cpu backend row and element-wise ops match direct loops", "[backend]") {
  auto be = make_cpu_backend();
  const int N = 5, C = 7, T = 3;
  const auto x0 = rnd(N * C, 1), y = rnd(N * C, 2), b = rnd(C, 3), wpe = rnd(T * C, 4);
  const auto got = run_ops(*be);
  std::vector<float> x = x0;
  for (int i = 0; i < N; ++i)
    for (int c = 0; c < C; ++c) x[i * C + c] += b[c];
  CHECK(got[0] == x);
  std::vector<float> db(C, 0.0f);
  for (int i = 0; i < N; ++i)
    for (int c = 0; c < C; ++c) db[c] += y[i * C + c];
  CHECK(got[1] == db);
  for (int i = 0; i < N; ++i)
    for (int c = 0; c < C; ++c) x[i * C + c] += wpe[((1 + i) % T) * C + c];
  CHECK(got[2] == x);
  std::vector<float> dwpe(T * C, 0.0f);
  for (int i = 0; i < N; ++i)
    for (int c = 0; c < C; ++c) dwpe[((2 + i) % T) * C + c] += y[i * C + c];
  CHECK(got[3] == dwpe);
  for (int i = 0; i < N * C; ++i) x[i] += 0.5f * y[i];
  CHECK(got[4] == x);
  for (auto& v : x) v *= -2.0f;
  CHECK(got[5] == x);
  std::vector<float> r(N * C);
  for (int i = 0; i < N * C; ++i) r[i] = x[i] + y[i];
  CHECK(got[6] == r);
  const int idx[4] = {4, 0, 0, 2};
  const float sc[4] = {0.5f, -1.0f, 2.0f, 1.5f};
  std::vector<float> g(4 * C), acc(N * C, 0.0f), sr(4 * C);
  for (int k = 0; k < 4; ++k)
    for (int c = 0; c < C; ++c) {
      g[k * C + c] = y[idx[k] * C + c];
      acc[idx[k] * C + c] += sc[k] * g[k * C + c];
      sr[k * C + c] = sc[k] * g[k * C + c];
    }
  CHECK(got[7] == g);
  CHECK(got[8] == acc);
  CHECK(got[9] == sr);
  for (int k = 0; k < 4; ++k) {
    double d = 0;
    for (int c = 0; c < C; ++c) d += double(g[k * C + c]) * sr[k * C + c];
    CHECK(got[10][k] == Approx(d).epsilon(1e-6));
  }
  double ss = 0, s = 0;
  for (float v : y) {
    ss += double(v) * v;
    s += v;
  }
  CHECK(got[11][0] == 0.0f);
  CHECK(got[11][1] == Approx(ss).epsilon(1e-6));
  CHECK(got[12][0] == Approx(s).epsilon(1e-6));
}

TEST_CASE("cpu backend refuses mismatched buffers with the op and the operand", "[backend]") {
  auto be = make_cpu_backend();
  Tensor a = be->zeros(Shape{8}, DType::f32), d = be->zeros(Shape{8}, DType::f64), small = be->zeros(Shape{3}, DType::f32);
  CHECK_THROWS_WITH(be->axpy(a, 1.0, d), Contains("axpy") && Contains("float64"));
  CHECK_THROWS_WITH(be->add_bias(a, small, 2, 4), Contains("add_bias") && Contains("b holds 3 elements, 4 needed"));
  CHECK_THROWS_WITH(be->linear_forward(a, a, a, Tensor(), 2, 4, 4), Contains("weight holds 8 elements, 16 needed"));
  Tensor idx = be->zeros(Shape{2}, DType::i32);
  const int32_t bad[2] = {0, 9};
  be->copy_from_host(idx, bad, sizeof bad);
  CHECK_THROWS_WITH(be->gather_rows(small, a, idx, 2, 1), Contains("row index 9"));
  CHECK_THROWS_WITH(make_cpu_backend(DType::bf16), Contains("float32 or float64"));
}

TEST_CASE("cpu backend counts its bytes: in use and high-water mark", "[backend]") {
  auto be = make_cpu_backend();
  const size_t base = be->bytes_in_use();
  {
    Tensor a = be->empty(Shape{1000}, DType::f32);
    Tensor b = be->empty(Shape{500}, DType::f64);
    CHECK(be->bytes_in_use() == base + 4000 + 4000);
  }
  CHECK(be->bytes_in_use() == base);
  CHECK(be->peak_bytes() >= base + 8000);
  be->reset_peak();
  CHECK(be->peak_bytes() == base);
}

TEST_CASE("the checking backend computes the same bits as the plain one", "[backend]") {
  auto plain = make_cpu_backend();
  auto checked = make_checked_cpu_backend();
  CHECK_FALSE(checked->host_accessible());
  CHECK(run_ops(*plain) == run_ops(*checked));
}

TEST_CASE("the checking backend opens a buffer for a communicator call until it completes", "[backend]") {
  auto checked = make_checked_cpu_backend();
  auto comm = checked->adapt(std::shared_ptr<Communicator>(make_self_communicator("self", 0)));
  Tensor a = up(*checked, {1, 2, 3, 4});
  Tensor b = checked->empty(Shape{4}, DType::f32);
  all_reduce(*comm, *checked, a, ReduceOp::sum).wait();
  Work s = send(*comm, *checked, a, 0, 5);
  recv(*comm, *checked, b, 0, 5).wait();
  s.wait();
  CHECK(to_host_f32(*checked, b) == std::vector<float>{1, 2, 3, 4});
}

TEST_CASE("the checking backend refuses the next call after a Work was dropped before it completed",
          "[backend]") {
  auto checked = make_checked_cpu_backend();
  auto comm = checked->adapt(std::shared_ptr<Communicator>(make_self_communicator("pp", 0)));
  Tensor a = up(*checked, {1, 2, 3, 4});
  Tensor b = checked->empty(Shape{4}, DType::f32);
  // Completed calls may go: one waited, one seen complete by test().
  {
    Work s = send(*comm, *checked, a, 0, 1);
    Work r = recv(*comm, *checked, b, 0, 1);
    while (!r.test()) {
    }
    s.wait();
  }
  comm->barrier().wait();
  // A receive still in flight (no send matches it) whose handle goes away: a missing wait.
  { Work lost = recv(*comm, *checked, b, 0, 9); }
  CHECK_THROWS_WITH(comm->barrier(), Contains("before barrier") && Contains("recv #") &&
                                         Contains("group 'pp'") &&
                                         Contains("destroyed before wait() or test() saw it complete"));
  comm->barrier().wait();  // said once; the communicator goes on
  // Overwriting a handle drops its call just the same.
  Work w = send(*comm, *checked, a, 0, 3);
  w = recv(*comm, *checked, b, 0, 3);
  w.wait();
  CHECK_THROWS_WITH(comm->barrier(), Contains("send #"));
  // While an exception unwinds, dropped handles are expected (the error is already on its way).
  CHECK_THROWS_AS(([&] {
                    Work pending = recv(*comm, *checked, b, 0, 11);
                    throw CommError("some failure");
                  }()),
                  CommError);
  comm->barrier().wait();
}

TEST_CASE("the checking backend faults on a read outside its calls, naming the buffer", "[backend]") {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(fds[1], 2);
    auto be = make_checked_cpu_backend();
    Tensor t = be->zeros(Shape{16}, DType::f32);
    volatile float v = t.data<float>()[3];  // model code must never do this
    (void)v;
    _exit(0);  // not reached when the check works
  }
  close(fds[1]);
  std::string err;
  char buf[512];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) err.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  INFO("child stderr: " << err);
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGSEGV);
  CHECK_THAT(err, Contains("triax checked backend: access to buffer memory") && Contains("-byte buffer at"));
}

TEST_CASE("count_nonfinite_into counts NaN and both infinities only, in f32 and f64", "[backend]") {
  auto be = make_cpu_backend();
  const float inf = std::numeric_limits<float>::infinity();
  // Finite extremes (largest, smallest denormal, -0) must not count; a 1 M+ tensor crosses the
  // f32 path's chunk boundary.
  std::vector<float> v(3 * (1u << 20) + 5, 1.0f);
  v[0] = std::numeric_limits<float>::max();
  v[1] = std::numeric_limits<float>::denorm_min();
  v[2] = -0.0f;
  v[7] = std::nanf("");
  v[(1u << 20) - 1] = inf;
  v[1u << 20] = -inf;
  v.back() = -std::nanf("");
  Tensor x = be->empty(Shape{static_cast<int64_t>(v.size())}, DType::f32);
  be->copy_from_host(x, v.data(), v.size() * sizeof(float));
  Tensor acc = be->zeros(Shape{2}, DType::f64);
  be->count_nonfinite_into(acc, 1, x);
  be->count_nonfinite_into(acc, 1, x.slice(8, static_cast<int64_t>(v.size()) - 1));  // inf, -inf only
  std::vector<double> d(v.begin(), v.begin() + 16);
  Tensor xd = be->empty(Shape{16}, DType::f64);
  be->copy_from_host(xd, d.data(), d.size() * sizeof(double));
  be->count_nonfinite_into(acc, 0, xd);  // max, denorm, -0 finite; the NaN at 7
  double h[2];
  be->copy_to_host(h, acc, sizeof h);
  CHECK(h[1] == 4 + 2);
  CHECK(h[0] == 1);
}

TEST_CASE("cast converts float32 <-> float64, copies the same type and refuses what the cpu cannot compute in",
          "[backend][cast]") {
  auto plain = make_cpu_backend();
  auto checked = make_checked_cpu_backend();
  for (Backend* be : {plain.get(), checked.get()}) {
    INFO(be->name());
    // Values a float32 cannot hold exactly, so the f64 -> f32 direction must round.
    const std::vector<double> d = {1.0 / 3.0, -2.0 / 7.0, 1e-40, 3.0e38, -0.0, 12345.678901234567};
    Tensor src64 = be->empty(Shape{6}, DType::f64);
    be->copy_from_host(src64, d.data(), d.size() * sizeof(double));
    Tensor dst32 = be->zeros(Shape{6}, DType::f32);
    be->cast(dst32, src64);
    const auto f = to_host_f32(*be, dst32);
    for (size_t i = 0; i < d.size(); ++i) {
      const float want = static_cast<float>(d[i]);
      CHECK(std::memcmp(&f[i], &want, sizeof(float)) == 0);
    }
    Tensor back64 = be->zeros(Shape{6}, DType::f64);
    be->cast(back64, dst32);
    std::vector<double> b(6);
    be->copy_to_host(b.data(), back64, b.size() * sizeof(double));
    for (size_t i = 0; i < d.size(); ++i) CHECK(b[i] == static_cast<double>(f[i]));
    // Same dtype: a bit-exact copy (NaN payloads included).
    std::vector<float> v = rnd(9, 11);
    v[4] = std::numeric_limits<float>::quiet_NaN();
    Tensor a = up(*be, v), c = be->zeros(Shape{9}, DType::f32);
    be->cast(c, a);
    const auto cv = to_host_f32(*be, c);
    CHECK(std::memcmp(cv.data(), v.data(), v.size() * sizeof(float)) == 0);
    // Refusals name the op and the types.
    Tensor h = be->empty(Shape{6}, DType::bf16);
    CHECK_THROWS_WITH(be->cast(h, dst32), Contains("cast") && Contains("bfloat16") && Contains("float32"));
    Tensor small = be->empty(Shape{5}, DType::f32);
    CHECK_THROWS_WITH(be->cast(small, src64), Contains("cast") && Contains("5 elements"));
  }
}
