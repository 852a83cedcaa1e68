// fp32 <-> bf16 / fp16 conversions, round to nearest even (the intrinsics' _rn forms), 4 elements
// per access (16 bytes of fp32, 8 of the 16-bit type) with a scalar tail.
#include "common.cuh"
#include "triax/cuda/cast.h"

namespace triax::cuda {
namespace {
using namespace detail;

namespace math = ops::math;
constexpr int kCastWidth = 4;

template <class DTo, class DFrom>
struct Cast {
  DTo* __restrict__ out;
  const DFrom* __restrict__ in;
  __device__ void vector(int64_t v) {
    const Pack<DFrom, kCastWidth> x = load_pack<kCastWidth>(in, v);
    Pack<DTo, kCastWidth> y;
#pragma unroll
    for (int k = 0; k < kCastWidth; ++k) y.e[k] = from_f32<DTo>(to_f32(x.e[k]));
    store_pack(out, v, y);
  }
  __device__ void scalar(int64_t i) { out[i] = from_f32<DTo>(to_f32(in[i])); }
};

template <class DTo, class DFrom>
__global__ void __launch_bounds__(kThreads)
    cast_kernel(DTo* __restrict__ out, const DFrom* __restrict__ in, int64_t n, math::VecSplit split) {
  Cast<DTo, DFrom> body{out, in};
  math::for_each_split(split, n, global_index(), global_stride(), body);
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
  const auto split = math::vec_split(n, kCastWidth, aligned16(out, in));
  cast_kernel<<<grid_for(split, n), kThreads, 0, stream>>>(dptr(out), dptr(in), n, split);
  check_launch();
}

template void cast<bf16, float>(bf16*, const float*, int64_t, cudaStream_t);
template void cast<f16, float>(f16*, const float*, int64_t, cudaStream_t);
template void cast<float, bf16>(float*, const bf16*, int64_t, cudaStream_t);
template void cast<float, f16>(float*, const f16*, int64_t, cudaStream_t);

}  // namespace triax::cuda
