// call_costs.cpp: per-call host cost on a real GPU of the upstream calls an allocator makes,
// at 2 MiB to 1 GiB: cudaMalloc, cudaFree, cudaMallocAsync / cudaFreeAsync (default pool, release
// threshold 0, so each call goes to the driver), cuMemCreate, cuMemMap, cuMemSetAccess,
// cuMemUnmap, cuMemRelease. Medians of REPS calls per size. Writes OUT/cost-model.txt (the format
// the simulated device reads: tensorpool/cost_model.hpp, `tensorpool replay --cost-model`) and
// OUT/call-costs.json. Also what a cudaMalloc of each of a few sizes holds on the device (the
// drop in cudaMemGetInfo's free memory, over 16 live allocations of the size, per allocation):
// the replay models charge whole 2 MiB pages from 2 MiB up and 512 B below
// (src/replay/models/cuda_malloc_rule.hpp, included here); OUT/malloc-footprint.json says
// whether the GPU agrees. Run by scripts/gpu/run.sh (from scripts/gpu-check.sh); built with -DTENSORPOOL_GPU_BENCH=ON.
//
//   call_costs OUT_DIR [REPS]
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "replay/models/cuda_malloc_rule.hpp"

namespace {

using Clock = std::chrono::steady_clock;

void die(const char* what, int code) {
  std::fprintf(stderr, "call_costs: %s failed (%d)\n", what, code);
  std::exit(1);
}
void rt(cudaError_t e, const char* what) { if (e != cudaSuccess) die(what, e); }
void drv(CUresult e, const char* what) { if (e != CUDA_SUCCESS) die(what, e); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

template <class F>
double ns(F&& f) {
  const auto t0 = Clock::now();
  f();
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

constexpr int kLive = 16;  // allocations of a size live at once in malloc_footprint()

// Device bytes one cudaMalloc of `bytes` holds: kLive live at once, from the drop in free memory.
double malloc_footprint(std::size_t bytes) {
  std::size_t free_before = 0, free_after = 0, total = 0;
  rt(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  rt(cudaMemGetInfo(&free_before, &total), "cudaMemGetInfo");
  std::vector<void*> live(kLive, nullptr);
  for (void*& p : live) rt(cudaMalloc(&p, bytes), "cudaMalloc");
  rt(cudaMemGetInfo(&free_after, &total), "cudaMemGetInfo");
  for (void* p : live) rt(cudaFree(p), "cudaFree");
  return static_cast<double>(free_before - free_after) / kLive;
}

void write_footprints(const std::string& out) {
  std::ofstream json(out + "/malloc-footprint.json");
  json << "{\"live_per_size\": " << kLive << ", \"sizes\": [";
  const std::size_t sizes[] = {512, 1000, 64 << 10, 1 << 20, (1 << 20) + 1, 2 << 20, (2 << 20) + 1, 3 << 20,
                               (10 << 20) + 1, (100 << 20) + 512};
  bool first = true;
  for (std::size_t bytes : sizes) {
    json << (first ? "" : ", ") << "{\"bytes\": " << bytes << ", \"device_bytes_each\": " << malloc_footprint(bytes)
         << ", \"model_bytes\": " << tensorpool::replay::model::cuda_malloc_bytes(bytes) << "}";
    first = false;
  }
  json << "]}\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR [REPS]\n", argv[0]);
    return 2;
  }
  const std::string out = argv[1];
  const int reps = argc > 2 ? std::atoi(argv[2]) : 11;
  rt(cudaSetDevice(0), "cudaSetDevice");
  rt(cudaFree(nullptr), "context creation");
  CUdevice dev = 0;
  drv(cuDeviceGet(&dev, 0), "cuDeviceGet");
  cudaStream_t stream = nullptr;
  rt(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaMemPool_t pool = nullptr;
  rt(cudaDeviceGetDefaultMemPool(&pool, 0), "cudaDeviceGetDefaultMemPool");
  std::uint64_t zero = 0;
  rt(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &zero), "release threshold");

  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  std::size_t gran = 0;
  drv(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "granularity");
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

  std::map<std::string, std::vector<std::pair<std::size_t, double>>> table;  // call -> (bytes, ns)
  for (std::size_t mib : {2, 8, 32, 128, 512, 1024}) {
    const std::size_t bytes = mib << 20;
    std::map<std::string, std::vector<double>> t;
    for (int r = 0; r < reps; ++r) {
      void* p = nullptr;
      t["segment_alloc"].push_back(ns([&] { rt(cudaMalloc(&p, bytes), "cudaMalloc"); }));
      t["segment_free"].push_back(ns([&] { rt(cudaFree(p), "cudaFree"); }));
      t["malloc_async"].push_back(ns([&] { rt(cudaMallocAsync(&p, bytes, stream), "cudaMallocAsync"); }));
      t["free_async"].push_back(ns([&] { rt(cudaFreeAsync(p, stream), "cudaFreeAsync"); }));
      rt(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      const std::size_t vbytes = (bytes + gran - 1) / gran * gran;
      CUdeviceptr va = 0;
      drv(cuMemAddressReserve(&va, vbytes, 0, 0, 0), "cuMemAddressReserve");
      CUmemGenericAllocationHandle h = 0;
      t["physical_create"].push_back(ns([&] { drv(cuMemCreate(&h, vbytes, &prop, 0), "cuMemCreate"); }));
      t["map_only"].push_back(ns([&] { drv(cuMemMap(va, vbytes, 0, h, 0), "cuMemMap"); }));
      t["set_access"].push_back(ns([&] { drv(cuMemSetAccess(va, vbytes, &access, 1), "cuMemSetAccess"); }));
      t["unmap"].push_back(ns([&] { drv(cuMemUnmap(va, vbytes), "cuMemUnmap"); }));
      t["physical_release"].push_back(ns([&] { drv(cuMemRelease(h), "cuMemRelease"); }));
      drv(cuMemAddressFree(va, vbytes), "cuMemAddressFree");
    }
    // The simulated device charges map + set access as one call ("map").
    for (std::size_t i = 0; i < t["map_only"].size(); ++i) t["map"].push_back(t["map_only"][i] + t["set_access"][i]);
    for (auto& [call, v] : t) table[call].emplace_back(bytes, median(v));
  }

  std::ofstream model(out + "/cost-model.txt");
  model << "# tensorpool cost model v1: medians of " << reps << " calls on GPU 0, measured by cuda/gpu/call_costs.cpp\n";
  std::ofstream json(out + "/call-costs.json");
  json << "{\"reps\": " << reps << ", \"calls\": {";
  bool first_call = true;
  for (const auto& [call, points] : table) {
    json << (first_call ? "" : ", ") << "\"" << call << "\": [";
    first_call = false;
    for (std::size_t i = 0; i < points.size(); ++i) {
      json << (i ? ", " : "") << "{\"bytes\": " << points[i].first << ", \"median_ns\": " << points[i].second << "}";
      if (call != "map_only" && call != "set_access")
        model << call << " " << points[i].first << " " << static_cast<unsigned long long>(points[i].second) << "\n";
    }
    json << "]";
  }
  json << "}}\n";
  write_footprints(out);
  std::printf("call_costs: wrote %s/cost-model.txt, call-costs.json and malloc-footprint.json\n", out.c_str());
  return 0;
}
