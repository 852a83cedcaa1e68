# train.het.*: heterogeneous clusters through train_gpt (tests/train/het_cli_test.sh, issue 29): ranks of
# two device classes (TRIAX_DEVICE_CLASS per mpirun app context) with --dp-microbatches per class,
# --stage-classes with uneven --pipeline-layers, and both, train the one-process losses; each
# mistake is one ConfigError per job. Included after train.cmake (glob order), which defines
# triax_add_train_script_tests.
if(TRIAX_WITH_MPI AND TRIAX_BUILD_EXAMPLES)
  triax_add_train_script_tests(het het_cli_test.sh train_het CASES e2e errors)
endif()
