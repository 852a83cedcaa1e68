// splitmix64: the 64-bit finaliser used wherever triax derives stable pseudo-random values from
// integers (parameter init streams, synthetic data, sample permutations). Header-only.
#pragma once
#include <cstdint>

namespace triax {

constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace triax
