// testing/stream_api_ptsz.cpp: the _ptsz (per-thread default stream) exports of the test
// double: stream_api.cpp compiled again with CUDA_API_PER_THREAD_DEFAULT_STREAM defined.
#define TENSORPOOL_DOUBLE_PTSZ 1
#include "stream_api.cpp"
