# Install step: records how pysharp._core was compiled (its compile_commands.json
# entry) as pysharp/_build_flags.json, so that run-time compiled models
# (pysharp.models.load_model) use the core's own compiler and flags.
# Inputs: PYSHARP_BINARY_DIR, PYSHARP_CXX_COMPILER, PYSHARP_SOURCE (the core's source).
file(READ "${PYSHARP_BINARY_DIR}/compile_commands.json" commands)
string(JSON n LENGTH "${commands}")
math(EXPR last "${n} - 1")
set(entry "")
foreach(i RANGE ${last})
  string(JSON file GET "${commands}" ${i} file)
  if(file STREQUAL "${PYSHARP_SOURCE}")
    string(JSON entry GET "${commands}" ${i})
  endif()
endforeach()
if(entry STREQUAL "")
  message(FATAL_ERROR "pysharp: no compile command for ${PYSHARP_SOURCE} in compile_commands.json")
endif()
set(out "$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}/pysharp/_build_flags.json")
file(WRITE "${out}" "{\"core\": ${entry}}\n")
message(STATUS "pysharp: recorded the core's compile command in ${out}")
