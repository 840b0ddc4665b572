// Device compilation of the model headers.
//
// Until the CUDA engine lands (issue: GPU backends), this translation unit
// only proves that every model's loss, gradient, HVP and third-order
// contraction compile as __device__ code from the very headers the CPU
// drivers use. Nothing here is launched yet.
#include <cstdint>

#include "pysharp/models/bn_linear_regression.hpp"
#include "pysharp/models/bn_matrix_completion.hpp"
#include "pysharp/models/derivatives.hpp"
#include "pysharp/models/toy3d.hpp"

namespace pysharp::cuda_check {

// One thread per row; scratch holds scratch_stride elements per row.
template <class Model, class Real>
__global__ void loss_grad_rows(Model m, const Real* W, int B, Real* loss, Real* G,
                               Real* scratch, int scratch_stride, std::uint8_t* ok) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  const long long D = m.dim();
  ok[b] = m.loss_grad(W + b * D, loss + b, G + b * D, scratch + b * scratch_stride);
}

template <class Model, class Real>
__global__ void derivative_rows(Model m, const Real* W, const Real* V, int B, Real* hv,
                                Real* t3, Jet<Real, 1>* s1, Jet<Real, 2>* s2,
                                int scratch_stride, std::uint8_t* ok) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  const long long D = m.dim();
  ok[b] = hvp(m, W + b * D, V + b * D, hv + b * D, s1 + b * scratch_stride) &&
          third_contraction(m, W + b * D, V + b * D, t3 + b * D, s2 + b * scratch_stride);
}

#define PYSHARP_INSTANTIATE(MODEL, REAL)                                                \
  template __global__ void loss_grad_rows<MODEL<REAL>, REAL>(                          \
      MODEL<REAL>, const REAL*, int, REAL*, REAL*, REAL*, int, std::uint8_t*);         \
  template __global__ void derivative_rows<MODEL<REAL>, REAL>(                         \
      MODEL<REAL>, const REAL*, const REAL*, int, REAL*, REAL*, Jet<REAL, 1>*,         \
      Jet<REAL, 2>*, int, std::uint8_t*);

PYSHARP_INSTANTIATE(BNLinearRegression, double)
PYSHARP_INSTANTIATE(BNLinearRegression, float)
PYSHARP_INSTANTIATE(BNMatrixCompletion, double)
PYSHARP_INSTANTIATE(BNMatrixCompletion, float)
PYSHARP_INSTANTIATE(Toy3D, double)
PYSHARP_INSTANTIATE(Toy3D, float)
#undef PYSHARP_INSTANTIATE

}  // namespace pysharp::cuda_check
