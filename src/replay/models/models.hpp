// models.hpp: how the registry (targets.cpp) knows each replay target: one entry per target,
// defined in the target's own file, and the factories the tests call directly (internal to
// tensorpool::replay).
#pragma once

#include <memory>
#include <string_view>

#include "tensorpool/replay/target.hpp"

namespace tensorpool::replay {

/// A target as the registry lists it.
struct TargetEntry {
  TargetDescriptor descriptor;
  /// Reads `conf` as the target would, building nothing; throws ConfigError naming `origin`.
  void (*check_settings)(std::string_view conf, std::string_view origin);
  std::unique_ptr<ReplayTarget> (*make)(const TargetOptions& options);
};

TargetEntry tensorpool_entry();          // tensorpool_target.cpp
TargetEntry tensorpool_vmm_entry();      // tensorpool_target.cpp
TargetEntry pytorch_entry();             // pytorch_model.cpp
TargetEntry pytorch_expandable_entry();  // pytorch_expandable_model.cpp
TargetEntry cub_entry();                 // cub_model.cpp
TargetEntry rmm_pool_entry();            // rmm_pool_model.cpp
TargetEntry rmm_arena_entry();           // rmm_arena_model.cpp
TargetEntry raw_entry();                 // raw_target.cpp

std::unique_ptr<ReplayTarget> make_tensorpool_target(const TargetOptions& options);
std::unique_ptr<ReplayTarget> make_tensorpool_vmm_target(const TargetOptions& options);
std::unique_ptr<ReplayTarget> make_pytorch_target(const TargetOptions& options);
std::unique_ptr<ReplayTarget> make_pytorch_expandable_target(const TargetOptions& options);
std::unique_ptr<ReplayTarget> make_cub_target(const TargetOptions& options);
std::unique_ptr<ReplayTarget> make_rmm_pool_target(const TargetOptions& options);
std::unique_ptr<ReplayTarget> make_rmm_arena_target(const TargetOptions& options);
std::unique_ptr<ReplayTarget> make_raw_target(const TargetOptions& options);

}  // namespace tensorpool::replay
