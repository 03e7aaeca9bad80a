# The Python wheel's contents (pip install ., pyproject.toml; scikit-build-core sets SKBUILD):
# the CLI as tensorpool/bin/tensorpool, the C library and, with the CUDA toolkit,
# libtensorpool_torch.so beside the Python module (python/tensorpool, which pyproject.toml
# packages). The target tensorpool_wheel builds only these; install component `python`.
add_custom_target(tensorpool_wheel)
add_dependencies(tensorpool_wheel tensorpool_cli tensorpool_c)
install(TARGETS tensorpool_cli RUNTIME DESTINATION tensorpool/bin COMPONENT python)
install(TARGETS tensorpool_c LIBRARY DESTINATION tensorpool COMPONENT python)
if(TARGET tensorpool_torch)
  add_dependencies(tensorpool_wheel tensorpool_torch)
  install(TARGETS tensorpool_torch LIBRARY DESTINATION tensorpool COMPONENT python)
endif()
