# cuda/torch/torch.cmake (included by cuda/CMakeLists.txt once tensorpool::cuda exists): the
# registry and C API with the CUDA backend kinds, and libtensorpool_torch.so, the library
# PyTorch's CUDAPluggableAllocator loads (built without PyTorch's headers).
#
#   tensorpool_torch_objects  the pluggable-allocator functions (torch_allocator.cpp)
#   tensorpool_torch          libtensorpool_torch.so: those + the registry + the C API, on the
#                             real CUDA runtime; exports only the tensorpool_* C functions
target_compile_definitions(tensorpool_registry_objects PRIVATE TENSORPOOL_WITH_CUDA=1)
target_link_libraries(tensorpool_registry PUBLIC tensorpool_cuda)
target_link_libraries(tensorpool_c PRIVATE tensorpool_cuda)

add_library(tensorpool_torch_objects OBJECT ${CMAKE_CURRENT_LIST_DIR}/torch_allocator.cpp)
target_include_directories(tensorpool_torch_objects PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_include_directories(tensorpool_torch_objects SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
target_link_libraries(tensorpool_torch_objects PRIVATE tensorpool fmt::fmt
  $<BUILD_INTERFACE:tensorpool_warnings>)
set_target_properties(tensorpool_torch_objects PROPERTIES
  CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)

# tensorpool_torch_library(NAME CUDA_LIBRARY [EXTRA_OBJECTS...]): the PyTorch library over one
# flavour of the CUDA backends (the real runtime, or the test double).
function(tensorpool_torch_library name cuda_library)
  add_library(${name} SHARED $<TARGET_OBJECTS:tensorpool_torch_objects>
    $<TARGET_OBJECTS:tensorpool_registry_objects> ${ARGN})
  target_link_libraries(${name} PRIVATE ${cuda_library} tensorpool tensorpool_trace tensorpool_record
    fmt::fmt spdlog::spdlog)
  target_link_options(${name} PRIVATE LINKER:--exclude-libs,ALL ${TENSORPOOL_SHARED_NO_UNDEFINED})
endfunction()

tensorpool_torch_library(tensorpool_torch tensorpool_cuda)
if(TENSORPOOL_INSTALL)
  install(TARGETS tensorpool_torch LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  # The Python module beside it (PYTHONPATH=PREFIX/share/tensorpool/python).
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/python/tensorpool
    DESTINATION ${CMAKE_INSTALL_DATADIR}/tensorpool/python PATTERN __pycache__ EXCLUDE)
endif()
