// Counter-based random numbers: a value depends only on its key
// (seed, stream, counter, index), never on threads, chunking or backend.
#pragma once

#include "pysharp/core/std.hpp"

#include "pysharp/core/config.hpp"

namespace pysharp {

// SplitMix64 finaliser: a bijective 64-bit mixer with full avalanche.
PYSHARP_HD inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

PYSHARP_HD inline std::uint64_t hash4(std::uint64_t seed, std::uint64_t stream,
                                       std::uint64_t counter, std::uint64_t index) {
  return mix64(mix64(mix64(mix64(seed) ^ stream) ^ counter) ^ index);
}

// Uniform in (0, 1): 53 random bits, offset by half an ulp so 0 never occurs.
PYSHARP_HD inline double uniform_open(std::uint64_t bits) {
  return (static_cast<double>(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Standard normal number `index` of the stream (seed, stream, counter),
// by Box-Muller on two independent hashes.
PYSHARP_HD inline double normal(std::uint64_t seed, std::uint64_t stream,
                                std::uint64_t counter, std::uint64_t index) {
  const double u1 = uniform_open(hash4(seed, stream, counter, 2 * index));
  const double u2 = uniform_open(hash4(seed, stream, counter, 2 * index + 1));
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

}  // namespace pysharp
