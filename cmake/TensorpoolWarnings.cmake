# Warning flags shared by every tensorpool target (not exported to users).
add_library(tensorpool_warnings INTERFACE)
target_compile_options(tensorpool_warnings INTERFACE
  $<$<CXX_COMPILER_ID:GNU,Clang>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion>)
