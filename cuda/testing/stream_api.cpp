// testing/stream_api.cpp: the test double's stream-ordered runtime functions.
//
// Compiled twice: once plain, once with TENSORPOOL_DOUBLE_PTSZ, which defines
// CUDA_API_PER_THREAD_DEFAULT_STREAM before the CUDA headers. The headers then rename every
// function below to its _ptsz name, so the same definitions export both symbol sets, each
// checked against the header's own declaration. In the _ptsz set, stream 0 is the calling
// thread's per-thread default stream.
#ifdef TENSORPOOL_DOUBLE_PTSZ
#define CUDA_API_PER_THREAD_DEFAULT_STREAM 1
#endif

#include "testing/state.hpp"

// The exported name after the headers' renaming, e.g. "cudaEventRecord_ptsz".
#define TP_NAME_(f) #f
#define TP_NAME(f) TP_NAME_(f)

using namespace tensorpool::cuda_double::detail;

namespace {
#ifdef TENSORPOOL_DOUBLE_PTSZ
constexpr bool kPerThreadApi = true;
#else
constexpr bool kPerThreadApi = false;
#endif
}  // namespace

extern "C" {

cudaError_t CUDARTAPI cudaMallocFromPoolAsync(void** ptr, size_t size, cudaMemPool_t pool,
                                              cudaStream_t stream) {
  return runtime_call(TP_NAME(cudaMallocFromPoolAsync), [&](State& s) {
    return malloc_from_pool(s, ptr, size, pool, stream, kPerThreadApi);
  });
}

cudaError_t CUDARTAPI cudaFreeAsync(void* ptr, cudaStream_t stream) {
  return runtime_call(TP_NAME(cudaFreeAsync),
                      [&](State& s) { return free_async(s, ptr, stream, kPerThreadApi); });
}

cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  return runtime_call(TP_NAME(cudaEventRecord),
                      [&](State& s) { return event_record(s, event, stream, kPerThreadApi); });
}

cudaError_t CUDARTAPI cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  return runtime_call(TP_NAME(cudaStreamWaitEvent),
                      [&](State& s) { return stream_wait_event(s, stream, event, kPerThreadApi); });
}

cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t stream) {
  return runtime_call(TP_NAME(cudaStreamSynchronize),
                      [&](State& s) { return stream_synchronize(s, stream, kPerThreadApi); });
}

}  // extern "C"
