# Context parallelism (issue 28): the cp layouts (alone, with TP/SP, PP, DP, ZeRO 1-3, recompute, GPT-2
# and Llama, p2p and allgather) train the one-process losses and weights, validation included; the
# float64 gradient at cp 2 (and tp 2 x cp 2) equals the one-process gradient and central differences.
triax_add_multirank_test(test_cp_equivalence SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cp_equivalence.cpp NP 2 4 8 TIMEOUT 300)
triax_add_multirank_test(test_cp_gradcheck SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cp_gradcheck.cpp NP 2 4 TIMEOUT 120)
# The ring's batched send/recv and the all-gather on the Gloo backend, without mpirun.
triax_add_gloo_runs(test_cp_equivalence NP 4 TIMEOUT 300)
