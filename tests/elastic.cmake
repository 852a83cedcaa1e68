# train_gpt as an elastic worker under the real torchrun (issue 30, docs/FAULTS.md), loopback only:
# tests/elastic/elastic_test.py SCENARIO (its docstring says what each checks). Each scenario uses
# both cores (up to 4 workers plus their agents), so they run one at a time; a machine without
# torchrun (Debian: python3-torch) skips them (exit 77).
if(TRIAX_HAVE_GLOO AND TRIAX_BUILD_EXAMPLES)
  # torchrun is Debian's /usr/bin/torchrun; the driver needs only the standard library.
  set(TRIAX_ELASTIC_PYTHON "/usr/bin/python3" CACHE FILEPATH "Python for tests/elastic/elastic_test.py")
  if(NOT EXISTS ${TRIAX_ELASTIC_PYTHON})
    find_program(TRIAX_ELASTIC_PYTHON_FOUND NAMES python3)
    set(_el_python ${TRIAX_ELASTIC_PYTHON_FOUND})
  else()
    set(_el_python ${TRIAX_ELASTIC_PYTHON})
  endif()
  if(_el_python)
    # scenario:timeout (s); measured on 2 shared cores: node_loss 30-35 s, faults 45-60 s, join 25-30 s, errors 5 s
    foreach(entry node_loss:300 faults:300 join:300 errors:120)
      string(REPLACE ":" ";" pair ${entry})
      list(GET pair 0 scenario)
      list(GET pair 1 timeout)
      add_test(NAME elastic.torchrun.${scenario}
        COMMAND ${_el_python} ${CMAKE_CURRENT_SOURCE_DIR}/elastic/elastic_test.py ${scenario}
                $<TARGET_FILE:train_gpt> ${CMAKE_CURRENT_SOURCE_DIR}/support/launch_local.py)
      set_tests_properties(elastic.torchrun.${scenario} PROPERTIES TIMEOUT ${timeout} LABELS "elastic;gloo"
        PROCESSORS 2 RUN_SERIAL TRUE SKIP_RETURN_CODE 77
        ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE")
    endforeach()
  else()
    message(STATUS "triax: no python3: the elastic.torchrun.* tests are not added")
  endif()
endif()
