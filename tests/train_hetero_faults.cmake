# train.hetero_straggler.*: a slow device class is reported as a class with the re-plan advice, a
# slow rank of a class is not (tests/train/hetero_straggler_test.sh, docs/HETEROGENEOUS.md).
if(TRIAX_WITH_MPI AND TRIAX_BUILD_EXAMPLES)
  triax_add_train_script_tests(hetero_straggler hetero_straggler_test.sh hetero_straggler CASES class rank)
endif()
