# Planner tests beyond the globbed unit tests: data paths for two unit tests, and the triax-plan
# command line (JSON parsed and checked, bad flags and bad layouts give a message and non-zero exit).

# The published measurements live in the project (data/validation/, each row with its source).
# TRIAX_SC21_CSV in the environment overrides the SC21 subset's path.
if(TARGET test_plan_validation)
  target_compile_definitions(test_plan_validation PRIVATE
    TRIAX_SC21_CSV="${PROJECT_SOURCE_DIR}/data/validation/megatron_sc21_table1_subset.csv")
endif()
if(TARGET test_plan_published_runs)
  target_compile_definitions(test_plan_published_runs PRIVATE
    TRIAX_RUNS_CSV="${PROJECT_SOURCE_DIR}/data/validation/published_runs.csv")
  set_tests_properties(unit.test_plan_published_runs PROPERTIES TIMEOUT 300)
endif()
if(TARGET test_plan_cluster)
  target_compile_definitions(test_plan_cluster PRIVATE TRIAX_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
endif()

if(TARGET triax-plan)
  set(_plan_check ${CMAKE_CURRENT_SOURCE_DIR}/plan/check_cli.cmake)
  # triax_plan_cli_test(NAME ARGS "a|b|c" [RC n] [STDERR regex] [STDOUT regex] [JSON key,key])
  function(triax_plan_cli_test name)
    cmake_parse_arguments(A "" "ARGS;RC;STDERR;STDOUT;JSON;JSON_SEARCH" "" ${ARGN})
    if(NOT DEFINED A_RC)
      set(A_RC 0)
    endif()
    add_test(NAME plan.cli.${name}
      COMMAND ${CMAKE_COMMAND} -DEXE=$<TARGET_FILE:triax-plan> "-DARGS=${A_ARGS}" -DRC=${A_RC}
              "-DSTDERR=${A_STDERR}" "-DSTDOUT=${A_STDOUT}" "-DJSON=${A_JSON}" "-DJSON_SEARCH=${A_JSON_SEARCH}"
              -P ${_plan_check})
    set_tests_properties(plan.cli.${name} PROPERTIES LABELS "plan" TIMEOUT 120)
  endfunction()

  set(_keys "seconds_per_iteration,tflops_per_gpu,mfu,memory_gib,fits")
  triax_plan_cli_test(json
    ARGS "--model|megatron-7.5b|--cluster|selene-a100|--tp|4|--pp|2|--dp|16|--mbs|2|--recompute|full|--json"
    JSON ${_keys})
  if(tomlplusplus_FOUND)
    triax_plan_cli_test(json_toml_cluster
      ARGS "--model|gpt2-small|--cluster|${PROJECT_SOURCE_DIR}/clusters/cpu-local.toml|--tp|1|--pp|2|--dp|1|--mbs|4|--precision|fp32|--json"
      JSON ${_keys})
  endif()
  triax_plan_cli_test(search_json
    ARGS "--model|megatron-39b|--gpus|64|--top-k|3|--json"
    JSON ${_keys} JSON_SEARCH "enumerated,invalid,no_fit,ranked,best,lost_by")
  triax_plan_cli_test(text
    ARGS "--model|gpt3-175b|--tp|8|--pp|8|--dp|16|--mbs|1|--vpp|3|--recompute|selective|--sequence-parallel"
    STDOUT "time per iteration.*pipeline bubble.*TFLOP/s per GPU.*memory per GPU")
  triax_plan_cli_test(search_text
    ARGS "--model|megatron-18b|--gpus|128|--recompute|selective"
    STDOUT "searched [0-9]+ layouts.*rank +layout.*best layout in detail")
  # Grouped-query attention from the command line: the text names the key/value heads, and fewer
  # of them than tp is a layout error.
  triax_plan_cli_test(kv_heads
    ARGS "--layers|32|--hidden|6144|--heads|48|--kv-heads|8|--vocab|256000|--seq|4096|--global-batch|256|--cluster|dgx-h100|--tp|4|--pp|1|--dp|16|--mbs|4"
    STDOUT "48 heads \\(8 key/value\\)")
  triax_plan_cli_test(kv_heads_tp
    ARGS "--layers|32|--hidden|6144|--heads|48|--kv-heads|2|--vocab|256000|--seq|4096|--global-batch|256|--cluster|dgx-h100|--tp|4|--pp|1|--dp|16|--mbs|4"
    RC 1 STDERR "tp 4 does not divide kv_heads 2")
  triax_plan_cli_test(list ARGS "--list" STDOUT "megatron-1t.*selene-a100.*cpu-local")
  # The Llama presets from the command line: one layout (text names the block and the published
  # size), a search, --tune, JSON with the block's keys, and the list.
  triax_plan_cli_test(llama3_8b
    ARGS "--model|llama3-8b|--tp|4|--pp|1|--dp|16|--mbs|1|--recompute|selective|--sequence-parallel|--zero1"
    STDOUT "llama3-8b: 32 layers, hidden 4096, 32 heads \\(8 key/value\\), ffn 14336.*8\\.03B params\\); SwiGLU, RMSNorm, RoPE, no biases, untied head.*time per iteration")
  triax_plan_cli_test(llama3_8b_search ARGS "--model|llama3-8b|--gpus|64|--top-k|3|--json"
    JSON ${_keys} JSON_SEARCH "enumerated,invalid,no_fit,ranked,best,lost_by")
  triax_plan_cli_test(llama3_70b_json
    ARGS "--model|llama3-70b|--cluster|dgx-h100|--tp|8|--pp|4|--dp|8|--mbs|1|--recompute|selective|--sequence-parallel|--zero1|--json"
    JSON ${_keys})
  triax_plan_cli_test(llama3_2_1b_tune
    ARGS "--tune|--model|llama3.2-1b|--gpus|64|--grad-accum|4|--mbs|2"
    STDOUT "current: tp1 pp1 dp64 mbs2.*recommendation:")
  triax_plan_cli_test(llama_flags
    ARGS "--layers|16|--hidden|2048|--heads|32|--num-query-groups|8|--ffn-hidden-size|8192|--swiglu|--normalization|RMSNorm|--position-embedding-type|rope|--disable-bias-linear|--vocab|128256|--seq|8192|--global-batch|512|--tp|2|--pp|1|--dp|32|--mbs|1"
    STDOUT "1\\.24B params\\); SwiGLU, RMSNorm, RoPE, no biases")
  triax_plan_cli_test(llama_list ARGS "--list" STDOUT "llama3.2-1b.*kv 8, SwiGLU, RMSNorm, RoPE, no biases.*llama3-70b.*untied head")
  triax_plan_cli_test(bad_flag ARGS "--model|gpt2-small|--tensor-parallel|2" RC 2 STDERR "error:.*tensor-parallel")
  triax_plan_cli_test(bad_schedule ARGS "--model|gpt2-small|--gpus|8|--schedule|1F1B" RC 2 STDERR "error:.*1F1B")
  triax_plan_cli_test(bad_number ARGS "--model|gpt2-small|--gpus|0" RC 2 STDERR "error: --gpus: must be a positive integer, got .0.")
  triax_plan_cli_test(no_model ARGS "--gpus|8" RC 2 STDERR "error: give --model NAME")
  triax_plan_cli_test(no_gpus ARGS "--model|gpt2-small|--tp|2" RC 2 STDERR "needs --gpus")
  triax_plan_cli_test(gpus_mismatch ARGS "--model|gpt2-small|--gpus|4|--tp|2|--pp|1|--dp|1|--mbs|1" RC 2
    STDERR "--gpus 4 but tp\\*pp\\*dp = 2")
  triax_plan_cli_test(bad_layout ARGS "--model|gpt2-small|--tp|5|--pp|1|--dp|1|--mbs|1" RC 1
    STDERR "tp 5 does not divide heads 12")
  triax_plan_cli_test(unknown_model ARGS "--model|gpt9|--gpus|8" RC 1 STDERR "unknown model preset 'gpt9'")
  triax_plan_cli_test(missing_cluster_file ARGS "--model|gpt2-small|--gpus|8|--cluster|/nonexistent/c.toml" RC 1
    STDERR "/nonexistent/c.toml: cluster file does not exist")
  triax_plan_cli_test(missing_calibration ARGS "--model|gpt2-small|--gpus|8|--calibration|/nonexistent/cal.json" RC 1
    STDERR "/nonexistent/cal.json: calibration file does not exist")
  triax_plan_cli_test(validate_missing ARGS "--validate-sc21|/nonexistent/t.csv" RC 1
    STDERR "/nonexistent/t.csv: cannot open the SC21 table")
  triax_plan_cli_test(tune_text
    ARGS "--tune|--model|megatron-7.5b|--gpus|128|--global-batch|4096|--grad-accum|4|--mbs|64|--recompute|full"
    STDOUT "current: tp8 pp1 dp16 mbs64.*limit:.*proposed changes.*micro-batch 64 ->.*recommendation:")
  triax_plan_cli_test(tune_bad_accum
    ARGS "--tune|--model|megatron-7.5b|--gpus|128|--global-batch|4096|--grad-accum|3|--mbs|64" RC 2
    STDERR "global batch 4096 is not a multiple of mbs 64 x grad-accum 3")
  triax_plan_cli_test(tune_needs_settings ARGS "--tune|--model|megatron-7.5b|--gpus|128" RC 2 STDERR "--tune needs --mbs")
  triax_plan_cli_test(validate_runs
    ARGS "--validate|${PROJECT_SOURCE_DIR}/data/validation/published_runs.csv"
    STDOUT "sc21-1.7b.*mlsys23-1t-sel.*leave-one-out: +mean \\|error\\| [0-4]\\.[0-9]+%.*held out by source")
  # ZeRO levels: llama3-70b on 64 GPUs without tp, cp or pp fits only with ZeRO-3, and says why; a
  # single ZeRO-3 HSDP layout reports its level and shard size (and the old zero1 boolean) in JSON;
  # the old --zero1 spelling and the new one give the same layout; bad levels are refused.
  triax_plan_cli_test(zero3_only
    ARGS "--model|llama3-70b|--cluster|dgx-h100|--gpus|64|--tp|1|--cp|1|--pp|1|--top-k|2"
    STDOUT "only ZeRO-3 fits: the leanest layout below ZeRO-3 \\(tp1 pp1 dp64 [^)]*zero2[^)]*\\) needs [0-9.]+ GiB per GPU of 80\\.0 GiB \\(parameters [0-9.]+ GiB, gradients.*rank +layout.* zero3")
  triax_plan_cli_test(zero3_only_json
    ARGS "--model|llama3-70b|--cluster|dgx-h100|--gpus|64|--tp|1|--cp|1|--pp|1|--top-k|2|--json"
    JSON ${_keys} STDOUT "\"zero_needed\": \"only ZeRO-3 fits: the leanest layout below ZeRO-3")
  triax_plan_cli_test(zero2_nothing_fits
    ARGS "--model|llama3-70b|--cluster|dgx-h100|--gpus|64|--tp|1|--pp|1|--zero|2" RC 3 STDERR "no layout of llama3-70b fits")
  triax_plan_cli_test(zero3_hsdp_json
    ARGS "--model|llama3-8b|--cluster|dgx-h100|--tp|1|--pp|1|--dp|32|--mbs|1|--zero|zero3 hsdp8|--json"
    JSON "${_keys},dp_traffic"
    STDOUT "\"summary\": \"tp1 pp1 dp32 mbs1 1f1b rc=none zero3 hsdp8\",.*\"zero\": 3,.*\"zero1\": false,.*\"zero_shard\": 8")
  triax_plan_cli_test(zero3_hsdp_text
    ARGS "--model|llama3-8b|--cluster|dgx-h100|--tp|1|--pp|1|--dp|32|--mbs|1|--zero|3|--zero-shard-size|8"
    STDOUT "layout  tp1 pp1 dp32 mbs1 1f1b rc=none zero3 hsdp8 .*zero3 per step: all-gather [0-9.]+ GiB, reduce-scatter [0-9.]+ GiB over 8 ranks on 1 node\\(s\\), all-reduce [0-9.]+ GiB over 4 groups")
  triax_plan_cli_test(zero1_old_flag
    ARGS "--model|gpt2-small|--tp|1|--pp|1|--dp|4|--mbs|4|--zero1|--json"
    STDOUT "\"summary\": \"tp1 pp1 dp4 mbs4 1f1b rc=none zero1\",.*\"zero\": 1,.*\"zero1\": true,.*\"zero_shard\": 4" JSON ${_keys})
  triax_plan_cli_test(zero_bad_level ARGS "--model|gpt2-small|--tp|1|--pp|1|--dp|4|--mbs|4|--zero|zero4" RC 1
    STDERR "error: --zero zero4: 'zero4': expected zeroN with N from 0 to 3")
  triax_plan_cli_test(zero_hsdp_needs_zero2 ARGS "--model|gpt2-small|--tp|1|--pp|1|--dp|4|--mbs|4|--zero|1|--zero-shard-size|2" RC 1
    STDERR "hybrid sharding \\(zero shard size 2 < dp 4\\) needs zero 2 or 3")
  # Context parallelism: one layout with --cp (text names the axis and the ring's traffic; JSON has
  # cp and the exposed / hidden exchange), the all-gather variant, a sequence 2 cp does not divide,
  # the GPU count with cp, and a search where only CP fits (says so).
  triax_plan_cli_test(cp_text
    ARGS "--model|llama3-8b|--cluster|dgx-h100|--software|megatron-core-2024|--tp|1|--cp|2|--pp|1|--dp|4|--mbs|1|--global-batch|128"
    STDOUT "layout  tp1 cp2 pp1 dp4 mbs1 1f1b rc=none zero1 on 8 GPUs.*cp comm \\(exposed\\).*cp2 p2p per step: 48\\.00 GiB sent over 2 ranks on 1 node\\(s\\)")
  triax_plan_cli_test(cp_json
    ARGS "--model|llama3-70b|--cluster|dgx-h100|--tp|4|--cp|2|--pp|4|--dp|2|--vpp|5|--mbs|1|--global-batch|128|--sequence-parallel|--json"
    JSON "${_keys},cp_traffic" STDOUT "\"cp\": 2,.*\"cp_comm\": \"p2p\".*\"summary\": \"tp4 cp2 pp4 dp2 v5 mbs1 interleaved rc=none sp\"")
  triax_plan_cli_test(cp_allgather
    ARGS "--model|llama3-8b|--cluster|dgx-h100|--tp|2|--cp|4|--pp|1|--dp|1|--mbs|1|--global-batch|8|--cp-comm-type|allgather"
    STDOUT "tp2 cp4 pp1 dp1 mbs1 1f1b rc=none cp-allgather.*cp4 allgather per step: .* 0% hidden")
  triax_plan_cli_test(cp_bad_seq
    ARGS "--model|llama3-8b|--cluster|dgx-h100|--tp|1|--cp|16|--pp|1|--dp|1|--mbs|1|--seq|8200|--global-batch|8" RC 1
    STDERR "cp 16: seq 8200 is not divisible by 2\\*cp = 32")
  triax_plan_cli_test(cp_bad_comm ARGS "--model|llama3-8b|--gpus|8|--cp-comm-type|a2a" RC 2 STDERR "error:.*a2a")
  triax_plan_cli_test(cp_gpus_mismatch ARGS "--model|gpt2-small|--gpus|4|--tp|1|--cp|2|--pp|1|--dp|1|--mbs|1" RC 2
    STDERR "--gpus 4 but tp\\*cp\\*pp\\*dp = 2")
  triax_plan_cli_test(cp_only
    ARGS "--model|llama3-70b|--cluster|dgx-h100|--seq|131072|--global-batch|64|--gpus|64|--recompute|none|--top-k|2"
    STDOUT "only CP fits: the leanest layout without context parallelism \\(tp[0-9]+ pp[0-9]+ dp[0-9]+ [^)]*\\) needs [0-9.]+ GiB per GPU of 80\\.0 GiB.*rank +layout.*1  tp[0-9]+ cp[0-9]+ ")
  triax_plan_cli_test(nothing_fits ARGS "--model|megatron-1t|--gpus|8" RC 3 STDERR "no layout of megatron-1t fits")
endif()
