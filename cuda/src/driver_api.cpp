// driver_api.cpp: the lookup of driver_api.hpp's entry points through the CUDA runtime.
#include "driver_api.hpp"

#include <cuda_runtime_api.h>

#include <string>

#include "tensorpool/errors.hpp"

namespace tensorpool::cuda_detail {

namespace {

// The function `symbol` of the driver, in the version of the cuda.h compiled against.
template <typename Fn>
void look_up(Fn& fn, const char* symbol) {
  void* found = nullptr;
  cudaDriverEntryPointQueryResult result = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &found, CUDA_VERSION, cudaEnableDefault, &result);
  if (err != cudaSuccess || result != cudaDriverEntryPointSuccess || found == nullptr) {
    (void)cudaGetLastError();  // reported here; must not resurface on a later call
    const std::string why = err != cudaSuccess ? std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err)
                            : result == cudaDriverEntryPointVersionNotSufficent
                                ? std::string("the driver is older than CUDA ") + std::to_string(CUDA_VERSION / 1000) +
                                      "." + std::to_string(CUDA_VERSION % 1000 / 10)
                                : std::string("the driver has no such function");
    throw DeviceError(std::string("the CUDA driver API is not available (") + symbol + ": " + why +
                      "); a real device needs an NVIDIA driver (libcuda.so.1)");
  }
  fn = reinterpret_cast<Fn>(found);
}

DriverApi load() {
  DriverApi api{};
#define TP_LOOK_UP(member, symbol) look_up(api.member, #symbol);
  TP_DRIVER_FUNCTIONS(TP_LOOK_UP)
#undef TP_LOOK_UP
  return api;
}

}  // namespace

const DriverApi& driver() {
  static const DriverApi api = load();  // a throw leaves it unset: the next call tries again
  return api;
}

}  // namespace tensorpool::cuda_detail
