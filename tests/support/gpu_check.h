// Test helpers for the CUDA kernel tests (tests/cuda/test_kernels.cpp, test_llama_kernels.cpp,
// test_cudnn_attention.cpp, test_cuda_backend.cpp): a non-blocking stream, NaN poison, the
// storage types' names and tolerances, random inputs exactly representable in the stored type
// (in both forms), downloads as double, the relative error and the one-line report of a check.
#pragma once
#include <catch2/catch.hpp>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "support/cuda_buffer.h"
#include "triax/core/cuda_check.h"
#include "triax/core/dtype.h"
#include "unit/ops_testing.h"

namespace triax::test::gpu {

class Stream {
 public:
  Stream() { TRIAX_CHECK_CUDA(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~Stream() { (void)cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  operator cudaStream_t() const { return s_; }  // NOLINT: the calls' last argument
  void sync() const { TRIAX_CHECK_CUDA(cudaStreamSynchronize(s_)); }

 private:
  cudaStream_t s_ = nullptr;
};

// All bits set: NaN in fp32, bf16 and fp16 (so an element the kernel forgot shows as inf error).
template <class T>
void poison(DeviceBuffer<T>& b) {
  if (b.size()) TRIAX_CHECK_CUDA(cudaMemset(b.data(), 0xff, b.size() * sizeof(T)));
  TRIAX_CHECK_CUDA(cudaDeviceSynchronize());
}

template <class T>
constexpr bool kHalf = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

template <class T>
double to_d(T x) {
  if constexpr (kHalf<T>) return static_cast<float>(x);
  else return static_cast<double>(x);
}
template <class T>
T from_d(double x) {
  if constexpr (kHalf<T>) return T(static_cast<float>(x));
  else return static_cast<T>(x);
}
template <class T>
const char* tname() {
  if constexpr (std::is_same_v<T, float>) return "fp32";
  else if constexpr (std::is_same_v<T, bf16>) return "bf16";
  else return "fp16";
}
// The thresholds by the type a kernel stores: fp32 1e-5; fp16 keeps 10 mantissa bits to bf16's 7,
// so it is held to 2e-3 where bf16 gets 1e-2.
template <class T>
constexpr double tol() {
  if constexpr (std::is_same_v<T, float>) return 1e-5;
  else if constexpr (std::is_same_v<T, f16>) return 2e-3;
  else return 1e-2;
}

// Random values exactly representable in T, in both forms.
template <class T>
struct Data {
  std::vector<T> dev;
  std::vector<double> ref;
};
template <class T>
Data<T> random_data(size_t n, double lo = -1.0, double hi = 1.0) {
  const auto v = random_vec(n, lo, hi);
  Data<T> d;
  d.dev.reserve(n);
  d.ref.reserve(n);
  for (double x : v) {
    d.dev.push_back(from_d<T>(x));
    d.ref.push_back(to_d(d.dev.back()));
  }
  return d;
}

template <class T>
std::vector<double> to_double(const std::vector<T>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = to_d(v[i]);
  return out;
}

template <class T>
std::vector<double> fetch(const DeviceBuffer<T>& b, const Stream& s) {
  s.sync();
  return to_double(b.download());
}

// max|got - want| / max|want| over the tensor; inf where got is not finite and differs from want.
inline double rel_err(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i]) && got[i] != want[i]) return std::numeric_limits<double>::infinity();
    num = std::max(num, std::abs(got[i] - want[i]));
    den = std::max(den, std::abs(want[i]));
  }
  return den > 0 ? num / den : num;
}

// Each check prints one line, "<tag> <what> <type> rel_err <e>  tol <t>  ok|FAIL", what and type
// padded to widths of the test's choice: every test that includes this header defines them once,
//   const triax::test::gpu::CheckLine triax::test::gpu::kCheckLine{"kernel", 40, 5};
struct CheckLine {
  const char* tag;
  int what_width, type_width;
};
extern const CheckLine kCheckLine;

// The line, and the Catch check that err is within tolerance.
inline void report(const std::string& what, std::string_view type, double err, double tolerance) {
  const bool ok = err <= tolerance;
  const CheckLine& l = kCheckLine;
  fmt::print("{} {:<{}} {:<{}} rel_err {:.3e}  tol {:.0e}  {}\n", l.tag, what, l.what_width, type, l.type_width, err,
             tolerance, ok ? "ok" : "FAIL");
  std::fflush(stdout);
  INFO(what << " (" << type << "): relative error " << err << " > " << tolerance);
  CHECK(ok);
}
template <class T>
void check(const std::string& what, const DeviceBuffer<T>& got, const std::vector<double>& want, const Stream& s,
           double tolerance = tol<T>()) {
  report(what, tname<T>(), rel_err(fetch(got, s), want), tolerance);
}

}  // namespace triax::test::gpu
