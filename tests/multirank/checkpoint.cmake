# Weight files under mpirun: TP-sharded loads equal the shard of the full tensor (safetensors and
# llm.c); saving from tp x pp x dp layouts gathers the same file.
triax_add_multirank_test(test_checkpoint_tp SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_checkpoint_tp.cpp NP 1 2 4 TIMEOUT 120)
