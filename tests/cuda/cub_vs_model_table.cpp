// cub_vs_model_table.cpp: prints, as JSON, the real CUB allocator (on the CUDA-runtime test
// double) and the "cub" replay model replayed through each trace given, side by side: peak and
// final reserved bytes, cudaMalloc / cudaFree counts, synchronizations, OOMs. scripts/
// bench-tables.py turns it into the cub-model validation table of docs/benchmarks.md.
//
//   tensorpool_cub_vs_model_table TRACE... > cub-vs-model.json
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cub_vs_model.hpp"
#include "tensorpool/trace/load.hpp"

namespace {

nlohmann::json row(const tensorpool::replay::ReplayResult& r) {
  return {{"peak_reserved_bytes", r.peak_reserved}, {"final_reserved_bytes", r.final_reserved},
          {"mallocs", r.upstream.allocs},           {"frees", r.upstream.frees},
          {"syncs", r.upstream.syncs},              {"seeding_mallocs", r.seeding.allocs},
          {"ooms", r.ooms},                         {"events", r.events}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s TRACE...\n", argv[0]);
    return 2;
  }
  nlohmann::json out = {{"capacity_bytes", 80 * tensorpool::GiB}, {"traces", nlohmann::json::array()}};
  try {
    for (int i = 1; i < argc; ++i) {
      const auto c = tensorpool::cuda_replay::compare_cub_with_model(tensorpool::trace::load_trace(argv[i]),
                                                                     80 * tensorpool::GiB);
      out["traces"].push_back({{"trace", argv[i]}, {"real", row(c.real.total)}, {"model", row(c.model.total)}});
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  std::cout << out.dump(2) << "\n";
  return 0;
}
