// Token + position embedding: gather rows forward; scatter-add backward, partitioned by channel
// blocks so every table entry is summed by one thread in (b, t) order.
#include "triax/ops/embedding.h"

#include <algorithm>
#include <cstring>

#include "ops_common.h"

namespace triax::ops {
namespace {

void check_embedding(const char* op, const int32_t* tokens, int B, int T, int C, int V, int v0, int v1) {
  detail::require_positive(op, "B", B);
  detail::require_positive(op, "T", T);
  detail::require_positive(op, "C", C);
  detail::require_positive(op, "V", V);
  detail::require_pointer(op, "tokens", tokens);
  if (v0 < 0 || v1 <= v0 || v1 > V)
    TRIAX_THROW(ConfigError, "{}: vocab shard [{}, {}) is empty or outside the table [0, {})", op, v0, v1, V);
  const int64_t n = int64_t{B} * T;
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= V)
      TRIAX_THROW(ConfigError, "{}: token {} at position (b={}, t={}) is outside the vocabulary [0, {})", op, tokens[i],
                  i / T, i % T, V);
}

}  // namespace

template <class Real>
void embedding_forward(Real* out, const int32_t* tokens, const Real* wte, const Real* wpe, int B, int T, int C, int V,
                       int v0, int v1) {
  const char* op = "embedding_forward";
  check_embedding(op, tokens, B, T, C, V, v0, v1);
  detail::require_pointer(op, "out", out);
  detail::require_pointer(op, "wte", wte);
  const int64_t rows = int64_t{B} * T;
#pragma omp parallel for schedule(static) if (rows * C >= detail::kParallelMinWork)
  for (int64_t i = 0; i < rows; ++i) {
    Real* o = out + i * C;
    const int32_t tok = tokens[i];
    if (tok >= v0 && tok < v1) {
      std::memcpy(o, wte + int64_t{tok - v0} * C, sizeof(Real) * C);
    } else {
      std::fill(o, o + C, Real(0));
    }
    if (wpe) {
      const Real* p = wpe + (i % T) * C;
#pragma omp simd
      for (int c = 0; c < C; ++c) o[c] += p[c];
    }
  }
}

template <class Real>
void embedding_backward(Real* dwte, Real* dwpe, const Real* dout, const int32_t* tokens, int B, int T, int C, int V,
                        int v0, int v1) {
  const char* op = "embedding_backward";
  check_embedding(op, tokens, B, T, C, V, v0, v1);
  detail::require_pointer(op, "dout", dout);
  const int64_t rows = int64_t{B} * T;
  detail::for_each_column_block(C, rows * C >= detail::kParallelMinWork, [&](int64_t c0, int64_t w) {
    if (dwte) {
      for (int64_t i = 0; i < rows; ++i) {
        const int32_t tok = tokens[i];
        if (tok < v0 || tok >= v1) continue;
        Real* g = dwte + int64_t{tok - v0} * C + c0;
        const Real* d = dout + i * C + c0;
#pragma omp simd
        for (int64_t c = 0; c < w; ++c) g[c] += d[c];
      }
    }
    if (dwpe) {
      for (int t = 0; t < T; ++t) {
        Real* g = dwpe + int64_t{t} * C + c0;
        for (int b = 0; b < B; ++b) {
          const Real* d = dout + (int64_t{b} * T + t) * C + c0;
#pragma omp simd
          for (int64_t c = 0; c < w; ++c) g[c] += d[c];
        }
      }
    }
  });
}

template void embedding_forward<float>(float*, const int32_t*, const float*, const float*, int, int, int, int, int, int);
template void embedding_forward<double>(double*, const int32_t*, const double*, const double*, int, int, int, int, int,
                                        int);
template void embedding_backward<float>(float*, float*, const float*, const int32_t*, int, int, int, int, int, int);
template void embedding_backward<double>(double*, double*, const double*, const int32_t*, int, int, int, int, int, int);

}  // namespace triax::ops
