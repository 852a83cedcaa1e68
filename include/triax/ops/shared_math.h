// The arithmetic a CPU op (src/ops) and its CUDA kernel (kernels/) share, written once: GELU's
// tanh form and its derivative, the AdamW per-element update, the cross-entropy pieces, and the
// index split of a vectorised element-wise loop. Under nvcc every function is __host__ __device__;
// for the C++ compiler TRIAX_HD expands to nothing and this is an ordinary header of the ops layer.
//
// Exactness: the CPU ops call these in their vectorised loops and their results must not change
// by a bit, so each function is the CPU op's expression in the CPU op's order and precision (the
// constants too are the CPU op's: double literals rounded to Real). The transcendental each op
// needs (tanh, exp) stays with the caller: the CPU ops use vec_math.h's vectorisable vtanh/vexp,
// the kernels tanhf/expf; what comes before and after it is here.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define TRIAX_HD __host__ __device__
#else
#define TRIAX_HD
#endif
// Inlined wherever called: GCC vectorises the CPU ops' loops best when these are inlined early
// (with a plain `inline` it dropped the vectorised epilogues of the AdamW loop).
#if defined(__CUDACC__)
#define TRIAX_HD_INLINE __host__ __device__ __forceinline__
#elif defined(__GNUC__) || defined(__clang__)
#define TRIAX_HD_INLINE [[gnu::always_inline]] inline
#else
#define TRIAX_HD_INLINE inline
#endif

namespace triax::ops::math {

// sqrt and log of the execution space: the device's IEEE sqrtf/logf, the host's std::sqrt/log.
TRIAX_HD_INLINE float hd_sqrt(float x) {
#if defined(__CUDA_ARCH__)
  return sqrtf(x);
#else
  return std::sqrt(x);
#endif
}
TRIAX_HD_INLINE double hd_sqrt(double x) {
#if defined(__CUDA_ARCH__)
  return sqrt(x);
#else
  return std::sqrt(x);
#endif
}
TRIAX_HD_INLINE float hd_log(float x) {
#if defined(__CUDA_ARCH__)
  return logf(x);
#else
  return std::log(x);
#endif
}
TRIAX_HD_INLINE double hd_log(double x) {
#if defined(__CUDA_ARCH__)
  return log(x);
#else
  return std::log(x);
#endif
}

// ---- GELU, tanh form: gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3) ----
inline constexpr double kGeluSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi)
inline constexpr double kGeluCubic = 0.044715;

// u, the argument of tanh.
template <class Real>
TRIAX_HD_INLINE Real gelu_tanh_arg(Real x) {
  const Real k0 = static_cast<Real>(kGeluSqrt2OverPi), k1 = static_cast<Real>(kGeluCubic);
  return k0 * (x + k1 * x * x * x);
}
// gelu(x) from t = tanh(gelu_tanh_arg(x)).
template <class Real>
TRIAX_HD_INLINE Real gelu_from_tanh(Real x, Real t) {
  return Real(0.5) * x * (Real(1) + t);
}
// gelu'(x) from t = tanh(gelu_tanh_arg(x)): 0.5 (1 + t) + 0.5 x (1 - t^2) du/dx.
template <class Real>
TRIAX_HD_INLINE Real gelu_grad_from_tanh(Real x, Real t) {
  const Real k0 = static_cast<Real>(kGeluSqrt2OverPi), k1 = static_cast<Real>(kGeluCubic);
  const Real du = k0 * (Real(1) + Real(3) * k1 * x * x);
  return Real(0.5) * (Real(1) + t) + Real(0.5) * x * (Real(1) - t * t) * du;
}

// ---- AdamW, one element (ops/adamw.h states the update) ----
// The per-call constants. bc1, bc2 are the bias corrections 1 - beta^t (adamw_bias_correction).
template <class Real>
struct AdamWCoeffs {
  Real b1, b2, ob1, ob2, bc1, bc2, eps, lr, wd, gs;
};

// 1 - beta^t in double, computed once per call on the host (both the CPU op and the launcher).
inline double adamw_bias_correction(float beta, int64_t t) {
  return 1.0 - std::pow(static_cast<double>(beta), static_cast<double>(t));
}

// The constants of one call: beta1, beta2, eps from the config, lr and grad_scale from the step,
// wd the decay of this span (0 for parameters without decay). ob = 1 - beta in Real, as the CPU
// op always computed it.
template <class Real>
AdamWCoeffs<Real> adamw_coeffs(float beta1, float beta2, float eps, float lr, float wd, float grad_scale, int64_t t) {
  AdamWCoeffs<Real> k;
  k.bc1 = static_cast<Real>(adamw_bias_correction(beta1, t));
  k.bc2 = static_cast<Real>(adamw_bias_correction(beta2, t));
  k.b1 = beta1, k.b2 = beta2, k.eps = eps, k.lr = lr, k.wd = wd, k.gs = grad_scale;
  k.ob1 = Real(1) - k.b1, k.ob2 = Real(1) - k.b2;
  return k;
}

// Updates the moments m, v in place and returns the new parameter:
//   g = grad * gs; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2
//   p - lr * ((m / bc1) / (sqrt(v / bc2) + eps) + wd * p)
template <class Real>
TRIAX_HD_INLINE Real adamw_element(Real p, Real grad, Real& m, Real& v, const AdamWCoeffs<Real>& k) {
  const Real gi = grad * k.gs;
  const Real mi = k.b1 * m + k.ob1 * gi;
  const Real vi = k.b2 * v + k.ob2 * gi * gi;
  m = mi;
  v = vi;
  const Real mhat = mi / k.bc1;
  const Real vhat = vi / k.bc2;
  return p - k.lr * (mhat / (hd_sqrt(vhat) + k.eps) + k.wd * p);
}

// ---- softmax cross-entropy of one row (ops/softmax_xent.h) ----
// logsumexp from the row's max over the real columns and sum of exp(x - max); Acc is the type the
// sum was accumulated in (the CPU forward adds in double), the log is taken in it.
template <class Real, class Acc>
TRIAX_HD_INLINE Real xent_lse(Real row_max, Acc sumexp) {
  return row_max + static_cast<Real>(hd_log(sumexp));
}
// The row's loss from its logsumexp and target logit.
template <class Real>
TRIAX_HD_INLINE Real xent_loss(Real lse, Real target_logit) {
  return lse - target_logit;
}
// Whether a target indexes a real column (otherwise the loss is NaN on the GPU, a ConfigError on
// the CPU).
TRIAX_HD_INLINE bool xent_target_valid(int target, int valid_vocab) { return target >= 0 && target < valid_vocab; }

// d loss / d logit_j = dloss * (softmax_j - [j == target]) with softmax_j = e = exp(x_j - lse),
// in two steps: the softmax part (every real column), then the one-hot part (the target's).
template <class Real>
TRIAX_HD_INLINE Real xent_dlogit_softmax(Real e, Real dloss) {
  return e * dloss;
}
template <class Real>
TRIAX_HD_INLINE Real xent_dlogit_target(Real softmax_part, Real dloss) {
  return softmax_part - dloss;
}
template <class Real>
TRIAX_HD_INLINE Real xent_dlogit(Real e, bool is_target, Real dloss) {
  const Real g = xent_dlogit_softmax(e, dloss);
  return is_target ? xent_dlogit_target(g, dloss) : g;
}

// ---- the index split of a vectorised element-wise loop ----
// [0, n) as whole vectors of `width` elements, vector v covering [v * width, (v + 1) * width),
// then a scalar tail [tail_begin, n). Unaligned pointers (aligned = false) send everything to the
// tail, so a kernel never issues a misaligned vector access.
struct VecSplit {
  int64_t nvec;
  int64_t tail_begin;
};
TRIAX_HD_INLINE VecSplit vec_split(int64_t n, int width, bool aligned) {
  const int64_t nvec = aligned ? n / width : 0;
  return {nvec, nvec * width};
}

// One thread's share of a grid- (or block-) stride loop over a split: vectors first, then tail
// elements, each index visited by exactly one thread of the `stride` threads `first` = 0, 1, ...
// body.vector(v) and body.scalar(i) do the work (the kernels' bodies are device code; the host
// tests pass a body that records the indices).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Body>
TRIAX_HD_INLINE void for_each_split(const VecSplit& s, int64_t n, int64_t first, int64_t stride, Body& body) {
  for (int64_t v = first; v < s.nvec; v += stride) body.vector(v);
  for (int64_t i = s.tail_begin + first; i < n; i += stride) body.scalar(i);
}

}  // namespace triax::ops::math
