# train.cp.*: context parallelism through train_gpt (tests/train/cp_cli_test.sh, issue 28): the clear
# ConfigError of each bad --cp input, and the issue's done-means layout (llama-tiny tp 2 cp 2 dp 2,
# np 8) training the one-process losses, and checkpoints resumed at another cp. Included after train.cmake (glob order), which defines
# triax_add_train_script_tests.
if(TRIAX_WITH_MPI AND TRIAX_BUILD_EXAMPLES)
  triax_add_train_script_tests(cp cp_cli_test.sh train_cp CASES errors done_means resume)
endif()
