# train.hetero_plan.done_means: a heterogeneous cluster file, triax-plan's plan for it (uneven stages
# and uneven DP shares), and train_gpt running the emitted config under its MPMD launch line with
# the one-process losses (tests/train/hetero_plan_test.sh; issue 29's "done means").
if(TRIAX_WITH_MPI AND TRIAX_BUILD_EXAMPLES AND TARGET triax-plan)
  triax_add_train_script_tests(hetero_plan hetero_plan_test.sh hetero_plan CASES done_means
    ARGS $<TARGET_FILE:triax-plan> ${CMAKE_SOURCE_DIR})
endif()
