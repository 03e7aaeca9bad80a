# Tests of the pickle writer and the PyTorch-snapshot export (read back with the importer).
tensorpool_add_test(tensorpool_test_export
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_pytorch_export.cpp
  LIBS tensorpool::replay
  LABELS trace)
