// The parts of include/triax/cuda/cudnn_attention.h every CUDA build has: TRIAX_ATTENTION's
// decision, and, in a build without the cuDNN frontend (no TRIAX_HAVE_CUDNN_FRONTEND), the cuDNN
// functions as "not available" (src/cuda/cudnn_attention.cpp is not compiled then).
#include "triax/cuda/cudnn_attention.h"

namespace triax::cuda {

bool use_cudnn_attention(DType dtype, int B, int T, int C, int NH, int NKV) {
  const int hs = NH > 0 ? C / NH : 0;
  const CudnnAttentionKey shape{dtype, B, T, NH, hs, false, cudnn_attention_key_kv(NH, NKV)};
  return choose_cudnn_attention(attention_impl_from_env(), dtype, shape, [&]() -> std::optional<std::string> {
    if (NH <= 0 || C % NH != 0) return fmt::format("NH={} does not divide C={}", NH, C);
    return cudnn_attention_unsupported_reason(dtype, B, T, NH, hs, NKV);
  });
}

#ifndef TRIAX_HAVE_CUDNN_FRONTEND

namespace {
constexpr const char* kNotBuilt =
    "this build has no cuDNN frontend (scripts/fetch_cudnn_frontend.sh, then reconfigure; docs/CUDA.md)";
}

bool cudnn_attention_built() { return false; }
std::string cudnn_attention_version() { return "built without the cuDNN frontend"; }

std::optional<std::string> cudnn_attention_unsupported_reason(DType, int, int, int, int, int) {
  return std::string(kNotBuilt);
}

std::optional<std::string> cudnn_attention_check_graphs(DType, int, int, int, int, int, int) {
  return std::string(kNotBuilt);
}

bool cudnn_attention_backward_deterministic(DType, int, int, int, int, int) { return false; }

void cudnn_attention_forward(DType, void*, float*, const void*, int, int, int, int, int, cudaStream_t) {
  TRIAX_THROW(DeviceError, "cuda::cudnn_attention_forward: {}", kNotBuilt);
}

void cudnn_attention_backward(DType, void*, const void*, const void*, const void*, const float*, int, int, int, int,
                              int, cudaStream_t) {
  TRIAX_THROW(DeviceError, "cuda::cudnn_attention_backward: {}", kNotBuilt);
}

void cudnn_attention_release() {}
size_t cudnn_attention_workspace_bytes() { return 0; }

#endif  // TRIAX_HAVE_CUDNN_FRONTEND

}  // namespace triax::cuda
