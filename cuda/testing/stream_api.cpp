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

#include <cuda.h>

#include <map>
#include <string_view>

#include "src/driver_api.hpp"
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

cudaError_t CUDARTAPI cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  return runtime_call(TP_NAME(cudaMemcpy), [&](State& s) { return memcpy_sync(s, dst, src, count, kind); });
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

cudaError_t CUDARTAPI cudaStreamQuery(cudaStream_t stream) {
  return runtime_call(TP_NAME(cudaStreamQuery), [&](State& s) { return stream_query(s, stream, kPerThreadApi); });
}

cudaError_t CUDARTAPI cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  return runtime_call(TP_NAME(cudaStreamBeginCapture),
                      [&](State& s) { return begin_capture(s, stream, mode, kPerThreadApi); });
}

cudaError_t CUDARTAPI cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  return runtime_call(TP_NAME(cudaStreamEndCapture),
                      [&](State& s) { return end_capture(s, stream, graph, kPerThreadApi); });
}

cudaError_t CUDARTAPI cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  return runtime_call(TP_NAME(cudaStreamIsCapturing),
                      [&](State& s) { return is_capturing(s, stream, status, kPerThreadApi); });
}

// The double's own driver functions (driver_api.cpp) by name, those the backends look up
// (TP_DRIVER_FUNCTIONS); a driver older than `cuda_version`
// (Options::driver_version) has none of them. Here because the headers rename it under
// CUDA_API_PER_THREAD_DEFAULT_STREAM (one call name for both: the faults of fail_nth).
cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int cuda_version,
                                                       unsigned long long, cudaDriverEntryPointQueryResult* status) {
  return runtime_call("cudaGetDriverEntryPointByVersion", [&](State& s) {
    if (symbol == nullptr || fn == nullptr) return cudaErrorInvalidValue;
    static const std::map<std::string_view, void*> functions = {
#define TP_DOUBLE_ENTRY(member, symbol) {#symbol, reinterpret_cast<void*>(&symbol)},
        TP_DRIVER_FUNCTIONS(TP_DOUBLE_ENTRY)
#undef TP_DOUBLE_ENTRY
    };
    *fn = nullptr;
    cudaDriverEntryPointQueryResult result = cudaDriverEntryPointSuccess;
    if (static_cast<int>(cuda_version) > s.options.driver_version) {
      result = cudaDriverEntryPointVersionNotSufficent;
    } else if (auto it = functions.find(symbol); it != functions.end()) {
      *fn = it->second;
    } else {
      result = cudaDriverEntryPointSymbolNotFound;
    }
    if (status != nullptr) *status = result;
    return cudaSuccess;
  });
}

}  // extern "C"
