// fp32 <-> bf16 / fp16 conversions, round to nearest even (the intrinsics' _rn forms).
#include "common.cuh"
#include "triax/cuda/cast.h"

namespace triax::cuda {
namespace {
using namespace detail;

template <class DTo, class DFrom>
__global__ void __launch_bounds__(kThreads)
    cast_kernel(DTo* __restrict__ out, const DFrom* __restrict__ in, int64_t n) {
  for (int64_t i = global_index(); i < n; i += global_stride()) out[i] = from_f32<DTo>(to_f32(in[i]));
}

}  // namespace

template <class To, class From>
void cast(To* out, const From* in, int64_t n, cudaStream_t stream) {
  const char* op = "cuda::cast";
  const NvtxRange range(op);
  require_nonnegative(op, "n", n);
  if (n == 0) return;
  require_pointer(op, "out", out);
  require_pointer(op, "in", in);
  cast_kernel<<<grid_for(n), kThreads, 0, stream>>>(dptr(out), dptr(in), n);
  check_launch();
}

template void cast<bf16, float>(bf16*, const float*, int64_t, cudaStream_t);
template void cast<f16, float>(f16*, const float*, int64_t, cudaStream_t);
template void cast<float, bf16>(float*, const bf16*, int64_t, cudaStream_t);
template void cast<float, f16>(float*, const f16*, int64_t, cudaStream_t);

}  // namespace triax::cuda
