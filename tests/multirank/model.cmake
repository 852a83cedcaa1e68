# Tensor-parallel GPT equals the serial model: loss and every gathered gradient, tp = 1, 2, 4.
triax_add_multirank_test(test_tp_model SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tp_model.cpp NP 1 2 4 TIMEOUT 300)
# The backward pass against float64 central finite differences: every parameter tensor, dense and
# MoE layers, each recompute mode, sequence parallelism at tp = 2.
triax_add_multirank_test(test_gradcheck SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gradcheck.cpp NP 1 2 TIMEOUT 300)
