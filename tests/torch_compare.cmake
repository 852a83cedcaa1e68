# benchmarks/torch_compare.py --smoke: triax and a PyTorch GPT-2 of the same tiny shape (vocab 100
# padded to 128), from triax's exported initial weights, on the same batch for 5 AdamW steps with
# clipping: losses agree to 1e-4 and grad norms to 1e-3 (relative) step by step, the loss falls and
# the first norm is clipped. Skipped (77) where the Python (TRIAX_HF_PYTHON, eval.cmake) has no
# torch (Debian: python3-torch, installed by scripts/setup.sh).
if(TARGET torch_compare_triax AND EXISTS "${TRIAX_HF_PYTHON}")
  add_test(NAME bench.torch_compare.smoke
    COMMAND ${TRIAX_HF_PYTHON} ${PROJECT_SOURCE_DIR}/benchmarks/torch_compare.py --smoke
            --triax $<TARGET_FILE:torch_compare_triax>)
  set_tests_properties(bench.torch_compare.smoke PROPERTIES TIMEOUT 180 LABELS "bench" SKIP_RETURN_CODE 77
    ENVIRONMENT "OMP_WAIT_POLICY=PASSIVE")
endif()
