/* tensorpool/cuda/torch_allocator.h: the functions libtensorpool_torch.so exports for PyTorch's
 * pluggable CUDA allocator (torch/csrc/cuda/CUDAPluggableAllocator.h), with PyTorch's exact
 * signatures. The library is built without PyTorch's headers; it allocates from tensorpool's
 * per-device registry (tensorpool/registry.hpp), configured by TENSORPOOL_CONF.
 *
 * From Python (what tensorpool.install() does):
 *   a = torch.cuda.memory.CUDAPluggableAllocator(path, "tensorpool_torch_malloc",
 *                                               "tensorpool_torch_free")
 *   torch.cuda.memory.change_current_allocator(a)
 * From C++, the hooks can be set too (Python's CUDAPluggableAllocator cannot set them):
 *   set_init_fn(tensorpool_torch_init), set_reset_fn(tensorpool_torch_reset),
 *   set_memory_fraction_fn(tensorpool_torch_memory_fraction),
 *   set_record_stream_fn(tensorpool_torch_record_stream).
 * See docs/pytorch.md. None of these functions throws; failures are logged. */
#ifndef TENSORPOOL_CUDA_TORCH_ALLOCATOR_H
#define TENSORPOOL_CUDA_TORCH_ALLOCATOR_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#include "tensorpool/tensorpool.h"

#ifdef __cplusplus
extern "C" {
#endif

/* alloc_fn: std::function<void*(size_t, int, cudaStream_t)>. nullptr on OOM, after logging
 * tensorpool's explanation (requested, reserved, allocated, largest free block, free cached
 * bytes per stream) at warning level; also the calling thread's tensorpool_last_error(). */
TENSORPOOL_API void* tensorpool_torch_malloc(size_t size, int device, cudaStream_t stream);
/* free_fn: std::function<void(void*, size_t, int, cudaStream_t)>. `size` and `stream` are the
 * allocation's; tensorpool knows both already. */
TENSORPOOL_API void tensorpool_torch_free(void* ptr, size_t size, int device, cudaStream_t stream);
/* init_fn: std::function<void(int)>. Checks the settings (TENSORPOOL_CONF) and logs a bad key;
 * allocators are created lazily, per device, on first use. */
TENSORPOOL_API void tensorpool_torch_init(int device_count);
/* reset_fn: std::function<void()>, called by torch.cuda.empty_cache(): empty_cache() on every
 * device allocator. */
TENSORPOOL_API void tensorpool_torch_reset(void);
/* memory_fraction_fn: std::function<void(double, int)>: caps the device's reserved memory. */
TENSORPOOL_API void tensorpool_torch_memory_fraction(double fraction, int device);
/* record_stream_fn: std::function<void(void*, cudaStream_t)>: the block is used on `stream`. */
TENSORPOOL_API void tensorpool_torch_record_stream(void* ptr, cudaStream_t stream);

/* torch.cuda.MemPool allocators (tensorpool.mem_pool() in Python): a MemPool's allocator is a
 * CUDAPluggableAllocator of one of TENSORPOOL_TORCH_POOL_SLOTS malloc functions,
 * tensorpool_torch_pool_malloc_<slot> (with tensorpool_torch_free), each of which allocates under
 * the tag bound to its slot, so that tensorpool_sleep(tag) puts the pool's segments to sleep.
 * tensorpool_torch_pool_bind gives the slot of `tag` (NULL: untagged), binding a new one the
 * first time; a slot stays bound for the life of the process. More distinct tags than slots:
 * TENSORPOOL_ERROR_USAGE. */
#define TENSORPOOL_TORCH_POOL_SLOTS 16
/* X(k) for every slot k (the declarations below, and the definitions in the library). */
#define TENSORPOOL_TORCH_EACH_POOL_SLOT(X) \
  X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)
TENSORPOOL_API tensorpool_status tensorpool_torch_pool_bind(const char* tag, int* slot);
#define TENSORPOOL_TORCH_POOL_MALLOC_DECL(k) \
  TENSORPOOL_API void* tensorpool_torch_pool_malloc_##k(size_t size, int device, cudaStream_t stream);
TENSORPOOL_TORCH_EACH_POOL_SLOT(TENSORPOOL_TORCH_POOL_MALLOC_DECL)
#undef TENSORPOOL_TORCH_POOL_MALLOC_DECL

#ifdef __cplusplus
}
#endif

#endif /* TENSORPOOL_CUDA_TORCH_ALLOCATOR_H */
