# train_gpt end to end (tests/train/train_cli_test.sh): the README's main job, a TOML config,
# and the clear errors for bad flags, layouts and data files.
if(TRIAX_WITH_MPI AND TRIAX_BUILD_EXAMPLES)
  foreach(case main_job config errors moe config_file roundtrip ranges one_message writes inputs)
    add_test(NAME train.cli.${case}
      COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/train/train_cli_test.sh $<TARGET_FILE:train_gpt> ${MPIEXEC_EXECUTABLE} ${case})
    set(_sess ${CMAKE_BINARY_DIR}/ompi-sessions/train.${case})
    file(MAKE_DIRECTORY ${_sess})
    set_tests_properties(train.cli.${case} PROPERTIES TIMEOUT 600 LABELS train SKIP_RETURN_CODE 77
      ENVIRONMENT "${TRIAX_MPIRUN_ENV};OMPI_MCA_orte_tmpdir_base=${_sess}" PROCESSORS 2)
  endforeach()
endif()

# Checkpoints (tests/train/checkpoint_test.sh, docs/CHECKPOINTS.md).
if(TRIAX_WITH_MPI AND TRIAX_BUILD_EXAMPLES)
  foreach(case exact reshard kill9 sigterm sigusr1 bad init export_hf)
    add_test(NAME train.checkpoint.${case}
      COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/train/checkpoint_test.sh $<TARGET_FILE:train_gpt> ${MPIEXEC_EXECUTABLE}
              ${case} $<TARGET_FILE:gpt_eval> ${TRIAX_HF_PYTHON})
    set(_sess ${CMAKE_BINARY_DIR}/ompi-sessions/checkpoint.${case})
    file(MAKE_DIRECTORY ${_sess})
    set_tests_properties(train.checkpoint.${case} PROPERTIES TIMEOUT 600 LABELS train SKIP_RETURN_CODE 77
      ENVIRONMENT "${TRIAX_MPIRUN_ENV};OMPI_MCA_orte_tmpdir_base=${_sess}" PROCESSORS 2)
  endforeach()
endif()
