// cub_real_conformance.cpp: the replay-target conformance suite (tests/replay/test_conformance.cpp,
// compiled into this binary too) run against "cub-real", the real CUB CachingDeviceAllocator on
// the CUDA-runtime test double: what the suite asks of every registered target, asked of the
// allocator the "cub" model stands for. Each check and replay starts from a reset double.
#include "cub_vs_model.hpp"
#include "replay/conformance.hpp"

namespace tensorpool::replay::testing {

std::vector<ConformanceTarget> conformance_targets() {
  ConformanceTarget t;
  t.descriptor = cuda_replay::real_cub_descriptor();
  t.make = [](const TargetOptions& o) {
    return cuda_replay::make_real_cub_target(o, cuda_replay::double_probes());
  };
  t.prepare = [](std::size_t capacity) { cuda_replay::reset_double_for_cub(6, capacity); };
  return {t};
}

}  // namespace tensorpool::replay::testing
