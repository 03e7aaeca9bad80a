# The writers of foreign formats: plain-data pickles and PyTorch memory snapshots.
target_sources(tensorpool_trace PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/pickle_writer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pytorch_export.cpp
)
# settings_from_conf() reads the allocator's settings with the core's one key:value reader.
target_link_libraries(tensorpool_trace PRIVATE tensorpool)
