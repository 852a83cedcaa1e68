# README command 1 builds lean (scripts/setup.sh without --tests: -DTRIAX_BUILD_TESTS=OFF
# -DTRIAX_BUILD_BENCHMARKS=OFF). install.lean_build configures that tree beside this one with
# Catch2 made unfindable, checks that it holds only the library and the example programs, builds it
# within a bound and trains two iterations with its train_gpt (lean_build_test.sh).
# The bound, 20 min: a cold lean build is 7.7 min of CPU, about 4 on 2 idle cores (README); ccache
# serves most of it where present, and the rest is room for a loaded machine.
if(TRIAX_BUILD_EXAMPLES)
  file(GLOB _lean_examples CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/examples/*/CMakeLists.txt)
  list(LENGTH _lean_examples _lean_num_examples)
  # The same configuration as this tree, so that a compiler cache serves its compiles.
  set(_lean_args -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE} -DTRIAX_WITH_MPI=${TRIAX_WITH_MPI}
    -DTRIAX_WITH_CUDA=${TRIAX_WITH_CUDA} -DTRIAX_WITH_HTTP=${TRIAX_WITH_HTTP}
    "-DTRIAX_CUDA_ARCHITECTURES=${TRIAX_CUDA_ARCHITECTURES}")
  foreach(_lang C CXX CUDA)
    if(CMAKE_${_lang}_COMPILER_LAUNCHER)
      list(APPEND _lean_args "-DCMAKE_${_lang}_COMPILER_LAUNCHER=${CMAKE_${_lang}_COMPILER_LAUNCHER}")
    endif()
  endforeach()
  add_test(NAME install.lean_build
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/lean_build_test.sh ${PROJECT_SOURCE_DIR} ${CMAKE_BINARY_DIR}
      1200 ${_lean_num_examples} ${_lean_args})
  set_tests_properties(install.lean_build PROPERTIES TIMEOUT 1320 LABELS install RUN_SERIAL TRUE
    ENVIRONMENT "${TRIAX_MPIRUN_ENV}")
endif()
