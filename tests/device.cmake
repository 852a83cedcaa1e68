# device.rehearse_lib: the device run's configure, rehearsed on this machine without a GPU
# (benchmarks/device/run_h200.sh --rehearse=lib): bundle.sh packs what the GPU image lacks from
# the Debian packages, then triax is configured the way the device run configures it (MPI, Gloo
# and cpp-httplib off, every dependency pinned to the unpacked bundle, /usr and / ignored as
# search prefixes) and the library is built; every header of the bundled packages must have come
# from the bundle, not /usr/include. A dependency added to the build but not to the bundle fails
# here, not on the GPU machine. Cost: the bundle (~20 s) and one library build in its own
# directory under this build tree (stable paths: ccache hits from the second run on). The full
# rehearsal (all device targets, step 3's inputs and CPU comparison) is run_h200.sh --rehearse.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64" AND EXISTS /usr/bin/dpkg-query)
  set(_dev ${CMAKE_BINARY_DIR}/device-rehearsal)
  if(TRIAX_HAVE_CUDA)
    set(_cuda ON)
  else()
    set(_cuda OFF)
  endif()
  set(_env WORK=${_dev} OUT=${_dev}/out TRIAX_DEPS_DIR=${_dev}/bundle JOBS=2 REHEARSE_CUDA=${_cuda})
  # The outer build's compiler launcher (ccache), when given as a CMake variable.
  foreach(_v CMAKE_CXX_COMPILER_LAUNCHER CMAKE_C_COMPILER_LAUNCHER CMAKE_CUDA_COMPILER_LAUNCHER)
    if(${_v} AND NOT DEFINED ENV{${_v}})
      list(APPEND _env "${_v}=${${_v}}")
    endif()
  endforeach()
  add_test(NAME device.rehearse_lib COMMAND bash ${PROJECT_SOURCE_DIR}/benchmarks/device/run_h200.sh --rehearse=lib)
  set_tests_properties(device.rehearse_lib PROPERTIES TIMEOUT 2400 LABELS device PROCESSORS 2
    ENVIRONMENT "${_env}")
endif()
