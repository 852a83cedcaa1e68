# Injected faults end to end (tests/faults/faults_test.sh, docs/FAULTS.md): kill / exit / throw /
# hang on rank 2 (with --stall-timeout, and at the collective timeout without it) and a slow rank 3
# under mpirun np 4, each bounded in time, no process left behind.
if(TRIAX_WITH_MPI AND TRIAX_BUILD_EXAMPLES)
  foreach(case kill exit throw hang timeout-hang straggler sigusr2 nan)
    add_test(NAME faults.${case}
      COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/faults/faults_test.sh $<TARGET_FILE:train_gpt> $<TARGET_FILE:triax-fr>
              ${MPIEXEC_EXECUTABLE} ${case})
    set(_sess ${CMAKE_BINARY_DIR}/ompi-sessions/faults.${case})
    file(MAKE_DIRECTORY ${_sess})
    set_tests_properties(faults.${case} PROPERTIES TIMEOUT 150 LABELS faults PROCESSORS 2
      ENVIRONMENT "${TRIAX_MPIRUN_ENV};OMPI_MCA_orte_tmpdir_base=${_sess}")
  endforeach()
  # The same rank deaths without mpirun: torchrun-style env, TCP rendezvous, Gloo.
  if(TRIAX_HAVE_GLOO)
    foreach(case gloo-kill gloo-exit gloo-throw gloo-hang gloo-timeout-hang)
      add_test(NAME faults.${case}
        COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/faults/faults_test.sh $<TARGET_FILE:train_gpt> $<TARGET_FILE:triax-fr>
                ${MPIEXEC_EXECUTABLE} ${case} ${CMAKE_CURRENT_SOURCE_DIR}/support/launch_local.py)
      set_tests_properties(faults.${case} PROPERTIES TIMEOUT 150 LABELS "faults;gloo" PROCESSORS 2
        ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE")
    endforeach()
  endif()
endif()
