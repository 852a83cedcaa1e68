# schedule_print end to end: each schedule prints its simulated bubble next to the closed form,
# the Chrome trace is written, and a layout the interleaved schedule cannot run is refused.
if(TARGET schedule_print)
  set(_sp $<TARGET_FILE:schedule_print>)
  add_test(NAME tool.schedule_print.gpipe COMMAND ${_sp} --schedule gpipe --pp 4 --micro-batches 8)
  add_test(NAME tool.schedule_print.1f1b COMMAND ${_sp} --schedule 1f1b --pp 4 --micro-batches 8)
  add_test(NAME tool.schedule_print.interleaved
    COMMAND ${_sp} --schedule interleaved --pp 4 --vpp 2 --micro-batches 8 --trace ${CMAKE_CURRENT_BINARY_DIR}/schedule_print_trace.json)
  add_test(NAME tool.schedule_print.zb_h1 COMMAND ${_sp} --schedule zb-h1 --pp 4 --micro-batches 8 --no-lists)
  add_test(NAME tool.schedule_print.bad_layout COMMAND ${_sp} --schedule interleaved --pp 4 --vpp 2 --micro-batches 6)
  set_tests_properties(tool.schedule_print.gpipe tool.schedule_print.1f1b PROPERTIES
    PASS_REGULAR_EXPRESSION "idle/compute 0\\.3750, idle/makespan 0\\.2727; theory \\(zero comm\\) idle/compute 0\\.3750")
  set_tests_properties(tool.schedule_print.interleaved PROPERTIES
    PASS_REGULAR_EXPRESSION "idle/compute 0\\.1875.*theory \\(zero comm\\) idle/compute 0\\.1875.*wrote .*schedule_print_trace\\.json")
  set_tests_properties(tool.schedule_print.zb_h1 PROPERTIES
    PASS_REGULAR_EXPRESSION "deadlock-free under eager, rendezvous, blocking.*idle/compute 0\\.1250.*theory \\(zero comm\\) idle/compute 0\\.1250")
  set_tests_properties(tool.schedule_print.bad_layout PROPERTIES
    PASS_REGULAR_EXPRESSION "schedule_print: interleaved schedule needs the number of micro-batches to be a multiple of pp: m=6 pp=4")
  set_tests_properties(tool.schedule_print.gpipe tool.schedule_print.1f1b tool.schedule_print.interleaved
    tool.schedule_print.zb_h1 tool.schedule_print.bad_layout PROPERTIES TIMEOUT 60 LABELS "unit;schedule")
endif()
