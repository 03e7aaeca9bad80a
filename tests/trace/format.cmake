# Tests of the native trace formats (src/trace/format*.cpp).
tensorpool_add_test(tensorpool_test_format
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_format.cpp
  LIBS tensorpool::trace)
