// pysharp._cuda's double classes (BNLinearRegression_f64, ...): one translation unit
// per precision, so the two compile in parallel.
#include "cuda/executor.cuh"

void pysharp::cuda_module::bind_f64(py::module_& m) { bind_dtype<double>(m, "_f64"); }
