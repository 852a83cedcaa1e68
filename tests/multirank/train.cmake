# The most important test: every TP x PP x DP layout, schedule and ZeRO-1 setting trains the same
# model as one process. Plus the trainer's configuration errors.
triax_add_multirank_test(test_3d_equivalence SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_3d_equivalence.cpp NP 4 8 TIMEOUT 900)
# The same layouts on the Gloo backend, without mpirun.
triax_add_gloo_runs(test_3d_equivalence NP 4 TIMEOUT 900)
triax_add_multirank_test(test_train_errors SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_train_errors.cpp NP 4 TIMEOUT 120)
triax_add_multirank_test(test_moe_train SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_moe_train.cpp NP 4 8 TIMEOUT 600)
# The Backend seam: 3D steps (dense, MoE, every schedule kind, ZeRO-1, SP, recompute) through the
# checking backend, whose buffers fault on any access from outside it, equal the plain backend's.
triax_add_multirank_test(test_backend_checked SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_backend_checked.cpp NP 4 8 TIMEOUT 600)
# Injected faults (TRIAX_FAULT, docs/FAULTS.md): NaN attribution and skip, --max-skipped-iterations,
# the collective mismatch check.
triax_add_multirank_test(test_fault_injection SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_fault_injection.cpp NP 4 TIMEOUT 120)
# Gradient scale and overlap: the synced gradient (plain DP and ZeRO-1 shards) and its norm equal
# the mean of per-sample gradients of a serial run in every layout (a lost 1/m or 1/dp), padded
# vocabulary rows get none; pp 2 x dp 2 starts all DP buckets but the tied one before finish() in
# every schedule, driven by the pipeline executor.
triax_add_multirank_test(test_grad_scale SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_grad_scale.cpp NP 1 4 TIMEOUT 300)
# Mixed-precision plumbing on the CPU: a forced compute copy trains bit for bit like none (plain,
# ZeRO-1, pipeline/TP layouts); the fp16 loss scaler's overflow flag makes every rank skip together.
triax_add_multirank_test(test_mixed_precision SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_mixed_precision.cpp NP 1 2 4 TIMEOUT 300)
# Mixed precision emulated on the CPU (--backend cpu-emulated): bf16/fp16 runs train close to
# float32 with the CUDA backend's buffer types checked at every op; tp 2 / pp 2 in bf16 match one
# process; the backend names the op and buffer of a type violation.
triax_add_multirank_test(test_emulated_precision SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_emulated_precision.cpp NP 1 2 TIMEOUT 300)
# ZeRO-2/3 (issue 27): GPT-2, Llama and MoE at dp 2/4/8 with TP, PP (every schedule), recompute, SP
# and HSDP train the one-process losses and final weights, and equal ZeRO 0 at the same layout.
triax_add_multirank_test(test_zero_sharded SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_zero_sharded.cpp NP 2 4 8 TIMEOUT 600)
triax_add_gloo_runs(test_zero_sharded NP 4 TIMEOUT 600)
