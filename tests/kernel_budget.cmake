# The per-kernel register/spill budget (scripts/kernel_budget.py): kernel.budget_script shows on
# made-up ptxas reports that the check passes, and fails naming the kernel and the regenerate
# command (no CUDA needed); cuda.kernel_budget compares this build's records (written by every
# kernels/*.cu compile, cmake/TriaxCuda.cmake) with tests/cuda/kernel_budget.txt. It reads the
# build, not a GPU, so it runs everywhere CUDA compiles.
set(_kernel_budget ${PROJECT_SOURCE_DIR}/scripts/kernel_budget.py)
add_test(NAME kernel.budget_script COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/cuda/kernel_budget_test.py ${_kernel_budget})
set_tests_properties(kernel.budget_script PROPERTIES TIMEOUT 60 LABELS "kernel")
if(TRIAX_HAVE_CUDA AND TRIAX_KERNEL_RECORDS)
  set(_budget_file ${CMAKE_CURRENT_SOURCE_DIR}/cuda/kernel_budget.txt)
  set(_budget_regen "cmake --build ${CMAKE_BINARY_DIR} --target kernel_budget_update")
  add_test(NAME cuda.kernel_budget COMMAND python3 ${_kernel_budget} check --records ${TRIAX_KERNEL_RECORD_DIR}
    --budget ${_budget_file} --regen ${_budget_regen})
  set_tests_properties(cuda.kernel_budget PROPERTIES TIMEOUT 60 LABELS "cuda;kernel")
  # Rewrites the budget from this build's records (review the diff before committing it).
  add_custom_target(kernel_budget_update
    COMMAND python3 ${_kernel_budget} check --records ${TRIAX_KERNEL_RECORD_DIR} --budget ${_budget_file} --write
    DEPENDS triax VERBATIM)
endif()
