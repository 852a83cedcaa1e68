# Real data: shuffled Megatron corpus, validation loss equal at every layout, reads per rank.
triax_add_multirank_test(test_data_valid SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_data_valid.cpp NP 1 4 TIMEOUT 600)
