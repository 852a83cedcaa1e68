// NVTX ranges around the CUDA launchers (kernels/*.cu, src/cuda/*.cpp): a profiler such as Nsight
// Systems shows each op by name on the host timeline, over the kernels it enqueued. NVTX 3 is
// header-only (the toolkit's include/nvtx3, nothing to link): with no tool attached a range costs
// a test of a function pointer.
#pragma once
#include <nvtx3/nvToolsExt.h>

namespace triax::cuda {

// Push on construction, pop on destruction: the range covers the launcher's scope, throws too.
class NvtxRange {
 public:
  explicit NvtxRange(const char* name) noexcept { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace triax::cuda
