// cpu_isa(): the CPU's instruction sets (cpuid through the compiler builtin) and the override.
#include "triax/core/cpu_isa.h"

#include <cstdlib>
#include <string_view>

namespace triax {
namespace {
CpuIsa detect() {
  const char* force = std::getenv("TRIAX_CPU_ISA");
  if (force && std::string_view(force) == "baseline") return CpuIsa::baseline;
#if TRIAX_HAVE_AVX2_DISPATCH
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) return CpuIsa::avx2;
#endif
  return CpuIsa::baseline;
}
}  // namespace

CpuIsa cpu_isa() {
  static const CpuIsa isa = detect();
  return isa;
}

std::string_view cpu_isa_name(CpuIsa isa) { return isa == CpuIsa::avx2 ? "avx2" : "baseline x86-64"; }

}  // namespace triax
