# Tests of the native trace formats (src/trace/format*.cpp), load() and summarize().
tensorpool_add_test(tensorpool_test_format
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_format.cpp ${CMAKE_CURRENT_LIST_DIR}/test_summary.cpp
  LIBS tensorpool::trace)
