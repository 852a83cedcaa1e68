// Scratch memory of the CUDA launchers, bound to a stream. A launcher that needs temporary device
// memory (block partials, sort buffers) asks scratch_acquire(nbytes, stream) and gives it back with
// scratch_release when it has enqueued its kernels. A stream with a ScratchArena bound to it (the
// CUDA backend binds one to its compute stream) gets the memory from the arena: a stack inside one
// buffer, reused by every launch on that stream (stream order makes the reuse safe: the next
// launch's kernels run after the previous ones). The arena grows, between launches only, to the
// largest stack seen, so after the first step no launcher allocates. A stream without an arena
// (tests that call launchers directly) gets cudaMallocAsync/cudaFreeAsync on the stream.
// CUDA builds only (TRIAX_HAVE_CUDA); this header includes no CUDA header.
#pragma once
#include <cstddef>
#include <functional>
#include <mutex>

#include "triax/cuda/stream.h"

namespace triax::cuda {

class ScratchArena {
 public:
  // alloc/free obtain and give back the arena's buffer in stream order (the backend's allocator,
  // so the arena counts in its bytes_in_use).
  using AllocFn = std::function<void*(size_t)>;
  using FreeFn = std::function<void(void*, size_t)>;
  ScratchArena(AllocFn alloc, FreeFn free);
  ~ScratchArena();
  ScratchArena(const ScratchArena&) = delete;
  ScratchArena& operator=(const ScratchArena&) = delete;

  // nbytes from the top of the stack, or nullptr when it does not fit (the caller falls back).
  void* push(size_t nbytes);
  // Gives back the top of the stack (p must be the last push still held).
  void pop(void* p);
  size_t capacity() const { return cap_; }
  size_t high_water() const { return want_; }  // the largest stack asked for so far
  size_t fallbacks() const { return fallbacks_; }  // requests that did not fit (cudaMallocAsync instead)
  // Whether p lies in the arena's buffer (a push still held).
  bool owns(const void* p) const {
    return base_ && static_cast<const char*>(p) >= base_ && static_cast<const char*>(p) < base_ + cap_;
  }

  static constexpr size_t kAlign = 256;

 private:
  AllocFn alloc_;
  FreeFn free_;
  std::mutex mu_;
  char* base_ = nullptr;
  size_t cap_ = 0, top_ = 0, want_ = 0, fallbacks_ = 0;
  size_t tops_[16] = {};  // stack of previous tops (launchers nest at most a few)
  int depth_ = 0;
};

// Binds (arena != nullptr) or unbinds a stream's arena. The arena must outlive the binding.
void bind_scratch(cudaStream_t stream, ScratchArena* arena);
ScratchArena* bound_scratch(cudaStream_t stream);

// nbytes (> 0) of scratch on the stream: from its arena, else cudaMallocAsync on the stream.
void* scratch_acquire(size_t nbytes, cudaStream_t stream);
// Gives back what scratch_acquire returned (in stream order). Never throws.
void scratch_release(void* p, cudaStream_t stream) noexcept;

}  // namespace triax::cuda
