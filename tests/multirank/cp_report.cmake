# Context parallelism's exchange report (issue 28, "Overlap"): a trainer at cp 2 (p2p and
# allgather) reports each step's exposed and total K/V exchange time; at cp 1 the field is absent.
triax_add_multirank_test(test_cp_report_train SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cp_report_train.cpp NP 2 TIMEOUT 180)
