# The cluster around the runtime (docs/CLUSTER.md), tested against real components that the
# tests start themselves on loopback: Prometheus scraping train_gpt, promtool on the rules.
if(TRIAX_WITH_MPI AND TRIAX_BUILD_EXAMPLES)
  add_test(NAME cluster.prometheus_scrape
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cluster/prometheus_scrape_test.sh $<TARGET_FILE:train_gpt> ${MPIEXEC_EXECUTABLE})
  set(_sess ${CMAKE_BINARY_DIR}/ompi-sessions/cluster.prometheus)
  file(MAKE_DIRECTORY ${_sess})
  set_tests_properties(cluster.prometheus_scrape PROPERTIES TIMEOUT 300 LABELS cluster SKIP_RETURN_CODE 77
    ENVIRONMENT "${TRIAX_MPIRUN_ENV};OMPI_MCA_orte_tmpdir_base=${_sess}" PROCESSORS 2)
endif()

add_test(NAME cluster.promtool_alerts
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cluster/promtool_test.sh ${CMAKE_CURRENT_SOURCE_DIR}/cluster/triax_alerts_test.yml
    ${PROJECT_SOURCE_DIR}/clusters/prometheus/triax_alerts.yml ${PROJECT_SOURCE_DIR}/clusters/prometheus/triax_probe_rules.yml)
set_tests_properties(cluster.promtool_alerts PROPERTIES TIMEOUT 120 LABELS cluster SKIP_RETURN_CODE 77)

if(TRIAX_WITH_MPI AND TRIAX_BUILD_EXAMPLES)
  add_test(NAME cluster.json_log
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cluster/json_log_test.sh $<TARGET_FILE:train_gpt> ${MPIEXEC_EXECUTABLE})
  set(_sess ${CMAKE_BINARY_DIR}/ompi-sessions/cluster.json_log)
  file(MAKE_DIRECTORY ${_sess})
  set_tests_properties(cluster.json_log PROPERTIES TIMEOUT 300 LABELS cluster
    ENVIRONMENT "${TRIAX_MPIRUN_ENV};OMPI_MCA_orte_tmpdir_base=${_sess}" PROCESSORS 2)
endif()

# triax-probe: three ranks posing as three hosts, scores against the recording rules.
if(TRIAX_WITH_MPI AND TRIAX_BUILD_EXAMPLES)
  add_test(NAME cluster.probe
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cluster/probe_test.sh $<TARGET_FILE:triax-probe> ${MPIEXEC_EXECUTABLE} ${PROJECT_SOURCE_DIR})
  set(_sess ${CMAKE_BINARY_DIR}/ompi-sessions/cluster.probe)
  file(MAKE_DIRECTORY ${_sess})
  set_tests_properties(cluster.probe PROPERTIES TIMEOUT 300 LABELS cluster
    ENVIRONMENT "${TRIAX_MPIRUN_ENV};OMPI_MCA_orte_tmpdir_base=${_sess}" PROCESSORS 2)
endif()

add_executable(bootstrap_check cluster/bootstrap_check.cpp)
target_link_libraries(bootstrap_check PRIVATE triax::triax)

# A real one-node Slurm started by the test (slurm-wlm + munge).
if(TRIAX_WITH_MPI AND TRIAX_BUILD_EXAMPLES)
  add_test(NAME cluster.slurm
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cluster/slurm_test.sh $<TARGET_FILE:train_gpt> $<TARGET_FILE:bootstrap_check>
      ${MPIEXEC_EXECUTABLE} ${PROJECT_SOURCE_DIR})
  set(_sess ${CMAKE_BINARY_DIR}/ompi-sessions/cluster.slurm)
  file(MAKE_DIRECTORY ${_sess})
  set_tests_properties(cluster.slurm PROPERTIES TIMEOUT 600 LABELS cluster SKIP_RETURN_CODE 77 RUN_SERIAL TRUE
    ENVIRONMENT "${TRIAX_MPIRUN_ENV};OMPI_MCA_orte_tmpdir_base=${_sess}" PROCESSORS 2)
endif()

# Kubernetes/Volcano manifests: fields, and the pods simulated as local processes with the
# environment Volcano's plugins give them (own UTS and mount namespaces for host name and DNS).
# With Gloo and train_gpt, the pods of the Volcano job also train (losses == mpirun's).
set(_k8s_train)
if(TRIAX_HAVE_GLOO AND TRIAX_WITH_MPI AND TRIAX_BUILD_EXAMPLES)
  set(_k8s_train $<TARGET_FILE:train_gpt> ${MPIEXEC_EXECUTABLE})
endif()
add_test(NAME cluster.k8s_volcano
  COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/cluster/k8s_test.py $<TARGET_FILE:bootstrap_check> ${PROJECT_SOURCE_DIR}
    ${_k8s_train})
set(_sess ${CMAKE_BINARY_DIR}/ompi-sessions/cluster.k8s)
file(MAKE_DIRECTORY ${_sess})
set_tests_properties(cluster.k8s_volcano PROPERTIES TIMEOUT 300 LABELS cluster SKIP_RETURN_CODE 77 PROCESSORS 2
  ENVIRONMENT "${TRIAX_MPIRUN_ENV};OMPI_MCA_orte_tmpdir_base=${_sess}")

# The checkpoint-age metrics (TrainingCheckpointTooOld) of a real run with --save and a resume.
if(TRIAX_WITH_MPI AND TRIAX_BUILD_EXAMPLES)
  add_test(NAME cluster.checkpoint_metrics
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cluster/checkpoint_metrics_test.sh $<TARGET_FILE:train_gpt> ${MPIEXEC_EXECUTABLE})
  set(_sess ${CMAKE_BINARY_DIR}/ompi-sessions/cluster.checkpoint_metrics)
  file(MAKE_DIRECTORY ${_sess})
  set_tests_properties(cluster.checkpoint_metrics PROPERTIES TIMEOUT 300 LABELS cluster
    ENVIRONMENT "${TRIAX_MPIRUN_ENV};OMPI_MCA_orte_tmpdir_base=${_sess}" PROCESSORS 2)
endif()
