# Multi-rank tests of the communicators: under mpirun at np 1, 2, 4, 8 (MPI backend), once more
# without a launcher (".self": the Self backend runs the same checks), and as N local processes
# with torchrun-style variables (".gloo.npN": the Gloo backend). A hung collective
# fails its wait after TRIAX_COMM_TIMEOUT_S instead of running into the ctest timeout.
set(_triax_comm_tests comm_collectives comm_random comm_async comm_grid comm_errors comm_timeout)
foreach(_t ${_triax_comm_tests})
  triax_add_multirank_test(${_t} SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/multirank/test_${_t}.cpp NP 1 2 4 8 TIMEOUT 120)
  foreach(_np 1 2 4 8)
    if(TEST multirank.${_t}.np${_np})
      set_property(TEST multirank.${_t}.np${_np} APPEND PROPERTY ENVIRONMENT TRIAX_COMM_TIMEOUT_S=60)
    endif()
  endforeach()
  # The Gloo backend, launched without mpirun (one rank, an even and an odd group size).
  triax_add_gloo_runs(${_t} NP 1 3 4 TIMEOUT 120)
  if(TRIAX_WITH_MPI)
    add_test(NAME multirank.${_t}.self COMMAND ${_t})
    set_tests_properties(multirank.${_t}.self PROPERTIES TIMEOUT 120 LABELS "multirank" ENVIRONMENT "TRIAX_COMM_TIMEOUT_S=60")
  endif()
endforeach()

# The MPI backend's ring all-reduce / reduce-scatter normally starts at 64 KiB; these runs force
# it on every size (TRIAX_MPI_RING_MIN_BYTES=0), at an odd group size (uneven chunks) and at 8;
# comm_timeout then times out inside a ring (its skipped all_reduce has 8 elements).
if(TRIAX_WITH_MPI)
  foreach(_t comm_collectives comm_random comm_async comm_timeout)
    foreach(_np 3 8)
      add_test(NAME multirank.${_t}.ring.np${_np}
        COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${_np} --oversubscribe $<TARGET_FILE:${_t}>)
      # Own Open MPI session directory, as triax_add_multirank_test gives its tests.
      set(_sess ${CMAKE_BINARY_DIR}/ompi-sessions/${_t}.ring.np${_np})
      file(MAKE_DIRECTORY ${_sess})
      set_tests_properties(multirank.${_t}.ring.np${_np} PROPERTIES TIMEOUT 120 LABELS "multirank" PROCESSORS ${_np}
        ENVIRONMENT "${TRIAX_MPIRUN_ENV};OMPI_MCA_orte_tmpdir_base=${_sess};TRIAX_COMM_TIMEOUT_S=60;TRIAX_MPI_RING_MIN_BYTES=0")
    endforeach()
  endforeach()
endif()

# comm_bench, quickly: small sizes (both the libnbc and the ring paths) at np 2 and, for uneven
# ring chunks, bf16 avg at np 3; its exit code says whether every result checked out. The
# --corrupt run proves the check catches a wrong element (it must exit 1 and say ERROR). The np 2
# run also writes the planner's calibration file, which the planner must fit (comm_bench reads it
# back with plan::load_calibration) and triax-plan must accept.
if(TRIAX_WITH_MPI AND TARGET comm_bench)
  set(_bench_quick -b 8 -e 512K -f 8 -n 3 -w 1 -r 3)
  set(_bench_cal ${CMAKE_CURRENT_BINARY_DIR}/comm_bench_np2_calibration.json)
  add_test(NAME multirank.comm_bench.np2
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe $<TARGET_FILE:comm_bench> -b 8 -e 512K -f 8 -n 3 -w 1 -r 5
            --json ${CMAKE_CURRENT_BINARY_DIR}/comm_bench_np2.json --calibration ${_bench_cal})
  add_test(NAME multirank.comm_bench.bf16_avg.np3
    COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 3 --oversubscribe $<TARGET_FILE:comm_bench> ${_bench_quick}
            --dtype bfloat16 --op avg)
  add_test(NAME multirank.comm_bench.detects_wrong.np2
    COMMAND sh -c "out=$(\"$0\" ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe \"$1\" -b 1K -e 256K -f 16 -n 1 -w 0 -r 1 --corrupt 2>&1); rc=$?; echo \"$out\"; test $rc -eq 1 && echo \"$out\" | grep -q 'out of bounds values: [1-9].*ERROR'"
            ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:comm_bench>)
  foreach(_b np2 bf16_avg.np3 detects_wrong.np2)
    set(_sess ${CMAKE_BINARY_DIR}/ompi-sessions/comm_bench.${_b})
    file(MAKE_DIRECTORY ${_sess})
    set_tests_properties(multirank.comm_bench.${_b} PROPERTIES TIMEOUT 120 LABELS "multirank;bench" PROCESSORS 2
      ENVIRONMENT "${TRIAX_MPIRUN_ENV};OMPI_MCA_orte_tmpdir_base=${_sess};TRIAX_COMM_TIMEOUT_S=60")
  endforeach()
  set_tests_properties(multirank.comm_bench.np2 PROPERTIES FAIL_REGULAR_EXPRESSION "planner cannot fit"
    FIXTURES_SETUP comm_bench_calibration)
  if(TARGET triax-plan)
    add_test(NAME multirank.comm_bench.calibration_in_planner
      COMMAND $<TARGET_FILE:triax-plan> --model gpt2-small --cluster cpu-local --tp 1 --pp 2 --dp 1 --mbs 4
              --precision fp32 --calibration ${_bench_cal})
    set_tests_properties(multirank.comm_bench.calibration_in_planner PROPERTIES TIMEOUT 60 LABELS "multirank;bench;plan"
      FIXTURES_REQUIRED comm_bench_calibration)
  endif()
endif()

# The CUDA layer's device communicator over MPI / Gloo, host spans only (no GPU needed).
if(TRIAX_HAVE_CUDA)
  triax_add_multirank_test(device_comm_host SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/multirank/test_device_comm_host.cpp
    NP 1 2 3 TIMEOUT 120)
  triax_add_gloo_runs(device_comm_host NP 3 TIMEOUT 120)
endif()
