# AdamW against PyTorch: tests/optim/adamw_torch_dump trains a small GPT serially for 5 steps
# (changing lr, clipping on some steps, decay and no-decay parameters); adamw_torch_check.py replays
# the same gradients through torch.optim.AdamW and compares weights and Adam moments. Skipped (77)
# where the Python (TRIAX_HF_PYTHON, eval.cmake) has no torch (Debian: python3-torch).
add_executable(adamw_torch_dump ${CMAKE_CURRENT_SOURCE_DIR}/optim/adamw_torch_dump.cpp)
target_link_libraries(adamw_torch_dump PRIVATE triax::triax nlohmann_json::nlohmann_json)
if(EXISTS "${TRIAX_HF_PYTHON}")
  add_test(NAME optim.adamw_torch
    COMMAND ${TRIAX_HF_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/optim/adamw_torch_check.py $<TARGET_FILE:adamw_torch_dump>)
  set_tests_properties(optim.adamw_torch PROPERTIES TIMEOUT 120 LABELS "optim" SKIP_RETURN_CODE 77
    ENVIRONMENT "OMP_WAIT_POLICY=PASSIVE;OMP_NUM_THREADS=1")
endif()
