# cuda/torch/torch_double.cmake (included by cuda/CMakeLists.txt with the test double): the
# registry and the PyTorch library on the CUDA-runtime test double, for tests (no GPU, no
# libcudart/libcuda).
#
#   tensorpool_registry_on_double  tensorpool::registry over the double (C++ tests)
#   tensorpool_torch_double        libtensorpool_torch_double.so: libtensorpool_torch.so over the
#                                  double, plus tensorpool_testing_* (testing_control.cpp) to
#                                  drive the double from a test that dlopen()s it
add_library(tensorpool_registry_on_double STATIC $<TARGET_OBJECTS:tensorpool_registry_objects>)
target_link_libraries(tensorpool_registry_on_double PUBLIC tensorpool tensorpool_trace
  tensorpool_record tensorpool_cuda_on_double PRIVATE fmt::fmt spdlog::spdlog)

add_library(tensorpool_torch_testing_objects OBJECT ${CMAKE_CURRENT_LIST_DIR}/testing_control.cpp)
target_link_libraries(tensorpool_torch_testing_objects PRIVATE tensorpool_cuda_double
  $<BUILD_INTERFACE:tensorpool_warnings>)
set_target_properties(tensorpool_torch_testing_objects PROPERTIES
  CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)

tensorpool_torch_library(tensorpool_torch_double tensorpool_cuda_on_double
  $<TARGET_OBJECTS:tensorpool_torch_testing_objects>)
