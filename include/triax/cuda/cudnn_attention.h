// Causal attention through cuDNN's fused scaled-dot-product attention (the cuDNN frontend's graph
// API, sdpa / sdpa_backward): the fast path for bf16 and fp16, with the CUDA-core kernels of
// cuda/attention.h as the reference and the fallback. Same layout and meaning as
// cuda::attention_forward/backward: qkv (B, T, W), W = C + 2 NKV HS, per token [NH query heads |
// NKV key heads | NKV value heads] of HS channels each (query head h reads kv head h / (NH / NKV):
// grouped-query attention, handed to cuDNN as K/V with NKV heads; NKV = 0 or NH is multi-head,
// W = 3C), out (B, T, C), lse (B, NH, T) fp32 = natural-log log-sum-exp of
// each row of scaled scores q.k / sqrt(HS) over the keys <= the query (cuDNN's "Stats" output has
// exactly this meaning and, declared (B, NH, T, 1) packed, this layout: no conversion).
// Q, K, V, O, dO, dQ, dK and dV are handed to cuDNN as strided (B, NH, T, HS) views of our
// buffers (cudnn_attention_view below): nothing is copied or transposed.
//
// No cuDNN header here. The functions exist in every CUDA build; without the frontend (built
// without TRIAX_HAVE_CUDNN_FRONTEND) cudnn_attention_supported is false and forward/backward
// throw DeviceError. The layout helpers and the selection logic are header-only and need no GPU.
#pragma once
#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "triax/core/dtype.h"
#include "triax/core/env.h"
#include "triax/core/error.h"
#include "triax/cuda/stream.h"

namespace triax::cuda {

// ---------------------------------------------------------------- layout (host-only)

// A strided 4-d view in elements: element (i0, i1, i2, i3) of the view is at
// base + offset + sum(ik * stride[k]).
struct AttentionView {
  int64_t dim[4];
  int64_t stride[4];
  int64_t offset;
};

enum class AttentionTensor { q, k, v, out, lse };

// The view cuDNN sees: q (B, NH, T, HS) and k/v (B, NKV, T, HS) of a (B, T, W) buffer (qkv or
// dqkv; offsets 0, C and C + NKV HS, token stride W = C + 2 NKV HS), out (B, NH, T, HS) of a
// (B, T, C) buffer (out or dout), and lse (B, NH, T) as (B, NH, T, 1). NKV = 0 means NH.
constexpr AttentionView cudnn_attention_view(AttentionTensor t, int B, int T, int NH, int HS, int NKV = 0) {
  const int64_t b = B, n = NH, s = T, d = HS, c = n * d, g = NKV > 0 ? NKV : NH, w = c + 2 * g * d;
  switch (t) {
    case AttentionTensor::q: return {{b, n, s, d}, {s * w, d, w, 1}, 0};
    case AttentionTensor::k: return {{b, g, s, d}, {s * w, d, w, 1}, c};
    case AttentionTensor::v: return {{b, g, s, d}, {s * w, d, w, 1}, c + g * d};
    case AttentionTensor::out: return {{b, n, s, d}, {s * c, d, c, 1}, 0};
    case AttentionTensor::lse: return {{b, n, s, 1}, {n * s, s, 1, 1}, 0};
  }
  return {};
}

// What one cuDNN graph is built for; graphs (and their execution plans) are cached by this key.
// NKV: key/value heads, 0 = NH (the functions below always make keys with 0 for multi-head, so
// one shape has one key).
struct CudnnAttentionKey {
  DType dtype;
  int B, T, NH, HS;
  bool backward;
  int NKV = 0;
  friend auto operator<=>(const CudnnAttentionKey&, const CudnnAttentionKey&) = default;
};

// NKV as a key holds it: 0 for multi-head (NKV 0 or NH).
constexpr int cudnn_attention_key_kv(int NH, int NKV) { return NKV == NH ? 0 : NKV; }

inline std::string to_string(const CudnnAttentionKey& k) {
  return fmt::format("{} {} B={} T={} NH={} HS={}{}", k.backward ? "backward" : "forward", dtype_name(k.dtype), k.B,
                     k.T, k.NH, k.HS, k.NKV > 0 ? fmt::format(" NKV={}", k.NKV) : std::string());
}

// ---------------------------------------------------------------- selection (host-only)

// TRIAX_ATTENTION (docs/ENVIRONMENT.md): which attention the CUDA backend runs.
//   auto   (default) cuDNN for bf16/fp16 where cudnn_attention_supported, else the kernels;
//   cudnn  cuDNN for bf16/fp16, and a ConfigError where it cannot (no frontend in the build, a
//          shape cuDNN rejects) instead of a silent fallback;
//   kernel always the CUDA-core kernels of cuda/attention.h.
// fp32 always runs on the kernels: cuDNN's fused attention takes half types only.
enum class AttentionImpl { automatic, cudnn, kernel };

inline AttentionImpl parse_attention_impl(std::string_view name, std::string_view value) {
  const std::string v = parse_env_choice(name, value, {"auto", "cudnn", "kernel"});
  return v == "cudnn" ? AttentionImpl::cudnn : (v == "kernel" ? AttentionImpl::kernel : AttentionImpl::automatic);
}

inline AttentionImpl attention_impl_from_env() {
  return parse_attention_impl("TRIAX_ATTENTION", env_choice("TRIAX_ATTENTION", {"auto", "cudnn", "kernel"}, "auto"));
}

// The decision, given the choice and a probe that returns why cuDNN cannot run this shape
// (nullopt: it can). The probe is called only for bf16/fp16 under auto or cudnn.
template <class Probe>
bool choose_cudnn_attention(AttentionImpl impl, DType dtype, const CudnnAttentionKey& shape, Probe&& why_not) {
  if (impl == AttentionImpl::kernel) return false;
  if (dtype != DType::bf16 && dtype != DType::f16) return false;
  const std::optional<std::string> why = why_not();
  if (!why) return true;
  if (impl == AttentionImpl::cudnn)
    TRIAX_THROW(ConfigError, "TRIAX_ATTENTION=cudnn but cuDNN attention cannot run {}: {} (unset TRIAX_ATTENTION or "
                "set it to auto to fall back to the CUDA-core kernels)", to_string(shape), *why);
  return false;
}

// ---------------------------------------------------------------- the cuDNN path

// Whether this build has the cuDNN frontend, and what it runs with: "cuDNN 9.19.0 (headers
// 9.19.0), frontend 1.32.0" or "built without the cuDNN frontend".
bool cudnn_attention_built();
std::string cudnn_attention_version();

// Why cuDNN cannot run causal attention of this shape on the current device (nullopt: it can).
// NKV: key/value heads (0 = NH); a bad one (not dividing NH) is a reason.
// The first call per (dtype, B, T, NH, HS, NKV) builds and caches both graphs (forward and backward;
// seconds: call it at set-up, not inside a CUDA-graph capture) and grows the workspace; later
// calls are a map look-up. A rejection is cached too, with cuDNN's message. Never throws for a
// shape: bad sizes and non-half dtypes are reasons like any other.
std::optional<std::string> cudnn_attention_unsupported_reason(DType dtype, int B, int T, int NH, int HS, int NKV = 0);
inline bool cudnn_attention_supported(DType dtype, int B, int T, int NH, int HS, int NKV = 0) {
  return !cudnn_attention_unsupported_reason(dtype, B, T, NH, HS, NKV).has_value();
}

// The frontend's own checks of both graphs (forward, and backward with the deterministic
// algorithm) for a GPU of compute capability `sm_version` (90: H100/H200), with no device, handle
// or cuDNN engine involved: dims, strides, types and attributes as the frontend validates them
// before it lowers a graph to cuDNN. The first failure, or nullopt. A CI check without a GPU; what
// cuDNN's engines accept on a real device only cudnn_attention_unsupported_reason can tell.
std::optional<std::string> cudnn_attention_check_graphs(DType dtype, int B, int T, int NH, int HS, int sm_version,
                                                        int NKV = 0);

// Whether the cached backward graph of this shape is cuDNN's deterministic algorithm (tried
// first; the non-deterministic one only where cuDNN refuses it). False when not supported.
bool cudnn_attention_backward_deterministic(DType dtype, int B, int T, int NH, int HS, int NKV = 0);

// TRIAX_ATTENTION's decision for a call of this dtype and shape (choose_cudnn_attention with
// cudnn_attention_unsupported_reason as the probe). ConfigError under TRIAX_ATTENTION=cudnn
// where cuDNN cannot run it.
bool use_cudnn_attention(DType dtype, int B, int T, int C, int NH, int NKV = 0);

// out, lse from qkv on `stream` (dtype bf16 or f16; all pointers device memory, the half-type ones
// 16-byte aligned). NKV key/value heads (0 = NH). ConfigError for bad sizes (non-positive, NH not
// dividing C, NKV not dividing NH), a null or misaligned pointer or an unsupported dtype;
// DeviceError naming the cuDNN call and its message where cuDNN fails or rejects the shape
// (check cudnn_attention_supported first to fall back instead).
void cudnn_attention_forward(DType dtype, void* out, float* lse, const void* qkv, int B, int T, int C, int NH,
                             int NKV, cudaStream_t stream);

// One workspace per device serves every call: the calls on one device must run in order (one
// stream, or streams ordered by events, as the CUDA backend's compute stream is); two calls left
// to run concurrently on unordered streams would share it.
//
// dqkv (written in full) from dout, the forward's qkv, out and lse.
void cudnn_attention_backward(DType dtype, void* dqkv, const void* dout, const void* qkv, const void* out,
                              const float* lse, int B, int T, int C, int NH, int NKV, cudaStream_t stream);

// Frees every cached graph, cuDNN handle and workspace (all devices). Optional: a backend's
// teardown may call it while the CUDA context is alive; the cache is otherwise kept to the end
// of the process. Not concurrently with calls of the functions above on other threads.
void cudnn_attention_release();

// The bytes of the workspace currently held on the current device (0 before the first graph).
size_t cudnn_attention_workspace_bytes();

}  // namespace triax::cuda
