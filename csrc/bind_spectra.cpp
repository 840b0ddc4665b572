// Bindings for Hessian spectra of pysharp._core: stochastic Lanczos quadrature
// (cpu/slq.hpp), one overload of slq() per model holder.
#include "holders.hpp"

namespace pysharp::module {

void bind_spectra(py::module_& m) {
  def_slq<BNLinRegCore<double>>(m);
  def_slq<BNMatrixCompletionCore<double>>(m);
  def_slq<BNTwoLayerNetCore<double>>(m);
  def_slq<Toy3DCore<double>>(m);
  def_slq<LinearRegressionCore<double>>(m);
  def_slq<TwoLayerNetCore<double>>(m);
}


}  // namespace pysharp::module
