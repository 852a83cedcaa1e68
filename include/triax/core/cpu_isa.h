// Run-time dispatch on the CPU's vector instruction sets: the library is built for baseline
// x86-64 (it must run anywhere), and its memory- and element-bound loops get a second copy built
// for AVX2, chosen once per process from what the CPU reports.
// The AVX2 copies are built without FMA, so they compute exactly the same bits as the baseline
// copies (every operation is an IEEE-rounded add, mul, div or sqrt either way): the ISA changes
// the speed, never a result. TRIAX_CPU_ISA=baseline forces the baseline copies (tests, A/B runs).
#pragma once
#include <string_view>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define TRIAX_HAVE_AVX2_DISPATCH 1
// Marks a function to be compiled for AVX2 (without FMA: see above).
#define TRIAX_TARGET_AVX2 __attribute__((target("avx2")))
#else
#define TRIAX_HAVE_AVX2_DISPATCH 0
#define TRIAX_TARGET_AVX2
#endif

namespace triax {

enum class CpuIsa { baseline, avx2 };

// What the dispatched loops use in this process: avx2 when the CPU has it and TRIAX_CPU_ISA is
// not "baseline" (auto or baseline; read once, at the first call: ConfigError for another value).
CpuIsa cpu_isa();
std::string_view cpu_isa_name(CpuIsa isa);
// Whether this CPU can run the AVX2 copies.
bool cpu_supports_avx2();
// Makes the dispatched loops use isa from now on (tests that compare the copies, A/B runs);
// returns the previous choice. ConfigError for avx2 on a CPU without it. Call it while no op runs.
CpuIsa set_cpu_isa(CpuIsa isa);

}  // namespace triax
