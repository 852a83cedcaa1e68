// cuDNN fused causal attention (include/triax/cuda/cudnn_attention.h) through the cuDNN
// frontend's graph API. Compiled only when CMake found the frontend headers and libcudnn
// (TRIAX_HAVE_CUDNN_FRONTEND); src/cuda/cudnn_attention_select.cpp holds the parts every CUDA
// build has.
//
// One cache per device, behind one mutex: a cuDNN handle (set to the caller's stream at every
// call), the built graphs by CudnnAttentionKey (a rejected shape is cached with cuDNN's reason),
// and one workspace buffer that grows to the largest graph's need. Graphs and the workspace are
// made when a shape is first seen (cudnn_attention_unsupported_reason does it up front); the
// steady state allocates no device memory and builds nothing.
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <cudnn_frontend.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "triax/core/cuda_check.h"
#include "triax/core/log.h"
#include "triax/cuda/allocator.h"
#include "triax/cuda/cudnn_attention.h"

namespace triax::cuda {
namespace {
namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// The graphs' tensor uids (the variant pack maps each to a device pointer).
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kdO, kdQ, kdK, kdV };

const char* fe_code_name(fe::error_code_t c) {
  switch (c) {
    case fe::error_code_t::OK: return "OK";
    case fe::error_code_t::ATTRIBUTE_NOT_SET: return "ATTRIBUTE_NOT_SET";
    case fe::error_code_t::SHAPE_DEDUCTION_FAILED: return "SHAPE_DEDUCTION_FAILED";
    case fe::error_code_t::INVALID_TENSOR_NAME: return "INVALID_TENSOR_NAME";
    case fe::error_code_t::INVALID_VARIANT_PACK: return "INVALID_VARIANT_PACK";
    case fe::error_code_t::GRAPH_NOT_SUPPORTED: return "GRAPH_NOT_SUPPORTED";
    case fe::error_code_t::GRAPH_EXECUTION_PLAN_CREATION_FAILED: return "GRAPH_EXECUTION_PLAN_CREATION_FAILED";
    case fe::error_code_t::GRAPH_EXECUTION_FAILED: return "GRAPH_EXECUTION_FAILED";
    case fe::error_code_t::HEURISTIC_QUERY_FAILED: return "HEURISTIC_QUERY_FAILED";
    case fe::error_code_t::CUDA_API_FAILED: return "CUDA_API_FAILED";
    case fe::error_code_t::CUDNN_BACKEND_API_FAILED: return "CUDNN_BACKEND_API_FAILED";
    default: return "error";
  }
}

// "Graph::build_plans: GRAPH_NOT_SUPPORTED: <cuDNN's message>", or nullopt when e is OK.
std::optional<std::string> fe_failure(const char* call, const fe::error_t& e) {
  if (e.is_good()) return std::nullopt;
  return fmt::format("{}: {}: {}", call, fe_code_name(e.code), e.err_msg.empty() ? "(no message)" : e.err_msg);
}

[[noreturn]] void throw_cudnn(const char* call, cudnnStatus_t s) {
  int dev = -1;
  (void)cudaGetDevice(&dev);
  TRIAX_THROW(DeviceError, "cuDNN error {} ({}) in {} on device {}", static_cast<int>(s), cudnnGetErrorString(s), call,
              dev);
}

// ---------------------------------------------------------------- graphs

std::vector<int64_t> dims_of(const AttentionView& v) { return {v.dim[0], v.dim[1], v.dim[2], v.dim[3]}; }
std::vector<int64_t> strides_of(const AttentionView& v) { return {v.stride[0], v.stride[1], v.stride[2], v.stride[3]}; }

AttentionView view(AttentionTensor t, const CudnnAttentionKey& k) {
  return cudnn_attention_view(t, k.B, k.T, k.NH, k.HS, k.NKV);
}

TensorPtr input(fe::graph::Graph& g, const char* name, Uid uid, const AttentionView& v,
                fe::DataType_t type = fe::DataType_t::NOT_SET) {
  auto a = fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims_of(v)).set_stride(strides_of(v));
  if (type != fe::DataType_t::NOT_SET) a.set_data_type(type);
  return g.tensor(a);
}

void output(const TensorPtr& t, Uid uid, const AttentionView& v, fe::DataType_t type = fe::DataType_t::NOT_SET) {
  t->set_output(true).set_uid(uid).set_dim(dims_of(v)).set_stride(strides_of(v));
  if (type != fe::DataType_t::NOT_SET) t->set_data_type(type);
}

// sm_version > 0: a graph for that compute capability instead of the current device's (set before
// any node is added: nodes take the graph's context when they are made).
std::shared_ptr<fe::graph::Graph> new_graph(DType dtype, int sm_version) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(dtype == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  if (sm_version > 0) g->set_sm_version(sm_version);
  return g;
}

float attention_scale(int hs) { return 1.0f / std::sqrt(static_cast<float>(hs)); }

// out, Stats = causal sdpa(Q, K, V), Stats (the saved LSE) fp32 (B, NH, T, 1) packed.
std::shared_ptr<fe::graph::Graph> forward_graph(const CudnnAttentionKey& k, int sm_version = 0) {
  auto g = new_graph(k.dtype, sm_version);
  auto q = input(*g, "Q", kQ, view(AttentionTensor::q, k));
  auto kk = input(*g, "K", kK, view(AttentionTensor::k, k));
  auto v = input(*g, "V", kV, view(AttentionTensor::v, k));
  auto attrs = fe::graph::SDPA_attributes()
                   .set_name("triax_causal_attention")
                   .set_generate_stats(true)
                   .set_attn_scale(attention_scale(k.HS))
                   .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                   .set_diagonal_band_right_bound(0);  // key j <= query i
  auto [o, stats] = g->sdpa(q, kk, v, attrs);
  output(o, kO, view(AttentionTensor::out, k));
  output(stats, kStats, view(AttentionTensor::lse, k), fe::DataType_t::FLOAT);
  return g;
}

std::shared_ptr<fe::graph::Graph> backward_graph(const CudnnAttentionKey& k, bool deterministic, int sm_version = 0) {
  auto g = new_graph(k.dtype, sm_version);
  auto q = input(*g, "Q", kQ, view(AttentionTensor::q, k));
  auto kk = input(*g, "K", kK, view(AttentionTensor::k, k));
  auto v = input(*g, "V", kV, view(AttentionTensor::v, k));
  auto o = input(*g, "O", kO, view(AttentionTensor::out, k));
  auto dout = input(*g, "dO", kdO, view(AttentionTensor::out, k));
  auto stats = input(*g, "Stats", kStats, view(AttentionTensor::lse, k), fe::DataType_t::FLOAT);
  auto attrs = fe::graph::SDPA_backward_attributes()
                   .set_name("triax_causal_attention_backward")
                   .set_attn_scale(attention_scale(k.HS))
                   .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                   .set_diagonal_band_right_bound(0)
                   .set_deterministic_algorithm(deterministic);
  auto [dq, dk, dv] = g->sdpa_backward(q, kk, v, o, dout, stats, attrs);
  output(dq, kdQ, view(AttentionTensor::q, k));
  output(dk, kdK, view(AttentionTensor::k, k));
  output(dv, kdV, view(AttentionTensor::v, k));
  return g;
}

// Validates, lowers and plans `g`; the first failing step's message, or nullopt.
std::optional<std::string> build(fe::graph::Graph& g, cudnnHandle_t handle) {
  if (auto e = fe_failure("Graph::validate", g.validate())) return e;
  if (auto e = fe_failure("Graph::build_operation_graph", g.build_operation_graph(handle))) return e;
  if (auto e = fe_failure("Graph::create_execution_plans", g.create_execution_plans({fe::HeurMode_t::A}))) return e;
  if (auto e = fe_failure("Graph::check_support", g.check_support())) return e;
  return fe_failure("Graph::build_plans", g.build_plans());
}

// ---------------------------------------------------------------- the cache

struct Entry {
  std::shared_ptr<fe::graph::Graph> graph;  // null: rejected
  std::string why;                          // cuDNN's reason when rejected
  bool deterministic = false;               // backward: cuDNN's deterministic algorithm
};

struct DeviceCache {
  int device = -1;
  cudnnHandle_t handle = nullptr;
  std::string handle_error;  // cudnnCreate failed: every shape is rejected with this
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  std::map<CudnnAttentionKey, Entry> graphs;
};

struct Cache {
  std::mutex mu;
  std::map<int, DeviceCache> devices;
};

// Made on first use and never destroyed at exit: cuDNN handles and device memory released after
// the CUDA runtime's own teardown crash or hang; cudnn_attention_release frees them while the
// context lives.
Cache& cache() {
  static Cache* c = new Cache;
  return *c;
}

DeviceCache& device_cache(Cache& c) {
  int dev = -1;
  TRIAX_CHECK_CUDA(cudaGetDevice(&dev));
  DeviceCache& d = c.devices[dev];
  d.device = dev;
  if (!d.handle && d.handle_error.empty()) {
    const cudnnStatus_t s = cudnnCreate(&d.handle);
    if (s != CUDNN_STATUS_SUCCESS) {
      d.handle = nullptr;
      d.handle_error = fmt::format("cudnnCreate on device {} failed: {} ({})", dev, cudnnGetErrorString(s),
                                   static_cast<int>(s));
    }
  }
  return d;
}

// Grows the device's workspace to `bytes` (through the plain CUDA allocator, cuda/allocator.h:
// this is set-up time, when a larger graph is first built, never a step's). The old buffer may
// still be read by work queued on any stream: wait for the device before giving it back.
void reserve_workspace(DeviceCache& d, int device, int64_t bytes) {
  if (bytes <= 0 || static_cast<size_t>(bytes) <= d.workspace_bytes) return;
  const size_t want = (static_cast<size_t>(bytes) + 255) / 256 * 256;
  if (d.workspace) {
    TRIAX_CHECK_CUDA(cudaDeviceSynchronize());
    cuda_allocator().deallocate(d.workspace, d.workspace_bytes, device);
    d.workspace = nullptr;
    d.workspace_bytes = 0;
  }
  d.workspace = cuda_allocator().allocate(want, device);
  d.workspace_bytes = want;
}

Entry build_entry(DeviceCache& d, const CudnnAttentionKey& k) {
  Entry e;
  if (!d.handle) {
    e.why = d.handle_error;
    return e;
  }
  std::string tried;
  // Backward: cuDNN's deterministic algorithm first (triax's kernels are deterministic too).
  const int tries = k.backward ? 2 : 1;  // forward: one graph; backward: deterministic, then not
  for (int i = 0; i < tries; ++i) {
    const bool det = k.backward && i == 0;
    auto g = k.backward ? backward_graph(k, det) : forward_graph(k);
    if (auto why = build(*g, d.handle)) {
      const char* which = k.backward ? (det ? "deterministic: " : "default: ") : "";
      tried += fmt::format("{}{}{}", tried.empty() ? "" : "; ", which, *why);
      continue;
    }
    int64_t ws = 0;
    if (auto why = fe_failure("Graph::get_workspace_size", g->get_workspace_size(ws))) {
      tried += (tried.empty() ? "" : "; ") + *why;
      continue;
    }
    reserve_workspace(d, d.device, ws);
    e.graph = std::move(g);
    e.deterministic = det;
    log::debug("cuDNN attention: built {}{}, workspace {} bytes", to_string(k),
               k.backward ? (det ? " (deterministic)" : " (non-deterministic)") : "", ws);
    return e;
  }
  e.why = tried;
  return e;
}

Entry& entry(DeviceCache& d, const CudnnAttentionKey& k) {
  auto it = d.graphs.find(k);
  if (it == d.graphs.end()) it = d.graphs.emplace(k, build_entry(d, k)).first;
  return it->second;
}

// ---------------------------------------------------------------- calls

// The key of a call, after the checks.
CudnnAttentionKey check_call(const char* op, DType dtype, int B, int T, int C, int NH, int NKV, bool backward) {
  if (dtype != DType::bf16 && dtype != DType::f16)
    TRIAX_THROW(ConfigError, "{}: dtype {} is not supported (cuDNN's fused attention takes bfloat16 or float16; "
                "float32 runs on cuda::attention_forward/backward)", op, dtype_name(dtype));
  if (B <= 0 || T <= 0 || C <= 0 || NH <= 0 || NKV < 0)
    TRIAX_THROW(ConfigError, "{}: sizes B={} T={} C={} NH={} must be positive (NKV={} not negative)", op, B, T, C, NH,
                NKV);
  if (C % NH != 0) TRIAX_THROW(ConfigError, "{}: NH={} does not divide C={}", op, NH, C);
  if (NKV > 0 && NH % NKV != 0)
    TRIAX_THROW(ConfigError, "{}: NKV={} key/value heads do not divide NH={} query heads", op, NKV, NH);
  return {dtype, B, T, NH, C / NH, backward, cudnn_attention_key_kv(NH, NKV)};
}

// Half-type tensors 16-byte aligned (cuDNN's Hopper kernels load them with TMA; our allocations are
// 256-byte aligned, and with HS % 8 == 0 so are the K and V views); lse float-aligned.
void require_pointer(const char* op, const char* name, const void* p, size_t align = 16) {
  if (!p) TRIAX_THROW(ConfigError, "{}: {} is null", op, name);
  if (reinterpret_cast<uintptr_t>(p) % align != 0)
    TRIAX_THROW(ConfigError, "{}: {} = {} is not {}-byte aligned (cuDNN attention needs it)", op, name, p, align);
}

// Byte pointer to element `offset` of a half-type buffer (every view's offset is in elements).
void* at(const void* base, int64_t offset) {
  return const_cast<char*>(static_cast<const char*>(base)) + offset * 2;
}

void run(const char* op, const CudnnAttentionKey& k, std::unordered_map<int64_t, void*>& pack, cudaStream_t stream) {
  Cache& c = cache();
  std::lock_guard lock(c.mu);
  DeviceCache& d = device_cache(c);
  Entry& e = entry(d, k);
  if (!e.graph) TRIAX_THROW(DeviceError, "{}: cuDNN cannot run {}: {}", op, to_string(k), e.why);
  if (const cudnnStatus_t s = cudnnSetStream(d.handle, stream); s != CUDNN_STATUS_SUCCESS)
    throw_cudnn("cudnnSetStream", s);
  if (auto why = fe_failure("Graph::execute", e.graph->execute(d.handle, pack, d.workspace)))
    TRIAX_THROW(DeviceError, "{}: cuDNN failed on {}: {}", op, to_string(k), *why);
}

}  // namespace

bool cudnn_attention_built() { return true; }

std::string cudnn_attention_version() {
  const size_t v = cudnnGetVersion();
  return fmt::format("cuDNN {}.{}.{} (headers {}.{}.{}), frontend {}.{}.{}", v / 10000, v / 100 % 100, v % 100,
                     CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL, CUDNN_FRONTEND_MAJOR_VERSION,
                     CUDNN_FRONTEND_MINOR_VERSION, CUDNN_FRONTEND_PATCH_VERSION);
}

namespace {
// Why the shape itself is out (before any graph), or nullopt.
std::optional<std::string> bad_shape(DType dtype, int B, int T, int NH, int HS, int NKV) {
  if (dtype != DType::bf16 && dtype != DType::f16)
    return fmt::format("dtype {}: cuDNN's fused attention takes bfloat16 or float16", dtype_name(dtype));
  if (B <= 0 || T <= 0 || NH <= 0 || HS <= 0 || NKV < 0)
    return fmt::format("sizes B={} T={} NH={} HS={} must be positive (NKV={} not negative)", B, T, NH, HS, NKV);
  if (NKV > 0 && NH % NKV != 0) return fmt::format("NKV={} key/value heads do not divide NH={}", NKV, NH);
  return std::nullopt;
}
}  // namespace

std::optional<std::string> cudnn_attention_unsupported_reason(DType dtype, int B, int T, int NH, int HS, int NKV) {
  if (auto why = bad_shape(dtype, B, T, NH, HS, NKV)) return why;
  const int kv = cudnn_attention_key_kv(NH, NKV);
  try {
    Cache& c = cache();
    std::lock_guard lock(c.mu);
    DeviceCache& d = device_cache(c);
    for (const bool backward : {false, true}) {
      const Entry& e = entry(d, CudnnAttentionKey{dtype, B, T, NH, HS, backward, kv});
      if (!e.graph) return fmt::format("{}: {}", backward ? "backward" : "forward", e.why);
    }
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

std::optional<std::string> cudnn_attention_check_graphs(DType dtype, int B, int T, int NH, int HS, int sm_version,
                                                        int NKV) {
  if (auto why = bad_shape(dtype, B, T, NH, HS, NKV)) return why;
  for (const bool backward : {false, true}) {
    const CudnnAttentionKey k{dtype, B, T, NH, HS, backward, cudnn_attention_key_kv(NH, NKV)};
    auto g = backward ? backward_graph(k, true, sm_version) : forward_graph(k, sm_version);
    if (auto why = fe_failure("Graph::validate", g->validate()))
      return fmt::format("{}: {}", backward ? "backward" : "forward", *why);
  }
  return std::nullopt;
}

bool cudnn_attention_backward_deterministic(DType dtype, int B, int T, int NH, int HS, int NKV) {
  if (cudnn_attention_unsupported_reason(dtype, B, T, NH, HS, NKV)) return false;
  Cache& c = cache();
  std::lock_guard lock(c.mu);
  const CudnnAttentionKey k{dtype, B, T, NH, HS, true, cudnn_attention_key_kv(NH, NKV)};
  return entry(device_cache(c), k).deterministic;
}

void cudnn_attention_forward(DType dtype, void* out, float* lse, const void* qkv, int B, int T, int C, int NH,
                             int NKV, cudaStream_t stream) {
  const char* op = "cuda::cudnn_attention_forward";
  const CudnnAttentionKey k = check_call(op, dtype, B, T, C, NH, NKV, false);
  require_pointer(op, "out", out);
  require_pointer(op, "lse", lse, alignof(float));
  require_pointer(op, "qkv", qkv);
  std::unordered_map<int64_t, void*> pack{{kQ, at(qkv, view(AttentionTensor::q, k).offset)},
                                          {kK, at(qkv, view(AttentionTensor::k, k).offset)},
                                          {kV, at(qkv, view(AttentionTensor::v, k).offset)},
                                          {kO, out},
                                          {kStats, lse}};
  run(op, k, pack, stream);
}

void cudnn_attention_backward(DType dtype, void* dqkv, const void* dout, const void* qkv, const void* out,
                              const float* lse, int B, int T, int C, int NH, int NKV, cudaStream_t stream) {
  const char* op = "cuda::cudnn_attention_backward";
  const CudnnAttentionKey k = check_call(op, dtype, B, T, C, NH, NKV, true);
  require_pointer(op, "dqkv", dqkv);
  require_pointer(op, "dout", dout);
  require_pointer(op, "qkv", qkv);
  require_pointer(op, "out", out);
  require_pointer(op, "lse", lse, alignof(float));
  const int64_t oq = view(AttentionTensor::q, k).offset, ok = view(AttentionTensor::k, k).offset,
                ov = view(AttentionTensor::v, k).offset;
  std::unordered_map<int64_t, void*> pack{{kQ, at(qkv, oq)},   {kK, at(qkv, ok)},   {kV, at(qkv, ov)},
                                          {kO, at(out, 0)},    {kdO, at(dout, 0)},  {kStats, at(lse, 0)},
                                          {kdQ, at(dqkv, oq)}, {kdK, at(dqkv, ok)}, {kdV, at(dqkv, ov)}};
  run(op, k, pack, stream);
}

void cudnn_attention_release() {
  Cache& c = cache();
  std::lock_guard lock(c.mu);
  int current = -1;
  (void)cudaGetDevice(&current);
  for (auto& [dev, d] : c.devices) {
    (void)cudaSetDevice(dev);
    d.graphs.clear();
    if (d.workspace) {
      (void)cudaDeviceSynchronize();
      cuda_allocator().deallocate(d.workspace, d.workspace_bytes, dev);
    }
    if (d.handle) (void)cudnnDestroy(d.handle);
  }
  c.devices.clear();
  if (current >= 0) (void)cudaSetDevice(current);
}

size_t cudnn_attention_workspace_bytes() {
  Cache& c = cache();
  std::lock_guard lock(c.mu);
  int dev = -1;
  TRIAX_CHECK_CUDA(cudaGetDevice(&dev));
  const auto it = c.devices.find(dev);
  return it == c.devices.end() ? 0 : it->second.workspace_bytes;
}

}  // namespace triax::cuda
