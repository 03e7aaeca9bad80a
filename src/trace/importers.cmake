# The pickle reader and the importers of foreign traces (PyTorch memory snapshots, RMM logs).
target_sources(tensorpool_trace PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/pickle.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pytorch_snapshot.cpp
  ${CMAKE_CURRENT_LIST_DIR}/rmm_log.cpp
  ${CMAKE_CURRENT_LIST_DIR}/rmm_log_writer.cpp
)
