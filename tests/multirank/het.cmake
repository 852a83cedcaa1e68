# Heterogeneous clusters (issue 29, docs/HETEROGENEOUS.md): uneven data-parallel shares
# (--dp-microbatches per replica and per device class) in every layout they compose with train the
# one-process model over the same global batch; an even split given as shares equals none bit for
# bit; validation splits by the shares; a checkpoint resumes under any split.
triax_add_multirank_test(test_hetero_equivalence SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_hetero_equivalence.cpp NP 2 4 TIMEOUT 300)
# The same on the Gloo backend, without mpirun.
triax_add_gloo_runs(test_hetero_equivalence NP 2 TIMEOUT 300)
