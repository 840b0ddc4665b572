// Bindings for Hessian spectra of pysharp._core: stochastic Lanczos quadrature
// (cpu/slq.hpp), one overload of slq() per model holder.
#include "builtin_models.hpp"
#include "holders.hpp"

namespace pysharp::module {

void bind_spectra(py::module_& m) {
#define PYSHARP_DEF_SLQ(Model) def_slq<CpuExec, Model##Core<double>>(m);
  PYSHARP_BUILTIN_MODELS(PYSHARP_DEF_SLQ)
#undef PYSHARP_DEF_SLQ
  // the square-loss models of bind_stability.cpp
  def_slq<CpuExec, LinearRegressionCore<double>>(m);
  def_slq<CpuExec, TwoLayerNetCore<double>>(m);
}

}  // namespace pysharp::module
