# Multi-rank tests of the communicators: under mpirun at np 1, 2, 4, 8 (MPI backend), and once
# more without a launcher (".self": the Self backend runs the same checks). A hung collective
# fails its wait after TRIAX_COMM_TIMEOUT_S instead of running into the ctest timeout.
set(_triax_comm_tests comm_collectives comm_random comm_async comm_grid comm_errors comm_timeout)
foreach(_t ${_triax_comm_tests})
  triax_add_dist_test(${_t} SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/dist/test_${_t}.cpp NP 1 2 4 8 TIMEOUT 120)
  foreach(_np 1 2 4 8)
    if(TEST dist.${_t}.np${_np})
      set_property(TEST dist.${_t}.np${_np} APPEND PROPERTY ENVIRONMENT TRIAX_COMM_TIMEOUT_S=60)
    endif()
  endforeach()
  if(TRIAX_WITH_MPI)
    add_test(NAME dist.${_t}.self COMMAND ${_t})
    set_tests_properties(dist.${_t}.self PROPERTIES TIMEOUT 120 LABELS "dist" ENVIRONMENT "TRIAX_COMM_TIMEOUT_S=60")
  endif()
endforeach()

# The MPI backend's ring all-reduce / reduce-scatter normally starts at 64 KiB; these runs force
# it on every size (TRIAX_MPI_RING_MIN_BYTES=0), at an odd group size (uneven chunks) and at 8.
if(TRIAX_WITH_MPI)
  foreach(_t comm_collectives comm_random comm_async)
    foreach(_np 3 8)
      add_test(NAME dist.${_t}.ring.np${_np}
        COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${_np} --oversubscribe $<TARGET_FILE:${_t}>)
      set_tests_properties(dist.${_t}.ring.np${_np} PROPERTIES TIMEOUT 120 LABELS "dist" PROCESSORS ${_np}
        ENVIRONMENT "${TRIAX_MPIRUN_ENV};TRIAX_COMM_TIMEOUT_S=60;TRIAX_MPI_RING_MIN_BYTES=0")
    endforeach()
  endforeach()
endif()
