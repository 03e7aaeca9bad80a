# tests/capi/records_from_env.cmake: runs the C API workload (PROGRAM) with TENSORPOOL_TRACE set
# and no other change, then checks that `tensorpool info` (CLI) reads the recording: a complete
# file (no .partial left), from the recorder, holding the workload's allocator (device 0), the
# registry's (device 3) and the sleep-and-wake allocator (another of device 0: trace device 256,
# the first duplicate; the graph-capture allocator, another of device 0: trace device 258) with
# their allocations, OOMs, record_stream and empty_cache calls.
#   cmake -DPROGRAM=... -DCLI=... -DDIR=... -P records_from_env.cmake
file(REMOVE_RECURSE ${DIR})
file(MAKE_DIRECTORY ${DIR})
set(_trace ${DIR}/c_api.tptrace)

execute_process(
  COMMAND ${CMAKE_COMMAND} -E env TENSORPOOL_TRACE=${_trace} TENSORPOOL_LOG_LEVEL=off
          ${PROGRAM} ${DIR}/c_api.pickle
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "the C API workload failed under TENSORPOOL_TRACE (${_rc}):\n${_out}${_err}")
endif()
file(GLOB _partial ${DIR}/*.partial)
if(NOT EXISTS ${_trace} OR _partial)
  message(FATAL_ERROR "expected the complete recording ${_trace} and no partial file; found: "
                      "exists=${EXISTS_TRACE} partial=${_partial}")
endif()

execute_process(COMMAND ${CLI} info ${_trace} --json
  RESULT_VARIABLE _rc OUTPUT_VARIABLE _json ERROR_VARIABLE _err)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "tensorpool info could not read the recording (${_rc}): ${_err}")
endif()

function(expect what actual expected)
  if(NOT "${actual}" STREQUAL "${expected}")
    message(FATAL_ERROR "${what}: expected ${expected}, got ${actual}\n${_json}")
  endif()
endfunction()

string(JSON _source GET "${_json}" source)
expect("source" "${_source}" "tensorpool-recording")
string(JSON _devices GET "${_json}" devices)
string(REGEX REPLACE "[ \n\t]" "" _devices "${_devices}")
expect("devices" "${_devices}" "[0,3,256,258,259]")
# 16 allocations on device 0 (its zero-byte request makes no block), 4 on device 256, 1 on
# device 3, 1 on device 258 (the graph pool's range: its blocks are not events) and 19 on device
# 259 (steps(): a block that stays, then 6 steps of 3); one OOM each (device 0's memory
# fraction, device 3's memory_limit); one empty_cache call each.
string(JSON _allocs GET "${_json}" ops alloc)
expect("alloc events" "${_allocs}" "41")
string(JSON _ooms GET "${_json}" ops oom)
expect("oom events" "${_ooms}" "2")
string(JSON _record_stream GET "${_json}" ops record_stream)
expect("record_stream events" "${_record_stream}" "1")
string(JSON _empty_cache GET "${_json}" ops empty_cache)
expect("empty_cache events" "${_empty_cache}" "2")
message(STATUS "tensorpool info read the recording: ${_allocs} allocations on devices ${_devices}")
