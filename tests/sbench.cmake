# step_bench on a tiny shape (seconds): its correctness checks (finite, nonzero, bit-identical
# gradients; recorded GEMM calls equal the closed form) decide the exit code, at 1 and 2 threads.
# Timings are printed, never asserted (DESIGN.md rule 7).
if(TARGET step_bench)
  add_test(NAME bench.step_bench.tiny
    COMMAND $<TARGET_FILE:step_bench> --batch 1 --seq 64 --model-batch 1 --model-seq 32 --model-layers 1
            --threads 1,2 --reps 1)
  set_tests_properties(bench.step_bench.tiny PROPERTIES TIMEOUT 180 LABELS "bench"
    FAIL_REGULAR_EXPRESSION "FAILED")
endif()
