// cpu_isa(): the CPU's instruction sets (cpuid through the compiler builtin) and the override.
#include "triax/core/cpu_isa.h"

#include <atomic>
#include <string_view>

#include "triax/core/env.h"
#include "triax/core/error.h"

namespace triax {
namespace {
CpuIsa detect() {
  if (env_choice("TRIAX_CPU_ISA", {"auto", "baseline"}, "auto") == "baseline") return CpuIsa::baseline;
  return cpu_supports_avx2() ? CpuIsa::avx2 : CpuIsa::baseline;
}
std::atomic<CpuIsa>& chosen() {
  static std::atomic<CpuIsa> isa{detect()};
  return isa;
}
}  // namespace

bool cpu_supports_avx2() {
#if TRIAX_HAVE_AVX2_DISPATCH
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

CpuIsa cpu_isa() { return chosen().load(std::memory_order_relaxed); }

CpuIsa set_cpu_isa(CpuIsa isa) {
  if (isa == CpuIsa::avx2 && !cpu_supports_avx2())
    TRIAX_THROW(ConfigError, "set_cpu_isa: this CPU has no AVX2 (the baseline x86-64 loops are the only choice)");
  return chosen().exchange(isa);
}

std::string_view cpu_isa_name(CpuIsa isa) { return isa == CpuIsa::avx2 ? "avx2" : "baseline x86-64"; }

}  // namespace triax
