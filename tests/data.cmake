# scripts/prepare_data.py (byte-level fallback) -> train_gpt with validation (tests/data/).
if(TRIAX_WITH_MPI AND TRIAX_BUILD_EXAMPLES)
  add_test(NAME data.prepare_and_train
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/data/prepare_data_test.sh ${PROJECT_SOURCE_DIR}/scripts/prepare_data.py
            $<TARGET_FILE:train_gpt> ${MPIEXEC_EXECUTABLE})
  set(_sess ${CMAKE_BINARY_DIR}/ompi-sessions/data.prepare)
  file(MAKE_DIRECTORY ${_sess})
  set_tests_properties(data.prepare_and_train PROPERTIES TIMEOUT 600 LABELS "train;data"
    ENVIRONMENT "${TRIAX_MPIRUN_ENV};OMPI_MCA_orte_tmpdir_base=${_sess}" PROCESSORS 2)
endif()
