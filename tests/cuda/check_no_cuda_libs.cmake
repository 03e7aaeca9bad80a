# tests/cuda/check_no_cuda_libs.cmake: fails when BINARY needs libcudart or libcuda at run time
# (the tests on the test double must run on machines without CUDA).
#   cmake -DBINARY=path/to/test -P check_no_cuda_libs.cmake
execute_process(COMMAND ldd ${BINARY} OUTPUT_VARIABLE _deps RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "ldd ${BINARY} failed (${_rc})")
endif()
if(_deps MATCHES "libcuda(rt)?\\.so")
  message(FATAL_ERROR "${BINARY} needs the CUDA libraries:\n${_deps}")
endif()
message(STATUS "${BINARY}: no libcudart/libcuda dependency")
