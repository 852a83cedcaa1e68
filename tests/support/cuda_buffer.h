// Test helpers for CUDA tests: an owning device array with synchronous upload/download and a
// poison fill, so a test can tell "written by the call" from "left over".
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <span>
#include <vector>

#include "triax/core/cuda_check.h"

namespace triax::test {

template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n_) TRIAX_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&p_), n_ * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() {
    if (p_) (void)cudaFree(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* data() const { return p_; }
  size_t size() const { return n_; }
  std::span<T> span() const { return {p_, n_}; }
  std::span<const T> cspan() const { return {p_, n_}; }

  // Synchronous copies on the legacy default stream (complete when they return).
  void upload(const std::vector<T>& host) {
    if (n_) TRIAX_CHECK_CUDA(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
    TRIAX_CHECK_CUDA(cudaDeviceSynchronize());
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_) TRIAX_CHECK_CUDA(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  // Every byte 0x7b: a value no test computes (float 1.3e36, bf16/f16 large, ints huge).
  void poison() {
    if (n_) TRIAX_CHECK_CUDA(cudaMemset(p_, 0x7b, n_ * sizeof(T)));
    TRIAX_CHECK_CUDA(cudaDeviceSynchronize());
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

}  // namespace triax::test
