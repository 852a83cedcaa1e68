# train_bench for heterogeneous clusters (docs/BENCHMARKS.md "Heterogeneous CPU classes"), on a tiny
# model at np 2: --write-cluster writes the calibrated class as a cluster file that reads back to the
# measured numbers and that triax-plan prices a layout on (with --fit-step: the rates scaled to the
# run's own step); an MPMD launch of two device classes
# (TRIAX_DEVICE_CLASS, the slow one on OpenBLAS's Core2 kernels) reports each class's compute time
# and the losses of the one-class run; with the heterogeneous runtime, the same with uneven DP
# shares (--dp-microbatches fast=3,slow=1) and with stages placed on the classes (--stage-classes
# fast,slow); those two are skipped (exit 77) on a trainer without the options.
# Timings are not asserted.
if(TRIAX_WITH_MPI AND TARGET train_bench AND TARGET triax-plan)
  set(_hb ${CMAKE_CURRENT_SOURCE_DIR}/het_bench/check.sh)
  set(_dir ${CMAKE_CURRENT_BINARY_DIR}/het_bench)
  add_test(NAME bench.het.write_cluster
    COMMAND bash ${_hb} calibrate ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:train_bench> $<TARGET_FILE:triax-plan>
            ${_dir}/calibrate)
  add_test(NAME bench.het.mpmd_classes
    COMMAND bash ${_hb} mpmd ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:train_bench> ${_dir}/mpmd)
  add_test(NAME bench.het.fit_step
    COMMAND bash ${_hb} fit ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:train_bench> ${_dir}/fit)
  set(_tests bench.het.write_cluster bench.het.mpmd_classes bench.het.fit_step)
  add_test(NAME bench.het.mpmd_dp_shares
    COMMAND bash ${_hb} mpmd ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:train_bench> ${_dir}/shares
            --dp-microbatches fast=3,slow=1)
  add_test(NAME bench.het.mpmd_stage_classes
    COMMAND bash ${_hb} mpmd ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:train_bench> ${_dir}/stages
            --pp 2 --dp 1 --pipeline-layers 1,1 --stage-classes fast,slow)
  list(APPEND _tests bench.het.mpmd_dp_shares bench.het.mpmd_stage_classes)
  foreach(_t ${_tests})
    set(_sess ${CMAKE_BINARY_DIR}/ompi-sessions/${_t})
    file(MAKE_DIRECTORY ${_sess})
    set_tests_properties(${_t} PROPERTIES TIMEOUT 180 LABELS "bench;dist" PROCESSORS 2
      ENVIRONMENT "${TRIAX_MPIRUN_ENV};OMPI_MCA_orte_tmpdir_base=${_sess}" SKIP_RETURN_CODE 77)
  endforeach()
endif()
