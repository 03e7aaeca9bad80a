// tensorpool/cuda/nvtx.hpp: NVTX annotations of an allocator, for Nsight Systems and Compute
// Sanitizer (NVTX 3 of the CUDA Toolkit, header-only: no library to link, and every call is a
// no-op until a tool attaches). Switched on by the config keys nvtx and nvtx_mem:
//
//   nvtx:on      ranges in the "tensorpool" domain around the device calls (segment alloc and
//                free, map and unmap, physical create and release), with the byte count as
//                payload, and marks for OOM (payload: the request) and empty_cache (payload:
//                bytes released);
//   nvtx_mem:on  the NVTX memory API (nvToolsExtMem.h): every segment (fixed mode) or reserved
//                address range (vmm mode) is a sub-allocator heap, every live block a region
//                (registered when handed out, unregistered when reusable), so Compute Sanitizer
//                checks accesses against blocks instead of whole segments.
//
// Both off (the default) costs nothing: with_nvtx() returns the backend itself and attach_nvtx()
// attaches nothing. Use:
//
//   auto backend = tensorpool::with_nvtx(tensorpool::make_cuda_backend(kind, 0), config);
//   tensorpool::Allocator alloc(backend, config);
//   tensorpool::attach_nvtx(alloc);
//
// On: the backend wrapper adds a few nanoseconds per device call; the observer that emits the
// marks and regions makes the allocator time-stamp every event (docs/benchmarks.md has the cost
// per allocation + free).
#pragma once

#include <memory>

#include "tensorpool/allocator.hpp"
#include "tensorpool/config.hpp"
#include "tensorpool/device.hpp"

namespace tensorpool {

/// `device`, wrapped to emit the nvtx ranges (nvtx:on) and heaps (nvtx_mem:on) of `config`;
/// `device` itself when both are off.
std::shared_ptr<DeviceBackend> with_nvtx(std::shared_ptr<DeviceBackend> device, const Config& config);

/// Attaches the observer of alloc.config()'s nvtx settings: marks (nvtx:on) and regions
/// (nvtx_mem:on; the allocator's device must come from with_nvtx(), or UsageError). Returns its
/// hook id, or 0 when both are off (nothing attached).
HookId attach_nvtx(Allocator& alloc);

/// True once an NVTX tool (Nsight Systems, Compute Sanitizer, an NVTX_INJECTION64_PATH library)
/// has attached to this process's NVTX calls.
bool nvtx_tool_attached() noexcept;

}  // namespace tensorpool
