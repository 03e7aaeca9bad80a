# Tests of the native trace formats (src/trace/format*.cpp), load(), summarize() and the RMM log
# writer.
tensorpool_add_test(tensorpool_test_format
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_format.cpp ${CMAKE_CURRENT_LIST_DIR}/test_summary.cpp
          ${CMAKE_CURRENT_LIST_DIR}/test_truncated.cpp ${CMAKE_CURRENT_LIST_DIR}/test_rmm_log_writer.cpp
  LIBS tensorpool::trace)
