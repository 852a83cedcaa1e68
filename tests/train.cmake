# train_gpt end to end under mpirun, one ctest entry per case of a script:
#   train.cli.*        tests/train/train_cli_test.sh: the README's main job, a TOML config, and the
#                      clear errors for bad flags, layouts and data files; hostile sizes, huge shapes,
#                      memory refusal, the metrics textfile and late errors (issue 24).
#   train.checkpoint.* tests/train/checkpoint_test.sh: checkpoints (docs/CHECKPOINTS.md), GPT-2 and Llama,
#                      across ZeRO levels and layouts (zero, zero_layouts) and the HF export under ZeRO-2/3.
#   train.memory.*     tests/train/zero_memory_test.sh: measured peak memory per rank against the memory
#                      model under ZeRO 0-3 (np 4) and ZeRO-3 at dp 8 (issue 27).
# triax_add_train_script_tests(GROUP SCRIPT SESSION_PREFIX CASES case... [ARGS extra...]): runs
# `bash SCRIPT train_gpt mpiexec CASE extra...`.
function(triax_add_train_script_tests group script session_prefix)
  cmake_parse_arguments(A "" "" "CASES;ARGS" ${ARGN})
  foreach(case ${A_CASES})
    add_test(NAME train.${group}.${case}
      COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/train/${script} $<TARGET_FILE:train_gpt> ${MPIEXEC_EXECUTABLE} ${case} ${A_ARGS})
    set(_sess ${CMAKE_BINARY_DIR}/ompi-sessions/${session_prefix}.${case})
    file(MAKE_DIRECTORY ${_sess})
    set_tests_properties(train.${group}.${case} PROPERTIES TIMEOUT 600 LABELS train SKIP_RETURN_CODE 77
      ENVIRONMENT "${TRIAX_MPIRUN_ENV};OMPI_MCA_orte_tmpdir_base=${_sess}" PROCESSORS 2)
  endforeach()
endfunction()

if(TRIAX_WITH_MPI AND TRIAX_BUILD_EXAMPLES)
  triax_add_train_script_tests(cli train_cli_test.sh train
    CASES main_job config errors moe config_file roundtrip ranges one_message writes inputs hostile huge_shapes memory
          textfile late precision summary)
  # train.timeline.*: --profile-steps (docs/OBSERVE.md, Timeline): the merged trace of a pp 4 1F1B
  # run and its bubble against the schedule simulator; malformed windows refused.
  triax_add_train_script_tests(timeline timeline_test.sh timeline CASES pp4_1f1b errors)
  triax_add_train_script_tests(memory zero_memory_test.sh zero_memory CASES dp4 dp8)
  triax_add_train_script_tests(checkpoint checkpoint_test.sh checkpoint
    CASES exact reshard moe llama moe_llama kill9 sigterm sigusr1 bad prune wide batch startup init init_checked export_hf
          zero zero_layouts export_zero minutes ARGS $<TARGET_FILE:gpt_eval> ${TRIAX_HF_PYTHON})
endif()

# train.cuda.no_gpu: `train_gpt --backend cuda` where CUDA sees no device exits 2 within seconds,
# naming CUDA and the device count (skipped, 77, where a GPU is visible and the run trains).
if(TRIAX_BUILD_EXAMPLES)
  add_test(NAME train.cuda.no_gpu COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/train/cuda_refusal_test.sh $<TARGET_FILE:train_gpt>)
  set_tests_properties(train.cuda.no_gpu PROPERTIES TIMEOUT 120 LABELS train SKIP_RETURN_CODE 77)
endif()
