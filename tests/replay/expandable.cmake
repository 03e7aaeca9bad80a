# Tests of the "pytorch-expandable" model (PyTorch's caching allocator with expandable segments):
# its rules through the ReplayTarget interface, and its validation against the expandable-segments
# PyTorch snapshot in shared/traces (skipped with a warning when that folder is absent).
tensorpool_add_test(tensorpool_test_expandable
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_expandable.cpp
  LIBS tensorpool::replay
  LABELS replay)
