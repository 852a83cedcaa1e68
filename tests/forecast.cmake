# triax-forecast (issue 31, docs/CLUSTER.md "Predictive scheduling") with real components:
#   cluster.forecast_prometheus  a real Prometheus on loopback, backfilled with promtool from generated
#                                history; train/evaluate/predict over HTTP, pure noise, bad input
#                                (skipped without prometheus/promtool)
#   cluster.forecast_torch       the model file loads into torch.nn.LSTM + nn.Linear with the same
#                                outputs (Debian's /usr/bin/python3 has torch; skipped where not)
if(TARGET triax-forecast)
  set(_fc ${CMAKE_CURRENT_SOURCE_DIR}/cluster/forecast)
  if(TRIAX_HAVE_HTTP)
    add_test(NAME cluster.forecast_prometheus
      COMMAND python3 ${_fc}/forecast_prometheus_test.py $<TARGET_FILE:triax-forecast>)
    set_tests_properties(cluster.forecast_prometheus PROPERTIES TIMEOUT 600 LABELS cluster PROCESSORS 2
      SKIP_RETURN_CODE 77 ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE")
  endif()
  # The Python with torch: TRIAX_HF_PYTHON (eval.cmake, default /usr/bin/python3); the script exits 77
  # where torch cannot be imported.
  set(_fc_python /usr/bin/python3)
  if(TRIAX_HF_PYTHON)
    set(_fc_python ${TRIAX_HF_PYTHON})
  endif()
  add_test(NAME cluster.forecast_torch
    COMMAND ${_fc_python} ${_fc}/torch_check.py $<TARGET_FILE:triax-forecast>)
  set_tests_properties(cluster.forecast_torch PROPERTIES TIMEOUT 300 LABELS cluster SKIP_RETURN_CODE 77
    ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=PASSIVE")
endif()
