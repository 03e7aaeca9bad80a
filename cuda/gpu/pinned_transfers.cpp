// pinned_transfers.cpp: host-to-device staging on a real GPU, three ways, at 1, 16 and 256 MiB:
//   cached   pinned blocks from tensorpool::Allocator over CudaPinnedHostBackend (the block is
//            cached after its first use: an allocate + free pair never reaches the driver);
//   fresh    cudaHostAlloc + cudaFreeHost around every copy;
//   pageable malloc'ed (and touched) host memory.
// Medians of REPS: the host cost of getting the buffer (and giving it back) and the bandwidth of
// a cudaMemcpyAsync to the device (GB/s, synchronized). One JSON object on stdout.
//
//   pinned_transfers [REPS]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tensorpool/allocator.hpp"
#include "tensorpool/cuda/backends.hpp"
#include "tensorpool/cuda/interop.hpp"

namespace {

using Clock = std::chrono::steady_clock;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "pinned_transfers: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double since(Clock::time_point t0) { return std::chrono::duration<double, std::nano>(Clock::now() - t0).count(); }

}  // namespace

int main(int argc, char** argv) {
  using namespace tensorpool;
  const int reps = argc > 1 ? std::atoi(argv[1]) : 9;
  check(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  Allocator pinned(make_cuda_backend(CudaBackendKind::pinned_host, 0), Config{});
  std::printf("{\"reps\": %d, \"rows\": [", reps);
  bool first = true;
  for (std::size_t mib : {1, 16, 256}) {
    const std::size_t bytes = mib << 20;
    void* dev = nullptr;
    check(cudaMalloc(&dev, bytes), "cudaMalloc");
    for (const char* how : {"cached", "fresh", "pageable"}) {
      std::vector<double> get_ns, copy_gbps;
      for (int r = 0; r < reps + 1; ++r) {  // the first round warms the cache and the driver
        const auto t0 = Clock::now();
        void* host = nullptr;
        if (!std::strcmp(how, "cached")) host = pinned.allocate(bytes, to_stream(stream));
        else if (!std::strcmp(how, "fresh")) check(cudaHostAlloc(&host, bytes, cudaHostAllocDefault), "cudaHostAlloc");
        else host = std::malloc(bytes);
        double got = since(t0);
        std::memset(host, r, bytes);
        const auto c0 = Clock::now();
        check(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
        check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        const double copy_ns = since(c0);
        const auto f0 = Clock::now();
        if (!std::strcmp(how, "cached")) pinned.deallocate(host);
        else if (!std::strcmp(how, "fresh")) check(cudaFreeHost(host), "cudaFreeHost");
        else std::free(host);
        got += since(f0);
        if (r == 0) continue;
        get_ns.push_back(got);
        copy_gbps.push_back(static_cast<double>(bytes) / copy_ns);
      }
      std::printf("%s{\"mib\": %zu, \"how\": \"%s\", \"alloc_free_ns\": %.0f, \"h2d_gb_per_s\": %.2f}",
                  first ? "" : ", ", mib, how, median(get_ns), median(copy_gbps));
      first = false;
    }
    check(cudaFree(dev), "cudaFree");
  }
  std::printf("]}\n");
  pinned.empty_cache();
  cudaStreamDestroy(stream);
  return 0;
}
