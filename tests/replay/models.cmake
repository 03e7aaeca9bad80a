# Tests of the models of foreign allocators ("pytorch", "cub") and their validation against the
# real PyTorch snapshots in shared/traces (skipped with a warning when that folder is absent).
tensorpool_add_test(tensorpool_test_models
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_models.cpp ${CMAKE_CURRENT_LIST_DIR}/test_rmm_models.cpp
  LIBS tensorpool::replay
  LABELS replay)
