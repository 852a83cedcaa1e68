# Tensor-parallel GPT equals the serial model: loss and every gathered gradient, tp = 1, 2, 4.
triax_add_dist_test(test_tp_model SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tp_model.cpp NP 1 2 4 TIMEOUT 300)
