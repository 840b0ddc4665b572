// pysharp._cuda's float classes (BNLinearRegression_f32, ...): one translation unit
// per precision, so the two compile in parallel.
#include "cuda/executor.cuh"

void pysharp::cuda_module::bind_f32(py::module_& m) { bind_dtype<float>(m, "_f32"); }
