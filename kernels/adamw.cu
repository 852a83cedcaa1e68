// Fused AdamW with fp32 master weights and an optional bf16/fp16 copy: one memory-bound pass.
// The bias corrections are computed once on the host in double, as the CPU adamw_update does.
#include <cmath>

#include "common.cuh"
#include "triax/cuda/adamw.h"

namespace triax::cuda {
namespace {
using namespace detail;

struct AdamWScalars {
  float b1, b2, ob1, ob2, bc1, bc2, eps, lr, wd, gs;
};

template <class G, class P>
__global__ void adamw_kernel(float* master, P* copy, const G* grad, float* m, float* v, int64_t n, AdamWScalars s) {
  for (int64_t i = global_index(); i < n; i += global_stride()) {
    const float gi = to_f32(grad[i]) * s.gs;
    const float mi = s.b1 * m[i] + s.ob1 * gi;
    const float vi = s.b2 * v[i] + s.ob2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / s.bc1;
    const float vhat = vi / s.bc2;
    float p = master[i];
    p -= s.lr * (mhat / (sqrtf(vhat) + s.eps) + s.wd * p);
    master[i] = p;
    if (copy) copy[i] = from_f32<P>(p);
  }
}

}  // namespace

template <class Grad, class Copy>
void adamw_update(float* master, Copy* copy, const Grad* grad, float* m, float* v, int64_t n, const AdamWConfig& cfg,
                  float weight_decay, const AdamWStep& step, cudaStream_t stream) {
  const char* op = "cuda::adamw_update";
  validate(cfg);
  if (step.t < 1) TRIAX_THROW(ConfigError, "{}: step count t = {} must be >= 1", op, step.t);
  require_nonnegative(op, "n", n);
  if (n == 0) return;
  require_pointer(op, "master", master);
  require_pointer(op, "grad", grad);
  require_pointer(op, "m", m);
  require_pointer(op, "v", v);
  const double td = static_cast<double>(step.t);
  AdamWScalars s;
  s.b1 = cfg.beta1;
  s.b2 = cfg.beta2;
  s.ob1 = 1.0f - cfg.beta1;
  s.ob2 = 1.0f - cfg.beta2;
  s.bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(cfg.beta1), td));
  s.bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(cfg.beta2), td));
  s.eps = cfg.eps;
  s.lr = step.lr;
  s.wd = weight_decay;
  s.gs = step.grad_scale;
  adamw_kernel<<<grid_for(n), kThreads, 0, stream>>>(master, dptr(copy), dptr(grad), m, v, n, s);
  check_launch();
}

#define TRIAX_INSTANTIATE(G, P)                                                                                      \
  template void adamw_update<G, P>(float*, P*, const G*, float*, float*, int64_t, const AdamWConfig&, float,        \
                                   const AdamWStep&, cudaStream_t);
TRIAX_INSTANTIATE(float, bf16)
TRIAX_INSTANTIATE(float, f16)
TRIAX_INSTANTIATE(bf16, bf16)
TRIAX_INSTANTIATE(bf16, f16)
TRIAX_INSTANTIATE(f16, bf16)
TRIAX_INSTANTIATE(f16, f16)
#undef TRIAX_INSTANTIATE

}  // namespace triax::cuda
