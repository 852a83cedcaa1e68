# The cluster around the runtime (docs/CLUSTER.md), tested against real components that the
# tests start themselves on loopback: Prometheus scraping train_gpt, promtool on the rules.

# triax_add_cluster_test(NAME TIMEOUT COMMAND cmd... [PROPERTIES prop value...]): cluster.NAME,
# both cores, its own Open MPI session directory, label cluster.
function(triax_add_cluster_test name timeout)
  cmake_parse_arguments(A "" "" "COMMAND;PROPERTIES" ${ARGN})
  add_test(NAME cluster.${name} COMMAND ${A_COMMAND})
  set(_sess ${CMAKE_BINARY_DIR}/ompi-sessions/cluster.${name})
  file(MAKE_DIRECTORY ${_sess})
  set_tests_properties(cluster.${name} PROPERTIES TIMEOUT ${timeout} LABELS cluster PROCESSORS 2
    ENVIRONMENT "${TRIAX_MPIRUN_ENV};OMPI_MCA_orte_tmpdir_base=${_sess}" ${A_PROPERTIES})
endfunction()

set(_src ${CMAKE_CURRENT_SOURCE_DIR}/cluster)
if(TRIAX_WITH_MPI AND TRIAX_BUILD_EXAMPLES)
  triax_add_cluster_test(prometheus_scrape 300
    COMMAND bash ${_src}/prometheus_scrape_test.sh $<TARGET_FILE:train_gpt> ${MPIEXEC_EXECUTABLE}
    PROPERTIES SKIP_RETURN_CODE 77)
  triax_add_cluster_test(json_log 300
    COMMAND bash ${_src}/json_log_test.sh $<TARGET_FILE:train_gpt> ${MPIEXEC_EXECUTABLE})
  # triax-probe: three ranks posing as three hosts, scores against the recording rules.
  triax_add_cluster_test(probe 300
    COMMAND bash ${_src}/probe_test.sh $<TARGET_FILE:triax-probe> ${MPIEXEC_EXECUTABLE} ${PROJECT_SOURCE_DIR})
  # The checkpoint-age metrics (TrainingCheckpointTooOld) of a real run with --save and a resume.
  triax_add_cluster_test(checkpoint_metrics 300
    COMMAND bash ${_src}/checkpoint_metrics_test.sh $<TARGET_FILE:train_gpt> ${MPIEXEC_EXECUTABLE})
endif()

# triax-probe --forecast on the fixtures: placement order and refused forecasts (no MPI).
if(TRIAX_BUILD_EXAMPLES)
  add_test(NAME cluster.probe_forecast
    COMMAND bash ${_src}/probe_forecast_test.sh $<TARGET_FILE:triax-probe> ${PROJECT_SOURCE_DIR})
  set_tests_properties(cluster.probe_forecast PROPERTIES TIMEOUT 60 LABELS cluster)
endif()

add_test(NAME cluster.promtool_alerts
  COMMAND bash ${_src}/promtool_test.sh ${_src}/triax_alerts_test.yml
    ${PROJECT_SOURCE_DIR}/clusters/prometheus/triax_alerts.yml ${PROJECT_SOURCE_DIR}/clusters/prometheus/triax_probe_rules.yml)
set_tests_properties(cluster.promtool_alerts PROPERTIES TIMEOUT 120 LABELS cluster SKIP_RETURN_CODE 77)
add_test(NAME cluster.promtool_forecast
  COMMAND bash ${_src}/promtool_test.sh ${_src}/triax_forecast_rules_test.yml
    ${PROJECT_SOURCE_DIR}/clusters/prometheus/triax_forecast_rules.yml)
set_tests_properties(cluster.promtool_forecast PROPERTIES TIMEOUT 120 LABELS cluster SKIP_RETURN_CODE 77)

add_executable(bootstrap_check cluster/bootstrap_check.cpp)
target_link_libraries(bootstrap_check PRIVATE triax::triax)

# A real one-node Slurm started by the test (slurm-wlm + munge).
if(TRIAX_WITH_MPI AND TRIAX_BUILD_EXAMPLES)
  triax_add_cluster_test(slurm 600
    COMMAND bash ${_src}/slurm_test.sh $<TARGET_FILE:train_gpt> $<TARGET_FILE:bootstrap_check> ${MPIEXEC_EXECUTABLE}
      ${PROJECT_SOURCE_DIR}
    PROPERTIES SKIP_RETURN_CODE 77 RUN_SERIAL TRUE)
endif()

# Kubernetes/Volcano manifests: fields, and the pods simulated as local processes with the
# environment Volcano's plugins give them (own UTS and mount namespaces for host name and DNS).
# With Gloo and train_gpt, the pods of the Volcano job also train (losses == mpirun's), and the
# elastic job's pods run torchrun and lose one pod mid-training (skipped without torchrun).
set(_k8s_train)
if(TRIAX_HAVE_GLOO AND TRIAX_WITH_MPI AND TRIAX_BUILD_EXAMPLES)
  set(_k8s_train $<TARGET_FILE:train_gpt> ${MPIEXEC_EXECUTABLE})
endif()
triax_add_cluster_test(k8s_volcano 480
  COMMAND python3 ${_src}/k8s_test.py $<TARGET_FILE:bootstrap_check> ${PROJECT_SOURCE_DIR} ${_k8s_train}
  PROPERTIES SKIP_RETURN_CODE 77)
