// Bindings for Hessian spectra (issue 14): stochastic Lanczos quadrature,
// batched over points x probes. Included by bindings.cpp after its shared
// helpers and model cores (bindings_stability.hpp included), and registered by
// one call, bind_spectra(m), at the end of the module body.
#pragma once

#include "cpu/bind_cpu.hpp"

namespace {

void bind_spectra(py::module_& m) {
  module::def_slq<BNLinRegCore<double>>(m);
  module::def_slq<BNMatrixCompletionCore<double>>(m);
  module::def_slq<BNTwoLayerNetCore<double>>(m);
  module::def_slq<Toy3DCore<double>>(m);
  module::def_slq<LinearRegressionCore<double>>(m);
  module::def_slq<TwoLayerNetCore<double>>(m);
}

}  // namespace
