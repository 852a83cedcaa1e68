// Is there a usable GPU? cuda_device_count() answers in every build: 0 without CUDA support,
// without a driver, or on any CUDA error, so CPU-only machines and CUDA tests can branch on it.
#pragma once
#include <string>

namespace triax {

// Number of CUDA devices this process can use; 0 on any error. If why is given and the answer is
// 0, it receives the reason ("built without CUDA", "cudaErrorNoDevice: no CUDA-capable device ...").
int cuda_device_count(std::string* why = nullptr) noexcept;

}  // namespace triax
