# Tests of the pickle reader and the PyTorch-snapshot / RMM-log importers. Their fixtures are
# generated at build time by make_fixtures.py (python3 is needed to build the tests, never to run
# the library) into the build tree; the directory reaches the tests as TENSORPOOL_IMPORTER_FIXTURES.
find_package(Python3 COMPONENTS Interpreter)
if(NOT Python3_Interpreter_FOUND)
  message(WARNING "python3 not found: tensorpool_test_importers is not built")
  return()
endif()

set(_tp_fixture_dir ${CMAKE_CURRENT_BINARY_DIR}/importer_fixtures)
add_custom_command(
  OUTPUT ${_tp_fixture_dir}/fixtures.stamp
  COMMAND Python3::Interpreter ${CMAKE_CURRENT_LIST_DIR}/make_fixtures.py ${_tp_fixture_dir}
  DEPENDS ${CMAKE_CURRENT_LIST_DIR}/make_fixtures.py
  COMMENT "Generating the pickle and RMM-log fixtures"
  VERBATIM)
add_custom_target(tensorpool_importer_fixtures DEPENDS ${_tp_fixture_dir}/fixtures.stamp)

tensorpool_add_test(tensorpool_test_importers
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/test_pickle.cpp
    ${CMAKE_CURRENT_LIST_DIR}/test_pytorch_snapshot.cpp
    ${CMAKE_CURRENT_LIST_DIR}/test_rmm_log.cpp
  LIBS tensorpool::trace)
add_dependencies(tensorpool_test_importers tensorpool_importer_fixtures)
target_compile_definitions(tensorpool_test_importers PRIVATE
  TENSORPOOL_IMPORTER_FIXTURES="${_tp_fixture_dir}")

# The empty_cache() calls of a recorded run: found, imported, stored and replayed.
tensorpool_add_test(tensorpool_test_empty_cache
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_empty_cache.cpp
  LIBS tensorpool::replay)
add_dependencies(tensorpool_test_empty_cache tensorpool_importer_fixtures)
target_compile_definitions(tensorpool_test_empty_cache PRIVATE
  TENSORPOOL_IMPORTER_FIXTURES="${_tp_fixture_dir}")
