// Stream-bound scratch for the CUDA launchers (cuda/scratch.h): a stack in one buffer per bound
// stream, cudaMallocAsync for streams without an arena.
#include "triax/cuda/scratch.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "triax/core/cuda_check.h"
#include "triax/core/error.h"

namespace triax::cuda {
namespace {

size_t round_up(size_t n) { return (n + ScratchArena::kAlign - 1) / ScratchArena::kAlign * ScratchArena::kAlign; }

// Few streams have arenas (one per backend): a short list under a mutex.
std::mutex g_mu;
std::vector<std::pair<cudaStream_t, ScratchArena*>>& bindings() {
  static std::vector<std::pair<cudaStream_t, ScratchArena*>> b;
  return b;
}

}  // namespace

ScratchArena::ScratchArena(AllocFn alloc, FreeFn free) : alloc_(std::move(alloc)), free_(std::move(free)) {}

ScratchArena::~ScratchArena() {
  if (base_) free_(base_, cap_);
}

void* ScratchArena::push(size_t nbytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t need = round_up(nbytes);
  want_ = std::max(want_, top_ + need);
  if (depth_ == 0 && want_ > cap_) {
    // Nothing is held: replace the buffer by one of the high-water size. Freed in stream order, so
    // kernels enqueued earlier still see the old memory.
    if (base_) free_(base_, cap_);
    base_ = nullptr;
    cap_ = 0;
    base_ = static_cast<char*>(alloc_(want_));
    cap_ = want_;
  }
  if (top_ + need > cap_ || depth_ == static_cast<int>(std::size(tops_))) {
    ++fallbacks_;
    return nullptr;
  }
  tops_[depth_++] = top_;
  void* p = base_ + top_;
  top_ += need;
  return p;
}

void ScratchArena::pop(void* p) {
  std::lock_guard<std::mutex> lock(mu_);
  if (depth_ == 0 || base_ + tops_[depth_ - 1] != p)
    TRIAX_THROW(ConfigError, "scratch arena: released {} out of order (held {})", p, depth_);
  top_ = tops_[--depth_];
}

void bind_scratch(cudaStream_t stream, ScratchArena* arena) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto& b = bindings();
  std::erase_if(b, [&](const auto& e) { return e.first == stream; });
  if (arena) b.emplace_back(stream, arena);
}

ScratchArena* bound_scratch(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(g_mu);
  for (const auto& [s, a] : bindings())
    if (s == stream) return a;
  return nullptr;
}

void* scratch_acquire(size_t nbytes, cudaStream_t stream) {
  if (nbytes == 0) return nullptr;
  if (ScratchArena* a = bound_scratch(stream))
    if (void* p = a->push(nbytes)) return p;
  void* p = nullptr;
  TRIAX_CHECK_CUDA(cudaMallocAsync(&p, nbytes, stream));
  return p;
}

void scratch_release(void* p, cudaStream_t stream) noexcept {
  if (!p) return;
  if (ScratchArena* a = bound_scratch(stream)) {
    try {
      if (a->owns(p)) {
        a->pop(p);
        return;
      }
    } catch (...) {
      return;  // a release out of order: keep the memory rather than corrupt the stack
    }
  }
  (void)cudaFreeAsync(p, stream);
}

}  // namespace triax::cuda
