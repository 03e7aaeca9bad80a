# install() rules and the find_package(tensorpool) config files.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/tensorpool DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_BINARY_DIR}/generated/include/tensorpool/version.hpp
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tensorpool)
set(_tp_targets tensorpool_headers tensorpool)
foreach(_t tensorpool_trace tensorpool_workload tensorpool_replay tensorpool_record tensorpool_registry tensorpool_cuda)
  if(TARGET ${_t})
    list(APPEND _tp_targets ${_t})
  endif()
endforeach()
install(TARGETS ${_tp_targets} EXPORT tensorpoolTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT tensorpoolTargets NAMESPACE tensorpool:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tensorpool)

# The package config finds CUDAToolkit again only when tensorpool::cuda was built and installed.
if(TARGET tensorpool_cuda)
  set(TENSORPOOL_INSTALLED_CUDA ON)
else()
  set(TENSORPOOL_INSTALLED_CUDA OFF)
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/tensorpoolConfig.cmake.in
  ${PROJECT_BINARY_DIR}/tensorpoolConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tensorpool)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/tensorpoolConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/tensorpoolConfig.cmake ${PROJECT_BINARY_DIR}/tensorpoolConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/tensorpool)
