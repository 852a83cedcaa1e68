# unit.test_forecast_history talks to an in-process cpp-httplib server standing in for Prometheus
# (without cpp-httplib it checks query_prometheus' refusal instead).
if(TRIAX_HAVE_HTTP)
  target_link_libraries(test_forecast_history PRIVATE PkgConfig::TRIAX_HTTPLIB)
  target_compile_definitions(test_forecast_history PRIVATE TRIAX_HAVE_HTTP=1)
endif()
