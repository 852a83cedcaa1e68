# Plots (issue 32): scripts/plot_run.py on a real train_gpt run's --metrics-jsonl (a valid PNG of
# non-trivial content, an SVG with --compare, clear errors for bad files; skipped, 77, where the
# Python has no matplotlib), and triax-plan --plot's SVG parsed as XML with one bar group per layout.
# TRIAX_PLOT_PYTHON picks the interpreter with matplotlib (Debian: python3-matplotlib in /usr/bin/python3).
if(DEFINED ENV{TRIAX_PLOT_PYTHON})
  set(_plot_python_default "$ENV{TRIAX_PLOT_PYTHON}")
else()
  set(_plot_python_default "/usr/bin/python3")
endif()
set(TRIAX_PLOT_PYTHON "${_plot_python_default}" CACHE FILEPATH "Python with matplotlib for scripts/plot_run.py's test")
if(TRIAX_WITH_MPI AND TRIAX_BUILD_EXAMPLES AND TARGET train_gpt)
  add_test(NAME plot.run
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/plot/plot_run_test.sh ${PROJECT_SOURCE_DIR}/scripts/plot_run.py
            $<TARGET_FILE:train_gpt> ${MPIEXEC_EXECUTABLE} ${TRIAX_PLOT_PYTHON})
  set(_sess ${CMAKE_BINARY_DIR}/ompi-sessions/plot.run)
  file(MAKE_DIRECTORY ${_sess})
  set_tests_properties(plot.run PROPERTIES TIMEOUT 300 LABELS "plot;train" SKIP_RETURN_CODE 77
    ENVIRONMENT "${TRIAX_MPIRUN_ENV};OMPI_MCA_orte_tmpdir_base=${_sess}" PROCESSORS 2)
endif()
if(TARGET triax-plan)
  add_test(NAME plot.plan
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/plot/plot_plan_test.sh $<TARGET_FILE:triax-plan>)
  set_tests_properties(plot.plan PROPERTIES TIMEOUT 120 LABELS "plot;plan")
endif()
