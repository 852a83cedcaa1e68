# Optimizer side of data parallelism under mpirun: bucketed/overlapped gradient sync, tied
# embedding, ZeRO-1 against plain DP, global gradient norm over tp x pp x dp, NaN skip.
triax_add_multirank_test(optim_grad_sync SOURCES ${CMAKE_CURRENT_LIST_DIR}/optim_grad_sync.cpp NP 1 2 4 TIMEOUT 120)
triax_add_multirank_test(optim_zero SOURCES ${CMAKE_CURRENT_LIST_DIR}/optim_zero.cpp NP 1 2 4 TIMEOUT 120)
