# The native trace formats (binary .tptrace and JSON lines): reader, writer, conversions.
if(NOT TARGET nlohmann_json::nlohmann_json)
  find_package(nlohmann_json 3.11 REQUIRED)
endif()
target_sources(tensorpool_trace PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/format.cpp
  ${CMAKE_CURRENT_LIST_DIR}/format_io.cpp
  ${CMAKE_CURRENT_LIST_DIR}/binary_format.cpp
  ${CMAKE_CURRENT_LIST_DIR}/jsonl_format.cpp)
# Header-only and used only inside the .cpp files: a build-time dependency, nothing to export.
target_link_libraries(tensorpool_trace PRIVATE $<BUILD_INTERFACE:nlohmann_json::nlohmann_json>)
