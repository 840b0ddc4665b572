// The scale-invariant models of pysharp._core in double (bind_models.hpp).
#include "bind_models.hpp"

namespace pysharp::module {

void bind_models_f64(py::module_& m) { bind_dtype<double>(m, "_f64"); }

}  // namespace pysharp::module
