// The off-by-default GEMM observer (ops/gemm.h) that step_bench uses: it sees every call with its
// exact shape, transposes, leading dimensions, beta and precision, from every thread of an OpenMP
// region; nothing is reported once it is removed; and observing never changes a result's bits.
#include <catch2/catch.hpp>
#include <omp.h>

#include <cstring>
#include <mutex>
#include <random>
#include <vector>

#include "triax/ops/attention.h"
#include "triax/ops/gemm.h"

using namespace triax::ops;

namespace {

class Log final : public GemmObserver {
 public:
  void on_gemm(const GemmCall& c) noexcept override {
    std::lock_guard<std::mutex> lock(mu);
    calls.push_back(c);
  }
  std::mutex mu;
  std::vector<GemmCall> calls;
};

struct Installed {
  explicit Installed(GemmObserver* o) { set_gemm_observer(o); }
  ~Installed() { set_gemm_observer(nullptr); }
};

std::vector<float> randoms(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = u(g);
  return v;
}

}  // namespace

TEST_CASE("the gemm observer reports each call's shape and precision, and nothing once removed") {
  const int M = 5, N = 7, K = 3;
  auto A = randoms(size_t(K) * 9, 1), B = randoms(size_t(N) * 4, 2), C = randoms(size_t(M) * 11, 3);
  auto C0 = C;
  Log log;
  {
    Installed on(&log);
    // A transposed (K, M) with lda 9, B transposed (N, K) with ldb 4, C (M, N) with ldc 11, beta 1.
    gemm<float>(Trans::yes, Trans::yes, M, N, K, 1.0f, A.data(), 9, B.data(), 4, 1.0f, C.data(), 11);
    std::vector<double> a(6, 0.5), b(6, 0.25), c(4, 0.0);
    gemm<double>(Trans::no, Trans::no, 2, 2, 3, 1.0, a.data(), 3, b.data(), 2, 0.0, c.data(), 2);
    CHECK(c[0] == Approx(0.375));
    gemm<float>(Trans::no, Trans::no, 0, N, K, 1.0f, A.data(), 9, B.data(), N, 0.0f, C.data(), 11);  // empty: no call
  }
  REQUIRE(log.calls.size() == 2);
  const auto& f = log.calls[0];
  CHECK((f.ta == Trans::yes && f.tb == Trans::yes));
  CHECK((f.M == M && f.N == N && f.K == K && f.lda == 9 && f.ldb == 4 && f.ldc == 11));
  CHECK(f.accumulate);
  CHECK_FALSE(f.is_double);
  CHECK(f.team_size == 1);
  CHECK(f.seconds >= 0.0);
  const auto& d = log.calls[1];
  CHECK((d.ta == Trans::no && d.M == 2 && d.N == 2 && d.K == 3 && !d.accumulate && d.is_double));

  // Removed: further calls are not reported, and the observed call gave the same bits as an
  // unobserved one.
  auto C1 = C0;
  gemm<float>(Trans::yes, Trans::yes, M, N, K, 1.0f, A.data(), 9, B.data(), 4, 1.0f, C1.data(), 11);
  CHECK(log.calls.size() == 2);
  CHECK(std::memcmp(C.data(), C1.data(), C.size() * sizeof(float)) == 0);
}

TEST_CASE("the gemm observer sees attention's GEMMs from inside its OpenMP region") {
  const int B = 2, T = 130, C = 32, NH = 2;  // 3 query blocks of 64, 64 and 2 rows
  auto qkv = randoms(size_t(B) * T * 3 * C, 4);
  std::vector<float> out(size_t(B) * T * C), lse(size_t(B) * NH * T), out2 = out, lse2 = lse;
  const int threads = std::min(2, omp_get_max_threads());
  omp_set_num_threads(threads);
  attention_forward<float>(out2.data(), lse2.data(), qkv.data(), B, T, C, NH);
  Log log;
  {
    Installed on(&log);
    attention_forward<float>(out.data(), lse.data(), qkv.data(), B, T, C, NH);
  }
  CHECK(std::memcmp(out.data(), out2.data(), out.size() * sizeof(float)) == 0);
  // Two GEMMs (scores, then P V) per (batch, head, query block).
  REQUIRE(log.calls.size() == size_t(2 * B * NH * 3));
  double flops = 0;
  for (const auto& c : log.calls) {
    flops += 2.0 * c.M * c.N * c.K;
    CHECK(c.team_size >= 1);
    CHECK(c.team_size <= threads);
  }
  // Per (b, h): blocks of (rows, keys) = (64, 64), (64, 128), (2, 130), each twice with head dim 16.
  CHECK(flops == 2.0 * B * NH * 2 * 16 * (64.0 * 64 + 64.0 * 128 + 2.0 * 130));
}
