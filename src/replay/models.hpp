// models.hpp: factories of the replay targets, one file per target (internal to tensorpool::replay).
#pragma once

#include <memory>

#include "tensorpool/replay/target.hpp"

namespace tensorpool::replay {

std::unique_ptr<ReplayTarget> make_tensorpool_target(const TargetOptions& options);  // tensorpool_target.cpp
std::unique_ptr<ReplayTarget> make_tensorpool_vmm_target(const TargetOptions& options);  // tensorpool_target.cpp
std::unique_ptr<ReplayTarget> make_raw_target(const TargetOptions& options);         // raw_target.cpp
std::unique_ptr<ReplayTarget> make_pytorch_target(const TargetOptions& options);     // pytorch_model.cpp
std::unique_ptr<ReplayTarget> make_pytorch_expandable_target(const TargetOptions& options);  // pytorch_expandable_model.cpp
std::unique_ptr<ReplayTarget> make_cub_target(const TargetOptions& options);         // cub_model.cpp
std::unique_ptr<ReplayTarget> make_rmm_pool_target(const TargetOptions& options);    // models/rmm_pool_model.cpp
std::unique_ptr<ReplayTarget> make_rmm_arena_target(const TargetOptions& options);   // models/rmm_arena_model.cpp

}  // namespace tensorpool::replay
