# gpt_eval end to end: a random GPT-2 (HF safetensors + the same model as llm.c .bin) and a random
# token shard from eval_fixture, whose plain double-precision forward gives the reference loss;
# gpt_eval must match it to 1e-5 relative at np 1, 2, 4 and over tp / pp / dp layouts, and fail
# with a clear message and a non-zero exit on bad files and flags.
if(TARGET gpt_eval)
  add_executable(eval_fixture ${CMAKE_CURRENT_LIST_DIR}/eval_fixture.cpp)
  target_link_libraries(eval_fixture PRIVATE triax::triax)
  target_include_directories(eval_fixture PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  set(_dir ${CMAKE_CURRENT_BINARY_DIR}/eval_data)
  add_test(NAME eval.fixture_write COMMAND eval_fixture write ${_dir} 2 16 3)
  set_tests_properties(eval.fixture_write PROPERTIES FIXTURES_SETUP eval_data LABELS "eval")

  set(_common "--data|@DIR@/tokens.bin|--batch|2|--seq|16|--batches|3")
  # triax_eval_test(NAME NP n ARGS "a|b" [RC 1 STDERR regex])
  function(triax_eval_test name)
    cmake_parse_arguments(A "" "NP;ARGS;RC;STDERR" "" ${ARGN})
    set(_mpi "")
    if(TRIAX_WITH_MPI)
      set(_mpi ${MPIEXEC_EXECUTABLE})
    elseif(NOT A_NP EQUAL 1)
      return()
    endif()
    add_test(NAME eval.${name}
      COMMAND ${CMAKE_COMMAND} -DEVAL=$<TARGET_FILE:gpt_eval> -DFIXTURE=$<TARGET_FILE:eval_fixture> -DDIR=${_dir}
              -DNP=${A_NP} "-DMPIEXEC=${_mpi}" "-DARGS=${A_ARGS}" "-DRC=${A_RC}" "-DSTDERR=${A_STDERR}"
              -P ${CMAKE_CURRENT_SOURCE_DIR}/eval/eval_run.cmake)
    set_tests_properties(eval.${name} PROPERTIES FIXTURES_REQUIRED eval_data LABELS "eval;dist" TIMEOUT 120
      PROCESSORS ${A_NP} ENVIRONMENT "${TRIAX_MPIRUN_ENV}")
  endfunction()

  foreach(np 1 2 4)
    triax_eval_test(np${np} NP ${np} ARGS "--tp|${np}|--weights|@DIR@/model.safetensors|${_common}|--json")
  endforeach()
  triax_eval_test(llmc_np2 NP 2 ARGS "--tp|2|--weights|@DIR@/model.bin|${_common}")
  triax_eval_test(np4_tp2_pp2 NP 4 ARGS "--tp|2|--pp|2|--weights|@DIR@/model.safetensors|${_common}")
  triax_eval_test(np2_pp2 NP 2 ARGS "--pp|2|--weights|@DIR@/model.bin|${_common}")
  triax_eval_test(np2_dp2 NP 2 ARGS "--weights|@DIR@/model.safetensors|${_common}|--json")
  # The same tokens as a Megatron indexed dataset give the same loss; a token past the vocabulary
  # is named with its file and byte offset (1024 + 2 * 40).
  triax_eval_test(megatron_np2 NP 2 ARGS "--tp|2|--weights|@DIR@/model.safetensors|--data|@DIR@/tokens_text_document|--batch|2|--seq|16|--batches|3")
  triax_eval_test(bad_token NP 2 ARGS "--weights|@DIR@/model.bin|--data|@DIR@/bad_tokens.bin|--batch|2|--seq|16|--batches|3" RC 1
    STDERR "bad_tokens.bin: token 150 at position 40 \\(byte offset 1104\\) is outside the vocabulary \\[0, 101\\)")

  # --save from a tp x pp layout writes the model (llm.c and HF); evaluating the saved files gives
  # the same loss.
  triax_eval_test(save_np4 NP 4 ARGS "--tp|2|--pp|2|--weights|@DIR@/model.safetensors|--save|@DIR@/saved.bin|${_common}")
  triax_eval_test(save_np2 NP 2 ARGS "--pp|2|--weights|@DIR@/model.bin|--save|@DIR@/saved.safetensors|${_common}")
  # Without MPI only the NP 1 runs exist (triax_eval_test): the fixtures name those that do.
  set(_saved_setup "")
  set(_saved_users "")
  foreach(_t eval.save_np4 eval.save_np2)
    if(TEST ${_t})
      list(APPEND _saved_setup ${_t})
    endif()
  endforeach()
  triax_eval_test(saved_llmc NP 1 ARGS "--weights|@DIR@/saved.bin|${_common}")
  triax_eval_test(saved_hf NP 2 ARGS "--tp|2|--weights|@DIR@/saved.safetensors|${_common}")
  foreach(_t eval.saved_llmc eval.saved_hf)
    if(TEST ${_t})
      list(APPEND _saved_users ${_t})
    endif()
  endforeach()
  if(_saved_setup)
    set_tests_properties(${_saved_setup} PROPERTIES FIXTURES_SETUP eval_saved)
    if(_saved_users)
      set_tests_properties(${_saved_users} PROPERTIES FIXTURES_REQUIRED "eval_data;eval_saved")
    endif()
  elseif(TEST eval.saved_llmc)
    set_tests_properties(eval.saved_llmc PROPERTIES DISABLED TRUE)  # nothing writes saved.bin without MPI
  endif()
  triax_eval_test(bad_save_dir NP 2 ARGS "--tp|2|--weights|@DIR@/model.bin|--save|@DIR@/no/such/dir/x.bin|${_common}"
    RC 1 STDERR "no/such/dir/x.bin")

  # Bad inputs: a clear message naming the problem and a non-zero exit.
  triax_eval_test(bad_weights_is_tokens NP 2 ARGS "--tp|2|--weights|@DIR@/tokens.bin|${_common}" RC 1
    STDERR "tokens.bin: this is an llm.c token shard")
  triax_eval_test(bad_weights_truncated NP 2 ARGS "--tp|2|--weights|@DIR@/truncated.bin|${_common}" RC 1
    STDERR "truncated.bin.*truncated")
  triax_eval_test(bad_weights_missing NP 1 ARGS "--weights|@DIR@/nonexistent.safetensors|${_common}" RC 1
    STDERR "nonexistent.safetensors")
  triax_eval_test(bad_data_is_model NP 1 ARGS "--weights|@DIR@/model.bin|--data|@DIR@/model.bin|--batch|2|--seq|16" RC 1
    STDERR "model.bin")
  triax_eval_test(bad_too_many_batches NP 1 ARGS "--weights|@DIR@/model.bin|--data|@DIR@/tokens.bin|--batch|2|--seq|16|--batches|4" RC 1
    STDERR "3 whole batches of 2 x 16")
  triax_eval_test(bad_seq NP 1 ARGS "--weights|@DIR@/model.bin|--data|@DIR@/tokens.bin|--batch|1|--seq|33" RC 1
    STDERR "--seq 33 is longer than the model's 32 positions")
  triax_eval_test(bad_tp NP 2 ARGS "--tp|3|--weights|@DIR@/model.bin|${_common}" RC 1 STDERR "does not divide the 2 processes")
  triax_eval_test(bad_heads NP 1 ARGS "--heads|8|--weights|@DIR@/model.safetensors|${_common}" RC 1
    STDERR "n_head=4 but 8 heads")
  triax_eval_test(bad_flag NP 1 ARGS "--weights|@DIR@/model.bin|--batch|2|--seq|16|--data" RC 2 STDERR "error:.*--data")
  triax_eval_test(bad_missing_flag NP 1 ARGS "--weights|@DIR@/model.bin|--batch|2|--seq|16" RC 2 STDERR "--data is required")

  # --sample: greedy continuation against the fixture's reference, seeded draws (sample_run.cmake).
  add_test(NAME eval.sample
    COMMAND ${CMAKE_COMMAND} -DEVAL=$<TARGET_FILE:gpt_eval> -DFIXTURE=$<TARGET_FILE:eval_fixture> -DDIR=${_dir}
            -P ${CMAKE_CURRENT_SOURCE_DIR}/eval/sample_run.cmake)
  set_tests_properties(eval.sample PROPERTIES FIXTURES_REQUIRED eval_data LABELS "eval" TIMEOUT 300)
  if(TRIAX_WITH_MPI)
    triax_eval_test(bad_sample_np2 NP 2 ARGS "--weights|@DIR@/model.bin|--sample|4|--prompt-tokens|1" RC 1
      STDERR "one process")
    add_test(NAME eval.inputs COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/eval/eval_inputs.sh $<TARGET_FILE:gpt_eval>
             ${MPIEXEC_EXECUTABLE} ${_dir})
    set_tests_properties(eval.inputs PROPERTIES FIXTURES_REQUIRED eval_data LABELS "eval;dist" TIMEOUT 300
      PROCESSORS 2 ENVIRONMENT "${TRIAX_MPIRUN_ENV}")
  endif()
endif()
