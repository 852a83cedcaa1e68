# Heterogeneous clusters in the planner (docs/PLANNER.md "Heterogeneous clusters"): the unit test's
# path to clusters/, and triax-plan on the mixed H100/A100 file (plans, the even split, the emitted
# train_gpt config, pinned plans and a bad pin).
if(TARGET test_plan_hetero)
  target_compile_definitions(test_plan_hetero PRIVATE TRIAX_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
endif()

if(TARGET triax-plan)
  set(_het_cluster ${PROJECT_SOURCE_DIR}/clusters/mixed-h100-a100.toml)
  add_test(NAME plan.hetero.search
    COMMAND triax-plan --cluster ${_het_cluster} --model gpt2-medium --global-batch-size 512 --top-k 2)
  set_tests_properties(plan.hetero.search PROPERTIES TIMEOUT 120 LABELS "plan"
    PASS_REGULAR_EXPRESSION "1\\. tp[0-9]+ pp[0-9]+ dp[0-9]+[^\n]*\n   predicted [0-9.e+-]+ s/step[^\n]*\n   h100: [0-9]+ ranks, utilisation [0-9]+%, memory [0-9.]+ of 80\\.0 GiB\n.*even split \\([^\n]*\\): [0-9.e+-]+ s/step[^\n]*; speed-up [0-9.]+x")
  # One pinned plan, the pipeline split across the classes: the planned split differs from the even one.
  add_test(NAME plan.hetero.pinned
    COMMAND triax-plan --cluster ${_het_cluster} --model megatron-7.5b --global-batch-size 64 --tp 8 --pp 2 --dp 2
            --mbs 1 --stage-classes h100,a100 --recompute full --zero 0 --emit-config ${CMAKE_CURRENT_BINARY_DIR}/het_plan_run.toml)
  set_tests_properties(plan.hetero.pinned PROPERTIES TIMEOUT 60 LABELS "plan"
    PASS_REGULAR_EXPRESSION "layers (2[0-9]|19),[0-9]+ \\| stages h100,a100 .*even split \\([^\n]*layers 18,18[^\n]*speed-up 1\\.[0-9]+x.*wrote ")
  add_test(NAME plan.hetero.json
    COMMAND triax-plan --cluster ${_het_cluster} --model gpt2-medium --global-batch-size 512 --top-k 1 --json)
  set_tests_properties(plan.hetero.json PROPERTIES TIMEOUT 120 LABELS "plan"
    PASS_REGULAR_EXPRESSION "\"best\": \\[\n\\{\"plan\": \\{\"layout\": .*\"even\": \\{.*\"speedup\": [0-9.]+\\}\\]\\}")
  add_test(NAME plan.hetero.bad_class
    COMMAND triax-plan --cluster ${_het_cluster} --model gpt2-medium --pp 2 --stage-classes h100,v100)
  set_tests_properties(plan.hetero.bad_class PROPERTIES TIMEOUT 60 LABELS "plan"
    PASS_REGULAR_EXPRESSION "no device class 'v100'; its classes: h100, a100")
endif()

if(TARGET triax-plan)
  # The even split of the same pinned layout priced on its own (its time equals the comparison: unit test).
  add_test(NAME plan.hetero.even
    COMMAND triax-plan --cluster ${_het_cluster} --model megatron-7.5b --global-batch-size 64 --tp 8 --pp 2 --dp 2
            --mbs 1 --stage-classes h100,a100 --recompute full --zero 0 --even)
  set_tests_properties(plan.hetero.even PROPERTIES TIMEOUT 60 LABELS "plan"
    PASS_REGULAR_EXPRESSION "1\\. [^\n]*layers 18,18 \\| stages h100,a100[^\n]*\n   predicted [0-9.]+ s/step.*even split[^\n]*layers 18,18[^\n]*: [0-9.]+ s/step; speed-up 1\\.00x")
endif()

if(TARGET triax-plan)
  add_test(NAME plan.hetero.pin_mismatch
    COMMAND triax-plan --cluster ${_het_cluster} --model gpt2-medium --pp 3 --stage-classes h100,a100)
  set_tests_properties(plan.hetero.pin_mismatch PROPERTIES TIMEOUT 60 LABELS "plan"
    PASS_REGULAR_EXPRESSION "--pp 3 but --stage-classes names 2 entries")
endif()
