// CudaBackend (cuda/cuda_backend.h): construction, the stream-ordered allocator, host/device
// copies, fills, element-wise ops, reductions that end on the host, events. The layers, the
// optimizer and the row moves are in cuda_backend_ops.cpp.
//
// Memory. Every buffer comes from cudaMallocFromPoolAsync on the backend's compute stream, out of
// the device's default memory pool, whose release threshold (cudaMemPoolAttrReleaseThreshold) is
// CudaBackendOptions::pool_release_threshold: freed blocks stay in the pool, so the steady state of
// training allocates nothing from the driver, and cudaFree (which synchronises the whole device) is
// never called per buffer. A buffer is freed with cudaFreeAsync on the compute stream, i.e. after
// all work enqueued on that stream before the free. Work on ANOTHER stream (an NCCL communicator's)
// is not covered: a buffer that another stream still reads or writes must be ordered before its
// last owner lets it go - record an event on that stream and wait() for it on this backend first
// (or keep the Tensor alive until the communicator's Work completes). The backend counts the bytes
// it hands out (bytes_in_use, peak_bytes) like CpuBackend; pool_used_high() reports the pool's own
// high-water mark (which also sees the launchers' scratch).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "cuda_backend_impl.h"
#include "triax/core/cuda_check.h"
#include "triax/core/gpu_count.h"
#include "triax/cuda/backend_ops.h"
#include "triax/cuda/cast.h"
#include "triax/cuda/device_comm.h"
#include "triax/cuda/grad_norm.h"
#include "triax/cuda/residual.h"

namespace triax::cuda {

using namespace backend_detail;

namespace {

constexpr size_t kWordsBytes = sizeof(int64_t) * kRowErrorWords + sizeof(double);

cudaMemPool_t as_pool(CUmemPoolHandle_st* p) { return p; }

// A CUDA event recorded on a backend's stream.
class CudaEvent final : public BackendEvent {
 public:
  CudaEvent(int dev, cudaStream_t stream) : dev_(dev), stream_(stream) {
    TRIAX_CHECK_CUDA(cudaEventCreateWithFlags(&ev_, cudaEventDisableTiming));
    const cudaError_t e = cudaEventRecord(ev_, stream);
    if (e != cudaSuccess) {
      (void)cudaEventDestroy(ev_);
      TRIAX_CHECK_CUDA(e);
    }
  }
  ~CudaEvent() override { (void)cudaEventDestroy(ev_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  bool ready() const override {
    const cudaError_t e = cudaEventQuery(ev_);
    if (e == cudaSuccess) return true;
    if (e == cudaErrorNotReady) {
      // Not an error: keep it out of the next launch's cudaGetLastError().
      if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
      return false;
    }
    TRIAX_CHECK_CUDA(e);
    return false;
  }
  void synchronize() override {
    settle_device_waits(stream_);  // an NCCL call the stream waits on: its errors and deadline
    TRIAX_CHECK_CUDA(cudaEventSynchronize(ev_));
  }
  cudaEvent_t event() const { return ev_; }
  int device() const { return dev_; }

 private:
  int dev_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ev_ = nullptr;
};

}  // namespace

// Counts the bytes of every allocation (the allocator-measured memory of the step).
class CudaBackend::Alloc final : public Allocator {
 public:
  explicit Alloc(CudaBackend& be) : be_(be) {}
  void* allocate(size_t nbytes, int ordinal) override {
    if (ordinal != be_.dev_)
      TRIAX_THROW(ConfigError, "cuda backend allocator: a buffer for cuda:{} from the backend of cuda:{}", ordinal,
                  be_.dev_);
    void* p = be_.raw_alloc(nbytes);
    const size_t now = be_.in_use_.fetch_add(nbytes) + nbytes;
    size_t peak = be_.peak_.load();
    while (now > peak && !be_.peak_.compare_exchange_weak(peak, now)) {
    }
    return p;
  }
  void deallocate(void* p, size_t nbytes, int) noexcept override {
    be_.raw_free(p, nbytes);
    be_.in_use_.fetch_sub(nbytes);
  }
  std::string_view name() const override { return "cuda-backend"; }

 private:
  CudaBackend& be_;
};

CudaBackend::CudaBackend(const CudaBackendOptions& opts) : dev_(opts.device), compute_(opts.compute) {
  use_device();
  TRIAX_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  cudaMemPool_t pool = nullptr;
  TRIAX_CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, dev_));
  pool_ = pool;
  uint64_t threshold = opts.pool_release_threshold;
  TRIAX_CHECK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  alloc_ = std::make_unique<Alloc>(*this);
  gemm_ = std::make_unique<CublasLtGemm>();
  arena_ = std::make_unique<ScratchArena>([this](size_t n) { return alloc_->allocate(n, dev_); },
                                          [this](void* p, size_t n) { alloc_->deallocate(p, n, dev_); });
  dev_words_ = raw_alloc(kWordsBytes);
  TRIAX_CHECK_CUDA(cudaMemsetAsync(dev_words_, 0, kWordsBytes, stream_));
  TRIAX_CHECK_CUDA(cudaMallocHost(&host_words_, kWordsBytes));
  std::memset(host_words_, 0, kWordsBytes);
  TRIAX_CHECK_CUDA(cudaStreamSynchronize(stream_));
  bind_scratch(stream_, arena_.get());  // last: nothing after it can throw and leave it bound
}

CudaBackend::~CudaBackend() {
  (void)cudaSetDevice(dev_);
  (void)cudaStreamSynchronize(stream_);
  bind_scratch(stream_, nullptr);
  arena_.reset();
  gemm_.reset();
  raw_free(dev_words_, kWordsBytes);
  (void)cudaStreamSynchronize(stream_);
  if (host_words_) (void)cudaFreeHost(host_words_);
  (void)cudaStreamDestroy(stream_);
}

void CudaBackend::use_device() const {
  int cur = -1;
  if (cudaGetDevice(&cur) == cudaSuccess && cur == dev_) return;
  TRIAX_CHECK_CUDA(cudaSetDevice(dev_));
}

void* CudaBackend::raw_alloc(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  use_device();
  void* p = nullptr;
  const cudaError_t e = cudaMallocFromPoolAsync(&p, nbytes, as_pool(pool_), stream_);
  if (e == cudaSuccess) return p;
  (void)cudaGetLastError();  // out of memory is not sticky: clear it for the caller
  size_t free_b = 0, total_b = 0;
  (void)cudaMemGetInfo(&free_b, &total_b);
  if (e == cudaErrorMemoryAllocation)
    TRIAX_THROW(OutOfMemoryError, "cuda backend: out of memory allocating {} bytes on cuda:{} ({} in use by the backend, {} of {} bytes free on the device)",
                nbytes, dev_, in_use_.load(), free_b, total_b);
  TRIAX_THROW(DeviceError, "cuda backend: cudaMallocFromPoolAsync of {} bytes on cuda:{} failed: {}", nbytes, dev_,
              cudaGetErrorString(e));
}

void CudaBackend::raw_free(void* p, size_t) noexcept {
  if (p) (void)cudaFreeAsync(p, stream_);
}

Tensor CudaBackend::empty(const Shape& shape, DType dtype) {
  const size_t nbytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  auto st = std::make_shared<Storage>(nbytes, device(), *alloc_);
  return Tensor::on_storage(std::move(st), shape, dtype);
}

void CudaBackend::reset_peak() {
  peak_.store(in_use_.load());
  uint64_t zero = 0;
  TRIAX_CHECK_CUDA(cudaMemPoolSetAttribute(as_pool(pool_), cudaMemPoolAttrUsedMemHigh, &zero));
}

uint64_t CudaBackend::pool_used_high() const {
  uint64_t v = 0;
  TRIAX_CHECK_CUDA(cudaMemPoolGetAttribute(as_pool(pool_), cudaMemPoolAttrUsedMemHigh, &v));
  return v;
}

void CudaBackend::need(const Tensor& t, const char* op, const char* what, int64_t numel) const {
  if (!t.defined()) TRIAX_THROW(ConfigError, "backend {}: {} is undefined", op, what);
  if (t.device() != device())
    TRIAX_THROW(ConfigError, "backend {}: {} is on {}, not cuda:{}", op, what, t.device().str(), dev_);
  if (!t.is_contiguous()) TRIAX_THROW(ConfigError, "backend {}: {} is not dense", op, what);
  if (numel >= 0 && t.numel() < numel)
    TRIAX_THROW(ConfigError, "backend {}: {} holds {} elements, {} needed", op, what, t.numel(), numel);
}

void CudaBackend::sync_checked(const char* op) {
  TRIAX_CHECK_CUDA(cudaMemcpyAsync(host_words_, dev_words_, sizeof(int64_t) * kRowErrorWords, cudaMemcpyDeviceToHost,
                                   stream_));
  host_wait();
  const auto* w = static_cast<const int64_t*>(host_words_);
  if (w[0] == static_cast<int64_t>(RowError::none)) return;
  const int64_t code = w[0], pos = w[1], value = w[2], bound = w[3];
  TRIAX_CHECK_CUDA(cudaMemsetAsync(dev_words_, 0, sizeof(int64_t) * kRowErrorWords, stream_));
  std::memset(host_words_, 0, sizeof(int64_t) * kRowErrorWords);
  const char* bad_op = code == static_cast<int64_t>(RowError::gather_rows) ? "gather_rows" : "scatter_add_rows";
  TRIAX_THROW(ConfigError,
              "backend {}: row index {} at {} outside [0, {}) (found on the device by an earlier {}; reported at {})",
              bad_op, value, pos, bound, bad_op, op);
}

// The host blocks on the compute stream only here: first the NCCL calls the stream was made to
// wait on (device_comm.h) are settled with their deadlines, so a dead peer becomes a CommError or
// TimeoutError naming the call instead of a host stuck in cudaStreamSynchronize.
void CudaBackend::host_wait() {
  settle_device_waits(stream_);
  TRIAX_CHECK_CUDA(cudaStreamSynchronize(stream_));
}

// ---- ordering

std::shared_ptr<BackendEvent> CudaBackend::record() {
  use_device();
  return std::make_shared<CudaEvent>(dev_, stream_);
}

void CudaBackend::wait(const BackendEvent& e) {
  const auto* ce = dynamic_cast<const CudaEvent*>(&e);
  if (!ce) {
    // A host backend's event is complete when it exists; anything else cannot be ordered here.
    if (e.ready()) return;
    TRIAX_THROW(ConfigError, "backend wait: the cuda backend cannot wait on an event of another kind that is not ready");
  }
  use_device();
  TRIAX_CHECK_CUDA(cudaStreamWaitEvent(stream_, ce->event(), 0));
}

std::shared_ptr<Communicator> CudaBackend::adapt(std::shared_ptr<Communicator> world) {
  return make_device_communicator(std::move(world), *this, device_path_from_env());
}

void CudaBackend::synchronize() {
  use_device();
  sync_checked("synchronize");
}

// ---- copies and fills

void CudaBackend::copy_from_host(const Tensor& dst, const void* src, size_t nbytes) {
  need(dst, "copy_from_host", "dst", -1);
  if (nbytes > dst.nbytes())
    TRIAX_THROW(ConfigError, "backend copy_from_host: {} bytes into a {}-byte buffer", nbytes, dst.nbytes());
  if (!nbytes) return;
  use_device();
  TRIAX_CHECK_CUDA(cudaMemcpyAsync(dst.raw_data(), src, nbytes, cudaMemcpyHostToDevice, stream_));
  host_wait();  // the host buffer may be reused on return
}

void CudaBackend::copy_to_host(void* dst, const Tensor& src, size_t nbytes) {
  need(src, "copy_to_host", "src", -1);
  if (nbytes > src.nbytes())
    TRIAX_THROW(ConfigError, "backend copy_to_host: {} bytes from a {}-byte buffer", nbytes, src.nbytes());
  use_device();
  if (nbytes) TRIAX_CHECK_CUDA(cudaMemcpyAsync(dst, src.raw_data(), nbytes, cudaMemcpyDeviceToHost, stream_));
  sync_checked("copy_to_host");
}

void CudaBackend::copy(const Tensor& dst, const Tensor& src) {
  need(dst, "copy", "dst", -1);
  need(src, "copy", "src", -1);
  if (dst.numel() != src.numel() || dst.dtype() != src.dtype())
    TRIAX_THROW(ConfigError, "backend copy: {} from {}", dst.str(), src.str());
  if (dst.raw_data() == src.raw_data() || !src.nbytes()) return;
  use_device();
  const auto* d = static_cast<const char*>(dst.raw_data());
  const auto* s = static_cast<const char*>(src.raw_data());
  const size_t n = src.nbytes();
  if (d < s + n && s < d + n) {
    // Overlapping views of one buffer (memmove on the CPU): through launcher scratch.
    void* tmp = scratch_acquire(n, stream_);
    TRIAX_CHECK_CUDA(cudaMemcpyAsync(tmp, s, n, cudaMemcpyDeviceToDevice, stream_));
    TRIAX_CHECK_CUDA(cudaMemcpyAsync(dst.raw_data(), tmp, n, cudaMemcpyDeviceToDevice, stream_));
    scratch_release(tmp, stream_);
    return;
  }
  TRIAX_CHECK_CUDA(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), n, cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::copy_columns(const Tensor& dst, const Tensor& src, int64_t rows, int dst_width, int dst_col0,
                               int src_width, int src_col0, int ncols) {
  need(dst, "copy_columns", "dst", rows * dst_width);
  need(src, "copy_columns", "src", rows * src_width);
  if (dst.dtype() != src.dtype())
    TRIAX_THROW(ConfigError, "backend copy_columns: dst {} and src {} differ in type", dst.str(), src.str());
  if (ncols < 0 || dst_col0 < 0 || src_col0 < 0 || dst_col0 + ncols > dst_width || src_col0 + ncols > src_width)
    TRIAX_THROW(ConfigError, "backend copy_columns: columns [{}, +{}) of rows {} wide into [{}, +{}) of rows {} wide",
                src_col0, ncols, src_width, dst_col0, ncols, dst_width);
  if (rows == 0 || ncols == 0) return;
  use_device();
  const size_t e = dst.element_size();
  TRIAX_CHECK_CUDA(cudaMemcpy2DAsync(static_cast<char*>(dst.raw_data()) + static_cast<size_t>(dst_col0) * e,
                                     static_cast<size_t>(dst_width) * e,
                                     static_cast<const char*>(src.raw_data()) + static_cast<size_t>(src_col0) * e,
                                     static_cast<size_t>(src_width) * e, static_cast<size_t>(ncols) * e,
                                     static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::fill(const Tensor& x, double value) {
  need(x, "fill", "x", -1);
  use_device();
  fill_pattern(x.raw_data(), x.numel(), static_cast<int>(x.element_size()), fill_bits(x.dtype(), value), stream_);
}

void CudaBackend::scale(const Tensor& x, double a) {
  need(x, "scale", "x", -1);
  use_device();
  by_float(x.dtype(), "scale", [&](auto r) {
    using R = decltype(r);
    cuda::scale(ptr<R>(x, "scale", "x"), x.numel(), a, stream_);
  });
}

void CudaBackend::axpy(const Tensor& y, double a, const Tensor& x) {
  need(y, "axpy", "y", -1);
  need(x, "axpy", "x", y.numel());
  use_device();
  by_float(y.dtype(), "axpy", [&](auto r) {
    using R = decltype(r);
    cuda::axpy(ptr<R>(y, "axpy", "y"), a, static_cast<const R*>(ptr<R>(x, "axpy", "x")), y.numel(), stream_);
  });
}

void CudaBackend::residual(const Tensor& out, const Tensor& x, const Tensor& y) {
  need(out, "residual", "out", -1);
  need(x, "residual", "a", out.numel());
  need(y, "residual", "b", out.numel());
  use_device();
  by_act(out.dtype(), "residual", [&](auto r) {
    using R = decltype(r);
    residual_forward(ptr<R>(out, "residual", "out"), static_cast<const R*>(ptr<R>(x, "residual", "a")),
                     static_cast<const R*>(ptr<R>(y, "residual", "b")), out.numel(), stream_);
  });
}

void CudaBackend::cast(const Tensor& dst, const Tensor& src) {
  need(dst, "cast", "dst", -1);
  need(src, "cast", "src", dst.numel());
  use_device();
  if (dst.dtype() == src.dtype()) {
    if (dst.raw_data() != src.raw_data() && dst.nbytes())
      TRIAX_CHECK_CUDA(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(), cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  const DType a = dst.dtype(), b = src.dtype();
  const int64_t n = dst.numel();
  if (a == DType::bf16 && b == DType::f32) cuda::cast(dst.data<bf16>(), src.data<float>(), n, stream_);
  else if (a == DType::f16 && b == DType::f32) cuda::cast(dst.data<f16>(), src.data<float>(), n, stream_);
  else if (a == DType::f32 && b == DType::bf16) cuda::cast(dst.data<float>(), src.data<bf16>(), n, stream_);
  else if (a == DType::f32 && b == DType::f16) cuda::cast(dst.data<float>(), src.data<f16>(), n, stream_);
  else
    TRIAX_THROW(ConfigError, "backend cast: {} from {} is not supported (float32 <-> bfloat16 or float16)",
                dtype_name(a), dtype_name(b));
}

// ---- reductions that end on the host

double CudaBackend::sum(const Tensor& x) {
  need(x, "sum", "x", -1);
  use_device();
  auto* dres = reinterpret_cast<double*>(static_cast<int64_t*>(dev_words_) + kRowErrorWords);
  TRIAX_CHECK_CUDA(cudaMemsetAsync(dres, 0, sizeof(double), stream_));
  by_float(x.dtype(), "sum", [&](auto r) {
    using R = decltype(r);
    reduce_into(dres, static_cast<const R*>(ptr<R>(x, "sum", "x")), x.numel(), ReduceKind::sum, stream_);
  });
  auto* hres = reinterpret_cast<double*>(static_cast<int64_t*>(host_words_) + kRowErrorWords);
  TRIAX_CHECK_CUDA(cudaMemcpyAsync(hres, dres, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  sync_checked("sum");
  return *hres;
}

void CudaBackend::sum_squares_into(const Tensor& acc, int64_t index, const Tensor& x) {
  need(acc, "sum_squares_into", "acc", index + 1);
  need(x, "sum_squares_into", "x", -1);
  if (index < 0) TRIAX_THROW(ConfigError, "backend sum_squares_into: negative index {}", index);
  double* pa = ptr<double>(acc, "sum_squares_into", "acc") + index;
  use_device();
  switch (x.dtype()) {
    case DType::f32: sumsq_accumulate(pa, x.data<float>(), x.numel(), stream_); return;
    case DType::bf16: sumsq_accumulate(pa, x.data<bf16>(), x.numel(), stream_); return;
    case DType::f16: sumsq_accumulate(pa, x.data<f16>(), x.numel(), stream_); return;
    case DType::f64: reduce_into(pa, x.data<double>(), x.numel(), ReduceKind::sumsq, stream_); return;
    default:
      TRIAX_THROW(ConfigError, "backend sum_squares_into: x is {}, not a floating type", dtype_name(x.dtype()));
  }
}

void CudaBackend::count_nonfinite_into(const Tensor& acc, int64_t index, const Tensor& x) {
  need(acc, "count_nonfinite_into", "acc", index + 1);
  need(x, "count_nonfinite_into", "x", -1);
  if (index < 0) TRIAX_THROW(ConfigError, "backend count_nonfinite_into: negative index {}", index);
  double* pa = ptr<double>(acc, "count_nonfinite_into", "acc") + index;
  use_device();
  by_float(x.dtype(), "count_nonfinite_into", [&](auto r) {
    using R = decltype(r);
    reduce_into(pa, x.data<R>(), x.numel(), ReduceKind::nonfinite, stream_);
  });
}

// ---- entry points

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& opts) {
  if (opts.compute != DType::f32 && opts.compute != DType::bf16 && opts.compute != DType::f16)
    TRIAX_THROW(ConfigError, "cuda backend: compute type {} is not supported (float32, bfloat16 or float16)",
                dtype_name(opts.compute));
  std::string why;
  const int n = cuda_device_count(&why);
  if (opts.device < 0 || opts.device >= n)
    TRIAX_THROW(DeviceError, "CUDA backend: device cuda:{} is not available: {} CUDA device(s) visible{}{}",
                opts.device, n, n ? "" : " (", n ? "" : why + ")");
  return std::make_unique<CudaBackend>(opts);
}

cudaStream_t compute_stream(const Backend& be) {
  const auto* c = dynamic_cast<const CudaBackend*>(&be);
  return c ? c->stream() : nullptr;
}

uint64_t pool_used_high(const Backend& be) {
  const auto* c = dynamic_cast<const CudaBackend*>(&be);
  return c ? c->pool_used_high() : 0;
}

}  // namespace triax::cuda
