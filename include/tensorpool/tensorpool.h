/* tensorpool/tensorpool.h: the C API of tensorpool, for C and any language with a C FFI.
 *
 * C99; no C++ types cross it and no exception escapes it. Every function returns a
 * tensorpool_status; on failure the calling thread's last-error message says what went wrong
 * (tensorpool_last_error()). Misuse (a double free, a pointer the allocator did not hand out)
 * returns TENSORPOOL_ERROR_USAGE and leaves the allocator's state untouched.
 *
 *   tensorpool_allocator* a;
 *   if (tensorpool_create(TENSORPOOL_BACKEND_SIMULATED, 0, 0, "max_split_size:256MiB", &a))
 *     fprintf(stderr, "%s\n", tensorpool_last_error());
 *   void* p;
 *   tensorpool_alloc(a, 64 << 20, 0, &p);
 *   tensorpool_free(a, p);
 *   tensorpool_destroy(a);
 *
 * Two ways to get an allocator:
 *  - tensorpool_create(): one you own (destroy it with tensorpool_destroy()); any backend;
 *  - tensorpool_device_allocator(): the process-wide one of a device, created on first use from
 *    TENSORPOOL_CONF (or tensorpool_configure()), whose "backend" key picks the backend
 *    (async, malloc, vmm or simulated; default async). It lives until the process exits and
 *    is what libtensorpool_torch.so allocates from.
 *
 * Every allocator of either kind is recorded into a trace file when TENSORPOOL_TRACE is set
 * (docs/recording.md), and annotated for Nsight / Compute Sanitizer by the nvtx and nvtx_mem
 * settings keys in builds with the CUDA toolkit (refused, TENSORPOOL_ERROR_CONFIG, without it).
 *
 * Streams are cudaStream_t values cast to tensorpool_stream (0: the default stream) on the CUDA
 * backends; on the simulated backend they come from tensorpool_create_stream().
 * Thread safety: every function may be called from any thread.
 * Link: libtensorpool_c.so (or libtensorpool_torch.so, which contains the same API). */
#ifndef TENSORPOOL_TENSORPOOL_H
#define TENSORPOOL_TENSORPOOL_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) || defined(__clang__)
#define TENSORPOOL_API __attribute__((visibility("default")))
#else
#define TENSORPOOL_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define TENSORPOOL_C_API_VERSION 4 /* 2: sleep, wake and tags; 3: CUDA graph pools; 4: steps */

typedef enum tensorpool_status {
  TENSORPOOL_OK = 0,
  TENSORPOOL_ERROR_INVALID_ARGUMENT = 1, /* a null handle or pointer, a number out of range */
  TENSORPOOL_ERROR_CONFIG = 2,           /* a bad setting; the message names the key */
  TENSORPOOL_ERROR_OUT_OF_MEMORY = 3,    /* the message explains the OOM */
  TENSORPOOL_ERROR_USAGE = 4,            /* double free, foreign pointer, wrong call order */
  TENSORPOOL_ERROR_DEVICE = 5,           /* the device backend failed */
  TENSORPOOL_ERROR_UNAVAILABLE = 6,      /* the backend kind is not built into this library */
  TENSORPOOL_ERROR_IO = 7,               /* a file could not be written */
  TENSORPOOL_ERROR_INTERNAL = 8          /* an invariant broke, or an unexpected failure */
} tensorpool_status;

typedef enum tensorpool_backend {
  TENSORPOOL_BACKEND_SIMULATED = 0,  /* bookkeeping only (no GPU): work completes at once */
  TENSORPOOL_BACKEND_CUDA_ASYNC = 1, /* cudaMallocFromPoolAsync on a dedicated pool */
  TENSORPOOL_BACKEND_CUDA_MALLOC = 2,
  TENSORPOOL_BACKEND_CUDA_VMM = 3,   /* driver virtual memory (cuMemCreate / cuMemMap) */
  /* Not a backend. It makes every int a value of the type in C++ too, so that a kind a C caller
   * made up is refused with TENSORPOOL_ERROR_INVALID_ARGUMENT instead of being undefined. */
  TENSORPOOL_BACKEND_INT_RANGE_ = 0x7fffffff
} tensorpool_backend;

typedef struct tensorpool_allocator tensorpool_allocator; /* opaque */
typedef uint64_t tensorpool_stream;

/* One tracked quantity (as in PyTorch's memory_stats): now, peak since the last reset, and
 * the cumulative increase and decrease. */
typedef struct tensorpool_stat {
  int64_t current;
  int64_t peak;
  int64_t allocated;
  int64_t freed;
} tensorpool_stat;

typedef struct tensorpool_pool_stats {
  tensorpool_stat allocated_bytes; /* blocks handed out, rounded sizes */
  tensorpool_stat requested_bytes; /* the sizes asked for */
  tensorpool_stat active_bytes;    /* allocated + freed blocks waiting for other streams */
  tensorpool_stat reserved_bytes;  /* held from the device */
  tensorpool_stat allocations;     /* count of allocated blocks */
  tensorpool_stat active_blocks;
  tensorpool_stat segments;
  int64_t inactive_split_bytes;    /* now: free bytes in segments that also hold used blocks */
  int64_t inactive_split_blocks;
} tensorpool_pool_stats;

typedef struct tensorpool_stats {
  tensorpool_pool_stats all;
  tensorpool_pool_stats small_pool;
  tensorpool_pool_stats large_pool;
  uint64_t alloc_calls;
  uint64_t free_calls;
  uint64_t device_allocs;         /* segments or physical pages obtained from the device */
  uint64_t device_alloc_failures; /* the device answered out of memory */
  uint64_t device_frees;
  uint64_t device_maps;           /* virtual-memory mode */
  uint64_t device_unmaps;
  uint64_t syncs;                 /* host synchronizations the allocator made */
  uint64_t stream_waits;
  uint64_t retries;               /* allocations that had to free cached memory */
  uint64_t ooms;
  uint64_t memory_limit;          /* bytes; 0: none */
  uint64_t capacity;              /* the device's memory */
  uint64_t largest_free_block;
  int64_t oversize_allocations;   /* now: blocks in segments of max_split_size or more */
  int64_t oversize_segments;
} tensorpool_stats;

/* What tensorpool_sleep released, or what sleeps now (tensorpool_asleep). */
typedef struct tensorpool_sleep_report {
  uint64_t released_bytes;   /* physical memory given back (sleep: the sleeping pages and the
                                free memory released on the way) */
  uint64_t asleep_bytes;     /* physical memory tensorpool_wake maps back */
  uint64_t asleep_blocks;    /* live blocks without pages until tensorpool_wake */
  uint64_t asleep_allocated; /* their bytes (still counted as allocated) */
  uint64_t kept_bytes;       /* their requested bytes kept in host memory until wake */
} tensorpool_sleep_report;

/* --- errors ------------------------------------------------------------------------------- */
/* The message of the calling thread's last failed call ("" when none); valid until its next
 * failing call. */
TENSORPOOL_API const char* tensorpool_last_error(void);
TENSORPOOL_API tensorpool_status tensorpool_last_status(void);
/* "TENSORPOOL_OK", "TENSORPOOL_ERROR_USAGE", ... ("unknown status" otherwise). */
TENSORPOOL_API const char* tensorpool_status_name(tensorpool_status status);
TENSORPOOL_API int tensorpool_api_version(void);

/* --- allocators you own ------------------------------------------------------------------ */
/* 1 when `kind` is built into this library (the CUDA kinds need a CUDA build), else 0. */
TENSORPOOL_API int tensorpool_backend_available(tensorpool_backend kind);
/* An allocator on `device` of backend `kind`, with settings in TENSORPOOL_CONF syntax (NULL or
 * "": defaults; the "backend" key is ignored here). simulated_capacity: bytes of the simulated
 * device (0: 80 GiB); ignored by the CUDA kinds. */
TENSORPOOL_API tensorpool_status tensorpool_create(tensorpool_backend kind, int device,
                                                   size_t simulated_capacity, const char* config,
                                                   tensorpool_allocator** out);
/* Frees the allocator and everything it holds. The registry's allocators are refused
 * (TENSORPOOL_ERROR_USAGE). NULL is ignored. */
TENSORPOOL_API tensorpool_status tensorpool_destroy(tensorpool_allocator* allocator);

/* --- the per-device registry --------------------------------------------------------------- */
/* Settings for the device allocators not created yet (NULL: re-read TENSORPOOL_CONF).
 * TENSORPOOL_ERROR_CONFIG names a bad key; TENSORPOOL_ERROR_USAGE once one exists. */
TENSORPOOL_API tensorpool_status tensorpool_configure(const char* config);
/* The process-wide allocator of `device` (0..63), created on first use. */
TENSORPOOL_API tensorpool_status tensorpool_device_allocator(int device, tensorpool_allocator** out);
/* The same without creating it: *out is NULL when it does not exist yet. */
TENSORPOOL_API tensorpool_status tensorpool_existing_device_allocator(int device,
                                                                      tensorpool_allocator** out);
/* empty_cache / record_history of every device allocator that exists. record_history also
 * applies to those created later. */
TENSORPOOL_API tensorpool_status tensorpool_empty_cache_all(void);
TENSORPOOL_API tensorpool_status tensorpool_record_history_all(int enabled, size_t max_entries);
/* tensorpool_step on every device allocator that exists. */
TENSORPOOL_API tensorpool_status tensorpool_step_all(void);
/* A PyTorch memory snapshot (pickle) of every device allocator, written to `path` through a
 * temporary file and a rename. */
TENSORPOOL_API tensorpool_status tensorpool_dump_snapshot(const char* path);

/* --- operations -------------------------------------------------------------------------- */
/* A block of at least `size` bytes for use on `stream`; *out is NULL for size 0. On
 * TENSORPOOL_ERROR_OUT_OF_MEMORY the message gives the request, reserved, allocated, the largest
 * free block and the free cached bytes of each stream. */
TENSORPOOL_API tensorpool_status tensorpool_alloc(tensorpool_allocator* allocator, size_t size,
                                                  tensorpool_stream stream, void** out);
/* NULL is ignored. A double free or foreign pointer: TENSORPOOL_ERROR_USAGE, nothing changed. */
TENSORPOOL_API tensorpool_status tensorpool_free(tensorpool_allocator* allocator, void* ptr);
/* `ptr` is also used on `stream`: its memory is reused only after that stream's work submitted
 * before the free completes. */
TENSORPOOL_API tensorpool_status tensorpool_record_stream(tensorpool_allocator* allocator, void* ptr,
                                                          tensorpool_stream stream);
TENSORPOOL_API tensorpool_status tensorpool_empty_cache(tensorpool_allocator* allocator);
/* A training step ends here (Allocator::step(): call it once per step, after zero_grad or after
 * the optimizer step, always at the same point): in the virtual-memory mode the allocations each
 * step makes around the blocks that stay (weights, optimizer states) are planned and the next
 * step that makes the same ones is served at the planned places; no synchronization. */
TENSORPOOL_API tensorpool_status tensorpool_step(tensorpool_allocator* allocator);
/* Caps reserved memory at `fraction` (0..1) of the device's capacity; 1 is the capacity. */
TENSORPOOL_API tensorpool_status tensorpool_set_memory_fraction(tensorpool_allocator* allocator,
                                                                double fraction);
/* Caps reserved memory at `bytes` (0: no cap). */
TENSORPOOL_API tensorpool_status tensorpool_set_memory_limit(tensorpool_allocator* allocator,
                                                             size_t bytes);
TENSORPOOL_API tensorpool_status tensorpool_reset_peaks(tensorpool_allocator* allocator);
/* TENSORPOOL_ERROR_INTERNAL with the first inconsistency found (a bug in tensorpool). */
TENSORPOOL_API tensorpool_status tensorpool_check_invariants(tensorpool_allocator* allocator);
/* The device ordinal and backend of an allocator. */
TENSORPOOL_API tensorpool_status tensorpool_info(tensorpool_allocator* allocator, int* device,
                                                 tensorpool_backend* kind);
/* Virtual-memory mode (TENSORPOOL_BACKEND_CUDA_VMM, or mode:vmm on the simulated backend): gives
 * back the physical memory under every block (`tag` NULL) or under the blocks allocated under
 * `tag` (tensorpool_push_tag), while each live block keeps its address; an asleep block must not
 * be used (read, written, record_stream: TENSORPOOL_ERROR_USAGE) until tensorpool_wake. With
 * keep_contents != 0 the live bytes are copied to pinned host memory first and back at wake
 * (host memory refused: TENSORPOOL_ERROR_DEVICE, nothing sleeps). The device is synchronized
 * first. Allocations made meanwhile get other memory; a block freed while asleep is forgotten;
 * a second sleep does nothing. `out` may be NULL. Fixed segments (mode:fixed, the CUDA async and
 * malloc backends), or a tag nothing was allocated under: TENSORPOOL_ERROR_USAGE. */
TENSORPOOL_API tensorpool_status tensorpool_sleep(tensorpool_allocator* allocator, const char* tag,
                                                  int keep_contents, tensorpool_sleep_report* out);
/* Maps new pages under every asleep block (of `tag`; NULL: all), at the same addresses, and copies
 * back kept contents. With no tensorpool_sleep (of that tag, or of all) since the last wake:
 * TENSORPOOL_ERROR_USAGE (after one, never, even when it found nothing to put to sleep); when the
 * device cannot give the pages: TENSORPOOL_ERROR_DEVICE with everything still asleep. */
TENSORPOOL_API tensorpool_status tensorpool_wake(tensorpool_allocator* allocator, const char* tag);
/* The calling thread's allocations (from every allocator) carry the tag `name` until the
 * matching tensorpool_pop_tag; scopes nest and the innermost applies. Tagged blocks come from
 * memory of their own, so that tensorpool_sleep(allocator, name, ...) gives back theirs alone.
 * A pop without a push on the thread: TENSORPOOL_ERROR_USAGE. */
TENSORPOOL_API tensorpool_status tensorpool_push_tag(const char* name);
TENSORPOOL_API tensorpool_status tensorpool_pop_tag(void);
/* What sleeps now (all zero while awake). */
TENSORPOOL_API tensorpool_status tensorpool_asleep(tensorpool_allocator* allocator, tensorpool_sleep_report* out);
/* *out = 1 if `ptr`, a live block of the allocator, is asleep, else 0 (a pointer that is not a
 * live block: TENSORPOOL_ERROR_USAGE). */
TENSORPOOL_API tensorpool_status tensorpool_is_asleep(tensorpool_allocator* allocator, const void* ptr, int* out);

/* CUDA graph capture (docs/graphs.md). A graph's private pool; ids are never reused. */
typedef uint64_t tensorpool_graph_pool;
typedef struct tensorpool_graph_pool_info {
  tensorpool_graph_pool id;
  uint64_t reserved;          /* its ranges: memory kept for the graph */
  uint64_t allocated;         /* its live blocks (rounded) */
  uint64_t peak_allocated;
  uint64_t blocks;            /* live blocks */
  uint64_t largest_free;      /* the largest request it can serve now */
  uint64_t capturing_streams; /* streams it serves now */
  int released;               /* tensorpool_release_graph was called: given back once empty */
} tensorpool_graph_pool_info;
/* Reserves `reserve` bytes (> 0) for a new graph pool and serves every allocation on `stream` from
 * it, with no device call and no synchronization, until tensorpool_end_capture. Call it before
 * cudaStreamBeginCapture. A request the pool cannot serve: TENSORPOOL_ERROR_OUT_OF_MEMORY, the
 * message says how much to reserve. While a capture is underway tensorpool_empty_cache,
 * tensorpool_sleep and tensorpool_wake answer TENSORPOOL_ERROR_USAGE. */
TENSORPOOL_API tensorpool_status tensorpool_begin_capture(tensorpool_allocator* allocator, tensorpool_stream stream,
                                                          size_t reserve, tensorpool_graph_pool* out);
/* Serves `stream` from an existing pool (a graph sharing it, or a stream forked into the same
 * capture), reserving `more` bytes for it first (0: no device call). */
TENSORPOOL_API tensorpool_status tensorpool_join_capture(tensorpool_allocator* allocator, tensorpool_stream stream,
                                                         tensorpool_graph_pool pool, size_t more);
TENSORPOOL_API tensorpool_status tensorpool_end_capture(tensorpool_allocator* allocator, tensorpool_stream stream);
/* The graph is gone: once its pool's last block is freed, the pool's memory is the allocator's
 * cache again. A stream still captured into it: TENSORPOOL_ERROR_USAGE. */
TENSORPOOL_API tensorpool_status tensorpool_release_graph(tensorpool_allocator* allocator, tensorpool_graph_pool pool);
/* The pools not yet given back, by id: at most `capacity` into `out` (NULL when capacity is 0);
 * *count gets how many there are. */
TENSORPOOL_API tensorpool_status tensorpool_graph_pools(tensorpool_allocator* allocator,
                                                        tensorpool_graph_pool_info* out, size_t capacity,
                                                        size_t* count);

/* Simulated backend only: a new stream (TENSORPOOL_ERROR_UNAVAILABLE on CUDA: use
 * cudaStreamCreate). */
TENSORPOOL_API tensorpool_status tensorpool_create_stream(tensorpool_allocator* allocator,
                                                          tensorpool_stream* out);

/* --- statistics and snapshots ------------------------------------------------------------ */
TENSORPOOL_API tensorpool_status tensorpool_get_stats(tensorpool_allocator* allocator,
                                                      tensorpool_stats* out);
/* The statistics as JSON with the keys and nesting of PyTorch's
 * torch.cuda.memory_stats_as_nested_dict() ("allocated_bytes": {"all": {"current": ...}}).
 * Writes at most `capacity` bytes including the terminating NUL; *length (if not NULL) gets
 * the length without it. A buffer too small: TENSORPOOL_ERROR_INVALID_ARGUMENT, *length says
 * how much is needed (call with buffer NULL and capacity 0 to ask). */
TENSORPOOL_API tensorpool_status tensorpool_stats_json(tensorpool_allocator* allocator, char* buffer,
                                                       size_t capacity, size_t* length);
/* Starts (enabled != 0) or stops recording the allocator's events for snapshots, keeping the
 * newest max_entries (0: 100000). Starting again clears what was recorded. Stopping discards it:
 * a history that ends before the state it leads to would contradict it (write the snapshot
 * before stopping). */
TENSORPOOL_API tensorpool_status tensorpool_record_history(tensorpool_allocator* allocator,
                                                           int enabled, size_t max_entries);
/* A PyTorch memory snapshot (pickle) of this allocator, written through a temporary file. */
TENSORPOOL_API tensorpool_status tensorpool_write_snapshot(tensorpool_allocator* allocator,
                                                           const char* path);

#ifdef __cplusplus
}
#endif

#endif /* TENSORPOOL_TENSORPOOL_H */
