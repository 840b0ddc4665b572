// The built-in scale-invariant models: the one list from which
//   - pysharp._core binds a class per model and precision (bind_models.hpp) and its
//     stochastic Lanczos quadrature (bind_spectra.cpp),
//   - pysharp._cuda gets one translation unit per model and precision (CMakeLists.txt
//     reads this list; cuda/executor.cuh declares the units, cuda/module.cu binds them),
//   - NVRTC compiles each model's kernels (pysharp/_backends/_cuda_sources.py reads it).
// X(Model): the class template pysharp::Model<Real> of pysharp/models/<model>.hpp, held
// by module::Model##Core<Real> (holders.hpp). Adding a model: its header, a line here,
// its Python class (pysharp/models/), its NumPy oracle (pysharp/reference.py) and a test
// (docs/tutorials/adding_a_model.rst).
#pragma once

#define PYSHARP_BUILTIN_MODELS(X) \
  X(BNLinearRegression)           \
  X(BNMatrixCompletion)           \
  X(BNTwoLayerNet)                \
  X(Toy3D)
