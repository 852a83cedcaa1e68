// gemm (cblas wrapper) and the linear layer against naive double loops; linear backward against
// finite differences of the reference in double, then float against the verified double.
#include <catch2/catch.hpp>

#include <limits>

#include "triax/core/error.h"
#include "triax/ops/gemm.h"
#include "triax/ops/linear.h"
#include "unit/ops_testing.h"

using namespace triax::ops;
using namespace triax::test;
using Catch::Matchers::Contains;

namespace {

// C = alpha op(A) op(B) + beta C, row-major, element by element.
std::vector<double> ref_gemm(Trans ta, Trans tb, int M, int N, int K, double alpha, const std::vector<double>& A, int lda,
                             const std::vector<double>& B, int ldb, double beta, std::vector<double> C, int ldc) {
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = 0;
      for (int k = 0; k < K; ++k) {
        const double a = ta == Trans::no ? A[i * lda + k] : A[k * lda + i];
        const double b = tb == Trans::no ? B[k * ldb + j] : B[j * ldb + k];
        s += a * b;
      }
      C[i * ldc + j] = alpha * s + beta * C[i * ldc + j];
    }
  return C;
}

// out[n, o] = sum_i inp[n, i] W[o, i] + b[o]
std::vector<double> ref_linear(const std::vector<double>& inp, const std::vector<double>& W, const std::vector<double>* b,
                               int N, int IC, int OC) {
  std::vector<double> out(static_cast<size_t>(N) * OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = b ? (*b)[o] : 0.0;
      for (int i = 0; i < IC; ++i) s += inp[n * IC + i] * W[o * IC + i];
      out[n * OC + o] = s;
    }
  return out;
}

template <class Real>
void check_gemm_case(Trans ta, Trans tb, int M, int N, int K, double tol) {
  const int pad = 3;  // leading dimensions larger than the rows, to catch ld mix-ups
  const int lda = (ta == Trans::no ? K : M) + pad, ldb = (tb == Trans::no ? N : K) + pad, ldc = N + pad;
  const int arows = ta == Trans::no ? M : K, brows = tb == Trans::no ? K : N;
  auto A = random_vec(static_cast<size_t>(arows) * lda), B = random_vec(static_cast<size_t>(brows) * ldb),
       C = random_vec(static_cast<size_t>(M) * ldc);
  const double alpha = random_vec(1)[0] * 2, beta = random_vec(1)[0];
  auto want = ref_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  auto Ar = cast<Real>(A), Br = cast<Real>(B), Cr = cast<Real>(C);
  gemm<Real>(ta, tb, M, N, K, static_cast<Real>(alpha), Ar.data(), lda, Br.data(), ldb, static_cast<Real>(beta),
             Cr.data(), ldc);
  require_close(Cr, want, tol, tol, fmt::format("gemm ta={} tb={} M={} N={} K={}", int(ta), int(tb), M, N, K));
}

}  // namespace

TEST_CASE("gemm matches the naive product for every transpose combination") {
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes}) {
      check_gemm_case<float>(ta, tb, 37, 29, 53, 1e-5);
      check_gemm_case<double>(ta, tb, 37, 29, 53, 1e-13);
      check_gemm_case<float>(ta, tb, 130, 200, 96, 2e-5);  // big enough for BLAS threading
    }
}

TEST_CASE("gemm with beta 0 ignores NaN in C") {
  const int M = 5, N = 6, K = 7;
  auto A = random_vec(M * K), B = random_vec(K * N);
  std::vector<float> C(M * N, std::numeric_limits<float>::quiet_NaN());
  auto Af = cast<float>(A), Bf = cast<float>(B);
  gemm<float>(Trans::no, Trans::no, M, N, K, 1.0f, Af.data(), K, Bf.data(), N, 0.0f, C.data(), N);
  require_close(C, ref_gemm(Trans::no, Trans::no, M, N, K, 1, A, K, B, N, 0, std::vector<double>(M * N), N), 1e-5, 1e-6,
                "beta 0");
}

TEST_CASE("gemm rejects bad arguments") {
  std::vector<float> a(100, 1.0f), b(100, 1.0f), c(100, 1.0f);
  CHECK_THROWS_WITH(gemm<float>(Trans::no, Trans::no, -1, 2, 2, 1, a.data(), 2, b.data(), 2, 0, c.data(), 2),
                    Contains("negative"));
  CHECK_THROWS_WITH(gemm<float>(Trans::no, Trans::no, 4, 4, 5, 1, a.data(), 4, b.data(), 4, 0, c.data(), 4),
                    Contains("lda=4") && Contains("5 columns of A"));
  CHECK_THROWS_WITH(gemm<float>(Trans::yes, Trans::no, 6, 4, 5, 1, a.data(), 5, b.data(), 4, 0, c.data(), 4),
                    Contains("lda=5") && Contains("6 columns"));
  CHECK_THROWS_WITH(gemm<float>(Trans::no, Trans::yes, 4, 4, 5, 1, a.data(), 5, b.data(), 4, 0, c.data(), 4),
                    Contains("ldb=4"));
  CHECK_THROWS_WITH(gemm<float>(Trans::no, Trans::no, 4, 4, 4, 1, a.data(), 4, b.data(), 4, 0, c.data(), 3),
                    Contains("ldc=3"));
  CHECK_THROWS_WITH(gemm<float>(Trans::no, Trans::no, 4, 4, 4, 1, nullptr, 4, b.data(), 4, 0, c.data(), 4),
                    Contains("A is null"));
  CHECK_THROWS_WITH(gemm<double>(Trans::no, Trans::no, 2, 2, 2, 1, nullptr, 2, nullptr, 2, 0, nullptr, 2),
                    Contains("C is null"));
  // Empty products are fine and touch nothing.
  CHECK_NOTHROW(gemm<float>(Trans::no, Trans::no, 0, 4, 4, 1, nullptr, 4, nullptr, 4, 0, nullptr, 4));
}

TEST_CASE("linear forward matches the reference, with and without bias") {
  for (auto [N, IC, OC] : {std::tuple{7, 13, 11}, std::tuple{64, 96, 130}}) {
    auto inp = random_vec(N * IC), W = random_vec(OC * IC), b = random_vec(OC);
    for (bool with_bias : {true, false}) {
      auto want = ref_linear(inp, W, with_bias ? &b : nullptr, N, IC, OC);
      auto inf = cast<float>(inp), Wf = cast<float>(W), bf = cast<float>(b);
      std::vector<float> out(N * OC, std::numeric_limits<float>::quiet_NaN());
      linear_forward<float>(out.data(), inf.data(), Wf.data(), with_bias ? bf.data() : nullptr, N, IC, OC);
      require_close(out, want, 1e-5, 1e-5, "linear float");
      std::vector<double> outd(N * OC, std::numeric_limits<double>::quiet_NaN());
      linear_forward<double>(outd.data(), inp.data(), W.data(), with_bias ? b.data() : nullptr, N, IC, OC);
      require_close(outd, want, 1e-13, 1e-13, "linear double");
    }
  }
}

TEST_CASE("linear backward: finite differences in double, then float against double") {
  const int N = 6, IC = 9, OC = 7;
  auto inp = random_vec(N * IC), W = random_vec(OC * IC), b = random_vec(OC), dout = random_vec(N * OC);
  // Parameter gradients accumulate: start from random values and subtract them afterwards.
  auto dW0 = random_vec(OC * IC), db0 = random_vec(OC);
  std::vector<double> dinp(N * IC, std::numeric_limits<double>::quiet_NaN()), dW = dW0, db = db0;
  linear_backward<double>(dinp.data(), dW.data(), db.data(), dout.data(), inp.data(), W.data(), N, IC, OC);
  std::vector<double> gW(OC * IC), gb(OC);
  for (size_t i = 0; i < gW.size(); ++i) gW[i] = dW[i] - dW0[i];
  for (size_t i = 0; i < gb.size(); ++i) gb[i] = db[i] - db0[i];
  auto loss = [&] { return dot(dout, ref_linear(inp, W, &b, N, IC, OC)); };
  fd_check(inp, dinp, loss, "dinp");
  fd_check(W, gW, loss, "dweight");
  fd_check(b, gb, loss, "dbias");

  // Float, all three, plus the accumulate mode for dinp.
  auto inf = cast<float>(inp), Wf = cast<float>(W), doutf = cast<float>(dout);
  auto dinp0 = random_vec(N * IC);
  std::vector<float> dinpf(N * IC, std::numeric_limits<float>::quiet_NaN()), dinpa = cast<float>(dinp0),
      dWf = cast<float>(dW0), dbf = cast<float>(db0);
  linear_backward<float>(dinpf.data(), dWf.data(), dbf.data(), doutf.data(), inf.data(), Wf.data(), N, IC, OC);
  linear_backward<float>(dinpa.data(), nullptr, nullptr, doutf.data(), inf.data(), Wf.data(), N, IC, OC,
                         GradMode::accumulate);
  require_close(dinpf, dinp, 1e-5, 1e-5, "float dinp");
  require_close(dWf, dW, 1e-5, 1e-5, "float dweight (accumulated)");
  require_close(dbf, db, 1e-5, 1e-5, "float dbias (accumulated)");
  std::vector<double> dinp_acc(N * IC);
  for (size_t i = 0; i < dinp_acc.size(); ++i) dinp_acc[i] = dinp0[i] + dinp[i];
  require_close(dinpa, dinp_acc, 1e-5, 1e-5, "float dinp accumulated");
}

TEST_CASE("linear bias gradient over many rows (column blocks in parallel)") {
  const int N = 300, IC = 4, OC = 200;  // N * OC above the parallel threshold, OC not a multiple of 64
  auto dout = random_vec(N * OC), db0 = random_vec(OC);
  std::vector<double> want = db0;
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) want[o] += dout[n * OC + o];
  auto doutf = cast<float>(dout);
  auto dbf = cast<float>(db0);
  linear_backward<float>(nullptr, nullptr, dbf.data(), doutf.data(), nullptr, nullptr, N, IC, OC);
  require_close(dbf, want, 1e-5, 1e-4, "dbias");
}

TEST_CASE("linear rejects bad arguments") {
  std::vector<float> x(16, 1.0f);
  CHECK_THROWS_WITH(linear_forward<float>(x.data(), x.data(), x.data(), nullptr, 0, 2, 2), Contains("N must be positive"));
  CHECK_THROWS_WITH(linear_forward<float>(x.data(), nullptr, x.data(), nullptr, 2, 2, 2), Contains("inp is null"));
  CHECK_THROWS_WITH(linear_backward<float>(x.data(), nullptr, nullptr, x.data(), x.data(), nullptr, 2, 2, 2),
                    Contains("weight is null"));
  CHECK_THROWS_WITH(linear_backward<float>(nullptr, x.data(), nullptr, x.data(), nullptr, x.data(), 2, 2, 2),
                    Contains("inp is null"));
}
