# check_exports.cmake: fails unless every strong function LIBRARY exports is a tensorpool_* C
# function (nothing of the static libraries inside leaks) and the C API is there.
# Usage: cmake -DLIBRARY=path -DNM=nm -P check_exports.cmake
cmake_minimum_required(VERSION 3.25)
execute_process(COMMAND ${NM} -D --defined-only ${LIBRARY} OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} failed on ${LIBRARY}")
endif()
string(REGEX MATCHALL "[0-9a-f]+ T [^\n]+" lines "${out}")
set(exported "")
foreach(line ${lines})
  string(REGEX REPLACE "^[0-9a-f]+ T " "" name "${line}")
  if(name MATCHES "^_(init|fini)$")
    continue()
  endif()
  if(NOT name MATCHES "^tensorpool_[a-z0-9_]+$")
    message(FATAL_ERROR "${LIBRARY} exports ${name}, which is not part of the C API")
  endif()
  list(APPEND exported ${name})
endforeach()
set(required tensorpool_create tensorpool_alloc tensorpool_free tensorpool_device_allocator
  tensorpool_stats_json tensorpool_dump_snapshot tensorpool_last_error tensorpool_sleep tensorpool_wake
  tensorpool_begin_capture tensorpool_end_capture tensorpool_release_graph tensorpool_graph_pools)
if(LIBRARY MATCHES "torch")
  list(APPEND required tensorpool_torch_malloc tensorpool_torch_free tensorpool_torch_init
    tensorpool_torch_reset tensorpool_torch_memory_fraction tensorpool_torch_record_stream
    tensorpool_torch_pool_bind tensorpool_torch_pool_malloc_0 tensorpool_torch_pool_malloc_15)
endif()
foreach(name ${required})
  if(NOT name IN_LIST exported)
    message(FATAL_ERROR "${LIBRARY} does not export ${name}")
  endif()
endforeach()
list(LENGTH exported n)
message(STATUS "${LIBRARY}: ${n} functions exported, all tensorpool_*")
