# benchmarks/torch_compare.py --smoke: triax and a PyTorch GPT-2 of the same tiny shape (vocab 100
# padded to 128), from triax's exported initial weights, on the same batch for 5 AdamW steps with
# clipping: losses agree to 1e-4 and grad norms to 1e-3 (relative) step by step, the loss falls and
# the first norm is clipped. Skipped (77) where the Python (TRIAX_HF_PYTHON, eval.cmake) has no
# torch (Debian: python3-torch, installed by scripts/test.sh: scripts/setup.sh --tests).
if(TARGET torch_compare_triax AND EXISTS "${TRIAX_HF_PYTHON}")
  add_test(NAME bench.torch_compare.smoke
    COMMAND ${TRIAX_HF_PYTHON} ${PROJECT_SOURCE_DIR}/benchmarks/torch_compare.py --smoke
            --triax $<TARGET_FILE:torch_compare_triax>)
  set_tests_properties(bench.torch_compare.smoke PROPERTIES TIMEOUT 180 LABELS "bench" SKIP_RETURN_CODE 77
    ENVIRONMENT "OMP_WAIT_POLICY=PASSIVE")
endif()

# --smoke --ranks 2: triax dp 2 and pp 2 (mpirun -np 2, the Trainer: DP buckets, 1F1B over 4
# micro-batches) against PyTorch DistributedDataParallel on 2 gloo processes (127.0.0.1), from the
# same initial weights on the same repeated batch for 5 steps: every step's global loss within 1e-4
# and grad norm within 1e-3 of PyTorch's, the loss falls, the first norm is clipped. One thread
# per rank; skipped (77) without torch or mpirun.
if(TARGET torch_compare_triax AND EXISTS "${TRIAX_HF_PYTHON}" AND TRIAX_WITH_MPI)
  set(_sess ${CMAKE_BINARY_DIR}/ompi-sessions/bench.torch_compare.dp2_pp2_smoke)
  file(MAKE_DIRECTORY ${_sess})
  add_test(NAME bench.torch_compare.dp2_pp2_smoke
    COMMAND ${TRIAX_HF_PYTHON} ${PROJECT_SOURCE_DIR}/benchmarks/torch_compare.py --smoke --ranks 2 --layouts dp2,pp2
            --triax $<TARGET_FILE:torch_compare_triax> --mpirun ${MPIEXEC_EXECUTABLE})
  set_tests_properties(bench.torch_compare.dp2_pp2_smoke PROPERTIES TIMEOUT 240 LABELS "bench" SKIP_RETURN_CODE 77
    PROCESSORS 2 ENVIRONMENT "${TRIAX_MPIRUN_ENV};OMPI_MCA_orte_tmpdir_base=${_sess};OMP_WAIT_POLICY=PASSIVE")
endif()

# The same two checks for the Llama block (--llama: the llama-smoke shapes, vocab 100 padded to 128,
# 4 query heads over 2 key/value heads, SwiGLU width 176): triax's worker with the llama-tiny
# preset's block against the plain-torch Llama of torch_compare.py (RMSNorm, SwiGLU, rotate-half
# RoPE, grouped-query attention, untied head), from triax's exported weights.
if(TARGET torch_compare_triax AND EXISTS "${TRIAX_HF_PYTHON}")
  add_test(NAME bench.torch_compare.llama_smoke
    COMMAND ${TRIAX_HF_PYTHON} ${PROJECT_SOURCE_DIR}/benchmarks/torch_compare.py --smoke --llama
            --triax $<TARGET_FILE:torch_compare_triax>)
  set_tests_properties(bench.torch_compare.llama_smoke PROPERTIES TIMEOUT 180 LABELS "bench" SKIP_RETURN_CODE 77
    ENVIRONMENT "OMP_WAIT_POLICY=PASSIVE")
endif()
if(TARGET torch_compare_triax AND EXISTS "${TRIAX_HF_PYTHON}" AND TRIAX_WITH_MPI)
  set(_sess ${CMAKE_BINARY_DIR}/ompi-sessions/bench.torch_compare.llama_dp2_pp2_smoke)
  file(MAKE_DIRECTORY ${_sess})
  add_test(NAME bench.torch_compare.llama_dp2_pp2_smoke
    COMMAND ${TRIAX_HF_PYTHON} ${PROJECT_SOURCE_DIR}/benchmarks/torch_compare.py --smoke --llama --ranks 2
            --layouts dp2,pp2 --triax $<TARGET_FILE:torch_compare_triax> --mpirun ${MPIEXEC_EXECUTABLE})
  set_tests_properties(bench.torch_compare.llama_dp2_pp2_smoke PROPERTIES TIMEOUT 240 LABELS "bench"
    SKIP_RETURN_CODE 77 PROCESSORS 2
    ENVIRONMENT "${TRIAX_MPIRUN_ENV};OMPI_MCA_orte_tmpdir_base=${_sess};OMP_WAIT_POLICY=PASSIVE")
endif()
