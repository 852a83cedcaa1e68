# train.cp_moe.* (tests/train/cp_moe_test.sh, issue 28): MoE under context parallelism trains the
# one-process losses and aux losses (cp 2 and 4, p2p and allgather, with ep 2 x dp 2), and
# checkpoints saved under cp 2 (ZeRO 0, 1, 3; MoE) resume at cp 1 and cp 4 with the uninterrupted
# losses. train.memory.cp (tests/train/zero_memory_test.sh): the memory model at cp 1, 2, 4.
# Named train_cp_moe so that the glob includes it after train.cmake, which defines
# triax_add_train_script_tests.
if(TRIAX_WITH_MPI AND TRIAX_BUILD_EXAMPLES)
  triax_add_train_script_tests(cp_moe cp_moe_test.sh train_cp_moe CASES moe checkpoint)
  triax_add_train_script_tests(memory zero_memory_test.sh zero_memory CASES cp)
endif()
