// The lanes of one warp, as a type: the tile algorithms (tile/*.hpp) are written once
// over a warp policy and compiled twice.
//
//   EmuWarp     (host, g++): a register is an array of 32 values, one per lane;
//               shfl_xor permutes the array; mma.m8n8k4 f64 is an emulation with
//               the PTX fragment layout and a fixed summation order.
//   DeviceWarp  (nvcc, device code): a register is the thread's own value;
//               __shfl_xor_sync and mma.sync.aligned.m8n8k4.row.col.f64 (sm_80+).
//
// A policy P provides P::reg<T> (one T per lane), lane(), shfl_xor, mma and the
// memory access of a lane-dependent index (load/store/load_if), parking a register in
// memory (park/unpark), a warp vote (any), widen (int to long long), a barrier for
// the warp's shared memory (sync), the warp's scalar code (leader, first) and a value
// the compiler may not hoist out of a loop (here). The free
// functions below (where, root, recip, finite) are overloaded for both kinds of register.
//
// Fragment layout of mma.m8n8k4 with f64 operands (PTX ISA, "Matrix fragments for
// mma.m8n8k4 with .f64"), for lane l with group = l >> 2 and quad = l & 3:
//   A (8 x 4, row):  one value, A[group][quad]
//   B (4 x 8, col):  one value, B[quad][group]
//   C, D (8 x 8):    two values, C[group][2 quad + i], i = 0, 1
// Row `group` of D involves row `group` of A and C only: the rows of a tile (one
// trajectory each) never mix, whatever the other rows hold.
//
// Standard library: <cmath> only (the NVRTC path has none of the rest).
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define PYSHARP_TILE_HD __host__ __device__ __forceinline__
#else
#define PYSHARP_TILE_HD inline
#endif

// Before a loop over a register array: unrolled fully on the device, so that the array
// stays in registers (a dynamically indexed one goes to local memory).
// Before a loop that runs once per record, not per step: kept rolled on the device, so
// that it stays smaller than the step loop (which bench.gpu_static reads as the step).
// Toy3D's thread needs it; the BN-linreg tile's record loop is small beside its step, and
// rolled there it spilled 48 bytes at d 100 n 200.
#if defined(__CUDACC__)
#define PYSHARP_UNROLL _Pragma("unroll")
#define PYSHARP_ROLLED _Pragma("unroll 1")
#else
#define PYSHARP_UNROLL
#define PYSHARP_ROLLED
#endif

namespace pysharp::tile {

inline constexpr int kWarpLanes = 32;

// ---------------------------------------------------------------- scalar registers
// (DeviceWarp, and any scalar code such as one thread per trajectory)

template <class T>
PYSHARP_TILE_HD T where(bool m, T a, T b) {
  return m ? a : b;
}
PYSHARP_TILE_HD bool finite(double x) { return x - x == 0.0; }  // not NaN, not inf
PYSHARP_TILE_HD double root(double x) {
#if defined(__CUDA_ARCH__)
  return __dsqrt_rn(x);
#else
  return std::sqrt(x);
#endif
}
// 1 / x, correctly rounded (as the division is).
PYSHARP_TILE_HD double recip(double x) {
#if defined(__CUDA_ARCH__)
  return __drcp_rn(x);
#else
  return 1.0 / x;
#endif
}

// ---------------------------------------------------------------- emulated registers

// One value per lane of a warp; every operation is lane by lane.
template <class T>
struct LaneArray {
  T v[kWarpLanes];

  LaneArray() = default;
  LaneArray(T x) {  // NOLINT: a scalar is the same value in every lane
    for (int l = 0; l < kWarpLanes; ++l) v[l] = x;
  }
  T& operator[](int l) { return v[l]; }
  const T& operator[](int l) const { return v[l]; }
};

#define PYSHARP_TILE_LANEWISE(OP, RESULT)                                                  \
  template <class T>                                                                       \
  LaneArray<RESULT> operator OP(const LaneArray<T>& a, const LaneArray<T>& b) {            \
    LaneArray<RESULT> r;                                                                   \
    for (int l = 0; l < kWarpLanes; ++l) r.v[l] = a.v[l] OP b.v[l];                        \
    return r;                                                                              \
  }                                                                                        \
  template <class T>                                                                       \
  LaneArray<RESULT> operator OP(const LaneArray<T>& a, const T& b) {                       \
    return a OP LaneArray<T>(b);                                                           \
  }                                                                                        \
  template <class T>                                                                       \
  LaneArray<RESULT> operator OP(const T& a, const LaneArray<T>& b) {                       \
    return LaneArray<T>(a) OP b;                                                           \
  }
PYSHARP_TILE_LANEWISE(+, T)
PYSHARP_TILE_LANEWISE(-, T)
PYSHARP_TILE_LANEWISE(*, T)
PYSHARP_TILE_LANEWISE(/, T)
PYSHARP_TILE_LANEWISE(&, T)
PYSHARP_TILE_LANEWISE(|, T)
PYSHARP_TILE_LANEWISE(^, T)
PYSHARP_TILE_LANEWISE(<, bool)
PYSHARP_TILE_LANEWISE(>, bool)
PYSHARP_TILE_LANEWISE(>=, bool)
PYSHARP_TILE_LANEWISE(==, bool)
#undef PYSHARP_TILE_LANEWISE

template <class T>
LaneArray<T>& operator+=(LaneArray<T>& a, const LaneArray<T>& b) {
  return a = a + b;
}
template <class T>
LaneArray<T> operator>>(const LaneArray<T>& a, int s) {
  LaneArray<T> r;
  for (int l = 0; l < kWarpLanes; ++l) r.v[l] = a.v[l] >> s;
  return r;
}
inline LaneArray<bool> operator!(const LaneArray<bool>& a) {
  LaneArray<bool> r;
  for (int l = 0; l < kWarpLanes; ++l) r.v[l] = !a.v[l];
  return r;
}
template <class T>
LaneArray<T> where(const LaneArray<bool>& m, const LaneArray<T>& a, const LaneArray<T>& b) {
  LaneArray<T> r;
  for (int l = 0; l < kWarpLanes; ++l) r.v[l] = m.v[l] ? a.v[l] : b.v[l];
  return r;
}
inline LaneArray<bool> finite(const LaneArray<double>& x) { return x - x == LaneArray<double>(0.0); }
inline LaneArray<double> recip(const LaneArray<double>& x) { return 1.0 / x; }
inline LaneArray<double> root(const LaneArray<double>& x) {
  LaneArray<double> r;
  for (int l = 0; l < kWarpLanes; ++l) r.v[l] = std::sqrt(x.v[l]);
  return r;
}

// The warp as the CPU sees it.
struct EmuWarp {
  template <class T>
  using reg = LaneArray<T>;

  static reg<int> lane() {
    reg<int> r;
    for (int l = 0; l < kWarpLanes; ++l) r.v[l] = l;
    return r;
  }
  // Lane l receives x from lane l ^ mask.
  static reg<double> shfl_xor(const reg<double>& x, int mask) {
    reg<double> r;
    for (int l = 0; l < kWarpLanes; ++l) r.v[l] = x.v[l ^ mask];
    return r;
  }
  // D = A B + C in place of C (c0, c1), fragments as in the header comment. Each
  // element is a chain of fused multiply-adds over k = 0..3 in order, starting from C.
  // Whether DMMA rounds the same way is a device measurement (docs/architecture.rst).
  static void mma(reg<double>& c0, reg<double>& c1, const reg<double>& a,
                  const reg<double>& b) {
    reg<double> d[2];
    for (int l = 0; l < kWarpLanes; ++l) {
      const int group = l >> 2, quad = l & 3;
      for (int i = 0; i < 2; ++i) {
        const int col = 2 * quad + i;
        double acc = i == 0 ? c0.v[l] : c1.v[l];
        for (int k = 0; k < 4; ++k)
          acc = std::fma(a.v[group * 4 + k],  // A[group][k] sits in lane 4 group + k
                         b.v[col * 4 + k],    // B[k][col] sits in lane 4 col + k
                         acc);
        d[i].v[l] = acc;
      }
    }
    c0 = d[0];
    c1 = d[1];
  }
  // True in every lane if it is true in any (a warp vote).
  static bool any(const reg<bool>& m) {
    for (int l = 0; l < kWarpLanes; ++l)
      if (m.v[l]) return true;
    return false;
  }
  static reg<long long> widen(const reg<int>& x) {
    reg<long long> r;
    for (int l = 0; l < kWarpLanes; ++l) r.v[l] = x.v[l];
    return r;
  }
  template <class T, class Index>
  static reg<T> load(const T* p, const reg<Index>& index) {
    reg<T> r;
    for (int l = 0; l < kWarpLanes; ++l) r.v[l] = p[index.v[l]];
    return r;
  }
  // A register set aside in (shared) memory and taken back: slot k of a warp's area
  // is 32 consecutive doubles, one per lane. volatile: the compiler may not keep the
  // value in a register instead, which is the point of parking it.
  static void park(volatile double* p, int k, const reg<double>& x) {
    for (int l = 0; l < kWarpLanes; ++l) p[k * kWarpLanes + l] = x.v[l];
  }
  static reg<double> unpark(const volatile double* p, int k) {
    reg<double> r;
    for (int l = 0; l < kWarpLanes; ++l) r.v[l] = p[k * kWarpLanes + l];
    return r;
  }
  template <class T, class Index>
  static void store(T* p, const reg<Index>& index, const reg<T>& x, const reg<bool>& m) {
    for (int l = 0; l < kWarpLanes; ++l)
      if (m.v[l]) p[index.v[l]] = x.v[l];
  }
  // p[index] where m, else 0, without touching memory where not m (a read of a slot that
  // another lane may be writing would be a race on the device, even if discarded).
  template <class T, class Index>
  static reg<T> load_if(const T* p, const reg<Index>& index, const reg<bool>& m) {
    reg<T> r;
    for (int l = 0; l < kWarpLanes; ++l) r.v[l] = m.v[l] ? p[index.v[l]] : T(0);
    return r;
  }
  // The lanes' shared-memory writes before it are seen by every lane after it. The
  // emulation runs one lane after another: nothing to do.
  static void sync() {}
  // x, as a value the compiler cannot compute earlier than here (on the device: what
  // depends on it cannot be hoisted out of the loop around it and kept in registers).
  template <class T>
  static T here(const T& x) {
    return x;
  }
  // Whether this lane runs the warp's scalar code (records of warp-uniform values): the
  // emulation runs such code once, for the whole warp.
  static bool leader() { return true; }
  // Lane 0's value of a register (of a warp-uniform one: the value). DeviceWarp's is the
  // thread's own value, no shuffle: it is called under leader() alone.
  template <class T>
  static T first(const reg<T>& x) {
    return x.v[0];
  }
};

// ---------------------------------------------------------------- device registers
#if defined(__CUDACC__)
struct DeviceWarp {
  template <class T>
  using reg = T;

  __device__ __forceinline__ static int lane() { return static_cast<int>(threadIdx.x) & 31; }
  __device__ __forceinline__ static double shfl_xor(double x, int mask) {
    return __shfl_xor_sync(0xffffffffu, x, mask);
  }
  __device__ __forceinline__ static void mma(double& c0, double& c1, double a, double b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};"
        : "+d"(c0), "+d"(c1)
        : "d"(a), "d"(b));
#else
    // No f64 mma before sm_80: the tile kernels compile to a trap there
    // (tile_kernels.cuh), and their launchers refuse such a device.
    (void)a;
    (void)b;
    c0 = c1 = __longlong_as_double(0x7ff8000000000000LL);  // NaN
#endif
  }
  __device__ __forceinline__ static bool any(bool m) { return __any_sync(0xffffffffu, m); }
  __device__ __forceinline__ static long long widen(int x) { return x; }
  template <class T, class Index>
  __device__ __forceinline__ static T load(const T* p, Index index) {
    return p[index];
  }
  __device__ __forceinline__ static void park(volatile double* p, int k, double x) {
    p[k * kWarpLanes + lane()] = x;
  }
  __device__ __forceinline__ static double unpark(const volatile double* p, int k) {
    return p[k * kWarpLanes + lane()];
  }
  template <class T, class Index>
  __device__ __forceinline__ static void store(T* p, Index index, T x, bool m) {
    if (m) p[index] = x;
  }
  template <class T, class Index>
  __device__ __forceinline__ static T load_if(const T* p, Index index, bool m) {
    return m ? p[index] : T(0);
  }
  __device__ __forceinline__ static void sync() { __syncwarp(); }
  __device__ __forceinline__ static long long here(long long x) {
    asm volatile("mov.b64 %0, %0;" : "+l"(x));
    return x;
  }
  __device__ __forceinline__ static bool leader() { return (threadIdx.x & 31) == 0; }
  template <class T>
  __device__ __forceinline__ static T first(T x) {
    return x;
  }
};
#endif

// ---------------------------------------------------------------- shared idioms

// Sum over the four lanes of a quad (one trajectory's row of a tile) by a butterfly:
// every lane of the quad ends with the same bits, (a + b) + (c + d) in some order of
// commutative additions, whichever lane it is.
template <class P, class R>
PYSHARP_TILE_HD R quad_sum(R x) {
  x = x + P::shfl_xor(x, 1);
  return x + P::shfl_xor(x, 2);
}

// Sum over the 32 lanes of a warp by a butterfly: every lane ends with the same bits, and
// the order of the additions depends on nothing but the lanes' values.
template <class P, class R>
PYSHARP_TILE_HD R warp_sum(R x) {
  PYSHARP_UNROLL
  for (int mask = kWarpLanes / 2; mask >= 1; mask >>= 1) x = x + P::shfl_xor(x, mask);
  return x;
}

}  // namespace pysharp::tile
