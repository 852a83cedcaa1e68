# The house rules: every #include points down the layers of scripts/check_layers.py
# (docs/ARCHITECTURE.md draws them), checked on the tree and shown to fail on upward includes.
add_test(NAME house.layers COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/house/layers_test.sh)
set_tests_properties(house.layers PROPERTIES TIMEOUT 60 LABELS "house")

# Every environment variable is read through core/env.h (one parser, one set of rules;
# docs/ENVIRONMENT.md): no getenv/secure_getenv/environ outside src/core/env.cpp.
add_test(NAME house.env_reads COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/house/env_test.sh)
set_tests_properties(house.env_reads PROPERTIES TIMEOUT 60 LABELS "house")

# No function in src/ over 100 lines unless tests/house/long_functions.txt says why (measured by
# lizard), checked on the tree and shown to fail on a synthetic long function.
add_test(NAME house.function_length COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/house/function_length_test.sh)
set_tests_properties(house.function_length PROPERTIES TIMEOUT 300 LABELS "house")

# No CUDA launcher allocates device memory per call (kernels/, src/cuda/ outside the files that own
# memory: the backend's pool, the scratch arena, the plain allocator, the cuBLASLt workspace).
add_test(NAME house.cuda_alloc COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/house/cuda_alloc_test.sh)
set_tests_properties(house.cuda_alloc PROPERTIES TIMEOUT 60 LABELS "house")
