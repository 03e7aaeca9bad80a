# The pickle reader and the importers of foreign traces (PyTorch memory snapshots, RMM logs).
target_sources(tensorpool_trace PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/pickle.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pytorch_snapshot_reader.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pytorch_snapshot_convert.cpp
  ${CMAKE_CURRENT_LIST_DIR}/empty_cache.cpp
  ${CMAKE_CURRENT_LIST_DIR}/rmm_log.cpp
  ${CMAKE_CURRENT_LIST_DIR}/rmm_log_writer.cpp
)
