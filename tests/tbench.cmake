# The trainer benchmarks (benchmarks/schedule_bench.cpp, train_bench.cpp) end to end at np 2, on a
# small model so they stay quick: exit code 0 (the events match the schedule, losses agree across
# overlap modes), the bubble / hidden / planner lines, the Chrome trace, and a refused layout.
# Timings are not asserted (DESIGN.md rule 7) except the planner's prediction on a clean run (below):
# the committed tables are in benchmarks/results/.
if(TRIAX_WITH_MPI AND TARGET schedule_bench AND TARGET train_bench)
  set(_check ${CMAKE_CURRENT_SOURCE_DIR}/tbench/check_run.cmake)
  set(_mpi "${MPIEXEC_EXECUTABLE}|${MPIEXEC_NUMPROC_FLAG}|2|--oversubscribe")
  set(_small "--layers|4|--hidden|64|--seq|32|--micro-batch-size|2")
  set(_trace ${CMAKE_CURRENT_BINARY_DIR}/tbench_trace.1f1b.json)
  add_test(NAME bench.schedule_bench.np2
    COMMAND ${CMAKE_COMMAND} "-DCMD=${_mpi}|$<TARGET_FILE:schedule_bench>|--pp|2|--schedule|gpipe,1f1b,zb-h1,interleaved|--micro-batches|4|--iters|2|--warmup|1|${_small}|--trace|${CMAKE_CURRENT_BINARY_DIR}/tbench_trace.json"
            "-DOUT1=bubble 1f1b \\(idle/compute\\): measured [0-9]\\.[0-9]+ \\[stages [0-9. ]+\\] \\| theory 0\\.2500 \\| simulated with measured costs [0-9]\\.[0-9]+"
            "-DOUT2=bubble interleaved \\(idle/compute\\): measured [0-9.]+ .*theory 0\\.1250"
            "-DOUT3=stage  0 \\|[FB.]+\\|.*stage  1 \\|[FB.]+\\|"
            "-DOUT4=schedule +p +v +m +measured +theory +simulated.*gpipe +2 +1 +4 .*zb-h1 +2 +1 +4 "
            "-DFILE=${_trace}" "-DFILE_RE=traceEvents.*rank 1 \\(pp 1, tp 0, dp 0\\)"
            -P ${_check})
  add_test(NAME bench.schedule_bench.bad_layout
    COMMAND ${CMAKE_COMMAND} "-DCMD=${_mpi}|$<TARGET_FILE:schedule_bench>|--pp|2|--schedule|interleaved|--micro-batches|3|${_small}"
            -DRC=2 "-DERR=configuration error: .*multiple of pp" -P ${_check})
  add_test(NAME bench.train_bench.np2
    COMMAND ${CMAKE_COMMAND} "-DCMD=${_mpi}|$<TARGET_FILE:train_bench>|--dp|2|--iters|2|--warmup|1|--global-batch-size|8|--bucket-mb|0.05|--predict|--calibration-seconds|0.1|${_small}"
            "-DOUT1=overlap +[0-9.]+ +[0-9]+ .*no-overlap +[0-9.]+"
            "-DOUT2=hidden: -?[0-9.]+% of the no-overlap DP communication.*losses of both modes agree"
            "-DOUT3=planner +overlap: predicted [0-9.]+ ms .*measured/predicted [0-9.]+"
            "-DOUT4=fitted: all-reduce alpha" -P ${_check})
  # The planner's prediction of the default train_bench model at dp 2 (dp from the world size), calibrated
  # in the same run: within 25% when the run is clean (both ranks had their cores: CPU share >= 0.97);
  # on a loaded machine the check says "not checked" and the test passes on the other lines. 25%, not
  # 10%: on 2026-12-02 this machine ran sgemm at 80-96 GFLOP/s per CPU second (125 when quiet) and
  # the same binary measured 1.10-1.23 of its prediction for hours, before and after that day's
  # changes alike (A/B of both builds, alternating); the tighter number is for benchmarks/results/.
  add_test(NAME bench.train_bench.predict_np2
    COMMAND ${CMAKE_COMMAND} "-DCMD=${_mpi}|$<TARGET_FILE:train_bench>|--iters|3|--warmup|1|--overlap|on|--predict|--max-error|0.25"
            "-DOUT1=planner +overlap: predicted [0-9.]+ ms .*measured/predicted [0-9.]+"
            "-DOUT2=prediction check +overlap: (ok|not checked) "
            "-DOUT3=attention [0-9.]+ GFLOP/s per CPU second" -DTRIES=3 -P ${_check})
  foreach(_t bench.schedule_bench.np2 bench.schedule_bench.bad_layout bench.train_bench.np2 bench.train_bench.predict_np2)
    set(_sess ${CMAKE_BINARY_DIR}/ompi-sessions/${_t})
    file(MAKE_DIRECTORY ${_sess})
    set_tests_properties(${_t} PROPERTIES TIMEOUT 180 LABELS "bench;dist" PROCESSORS 2
      ENVIRONMENT "${TRIAX_MPIRUN_ENV};OMPI_MCA_orte_tmpdir_base=${_sess}")
  endforeach()
endif()
