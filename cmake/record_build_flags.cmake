# Install step: records how pysharp._core was compiled (its compile_commands.json
# entry) as pysharp/_build_flags.json, so that run-time compiled models
# (pysharp.models.load_model) use the core's own compiler and flags.
# Inputs: PYSHARP_BINARY_DIR, PYSHARP_SOURCE (the core's source), PYSHARP_CORE_MODULES
# (<name>=<CMake target> of each module built: "core=_core" for a single-target build,
# "sse2=_core_sse2;avx2=_core_avx2;..." for a portable one).
# Output: {"core": entry} for a single-target build; {"core": the first entry, "targets":
# {name: entry, ...}} for a portable one, where load_model takes the entry of the set the
# loader chose.
file(READ "${PYSHARP_BINARY_DIR}/compile_commands.json" commands)
string(JSON n LENGTH "${commands}")
math(EXPR last "${n} - 1")
set(targets "")
set(core "")
foreach(module IN LISTS PYSHARP_CORE_MODULES)
  string(REGEX REPLACE "=.*$" "" name "${module}")
  string(REGEX REPLACE "^[^=]*=" "" target "${module}")
  set(entry "")
  foreach(i RANGE ${last})
    string(JSON file GET "${commands}" ${i} file)
    string(JSON item GET "${commands}" ${i})
    # the object file of <target> lies in CMakeFiles/<target>.dir
    string(FIND "${item}" "/${target}.dir/" at)
    if(file STREQUAL "${PYSHARP_SOURCE}" AND NOT at EQUAL -1)
      set(entry "${item}")
    endif()
  endforeach()
  if(entry STREQUAL "")
    message(FATAL_ERROR "pysharp: no compile command for ${PYSHARP_SOURCE} (${target}) in compile_commands.json")
  endif()
  if(core STREQUAL "")
    set(core "${entry}")
  endif()
  if(NOT name STREQUAL "core")
    if(NOT targets STREQUAL "")
      string(APPEND targets ", ")
    endif()
    string(APPEND targets "\"${name}\": ${entry}")
  endif()
endforeach()
set(out "$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}/pysharp/_build_flags.json")
if(targets STREQUAL "")
  file(WRITE "${out}" "{\"core\": ${core}}\n")
else()
  file(WRITE "${out}" "{\"core\": ${core}, \"targets\": {${targets}}}\n")
endif()
message(STATUS "pysharp: recorded the core's compile command in ${out}")
