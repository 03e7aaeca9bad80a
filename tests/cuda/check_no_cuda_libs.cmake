# tests/cuda/check_no_cuda_libs.cmake: fails when BINARY needs libcudart or libcuda at run time
# (the tests on the test double must run on machines without CUDA); with -DALLOW_CUDART=ON only
# libcuda (the driver) is refused.
#   cmake -DBINARY=path/to/test [-DALLOW_CUDART=ON] -P check_no_cuda_libs.cmake
execute_process(COMMAND ldd ${BINARY} OUTPUT_VARIABLE _deps RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  message(FATAL_ERROR "ldd ${BINARY} failed (${_rc})")
endif()
set(_refused "libcuda(rt)?\\.so")
if(ALLOW_CUDART)
  set(_refused "libcuda\\.so")
endif()
if(_deps MATCHES "${_refused}")
  message(FATAL_ERROR "${BINARY} needs the CUDA libraries:\n${_deps}")
endif()
message(STATUS "${BINARY}: none of ${_refused} needed")
