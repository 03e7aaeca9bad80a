// tags.hpp: tags of allocations (tensorpool::Tag): names interned as small ids for the process,
// and each thread's current tag, which the allocator reads with its stream (allocator.cpp).
// Allocations under a tag come from memory of their own: the allocator keeps a stream state per
// (stream, tag), so that sleep(tag) gives back the pages of those blocks alone (vmm_sleep.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tensorpool::detail {

using TagId = std::uint16_t;  // 0: no tag

/// The id of tag `name`, made on first use (1, 2, ...); UsageError for an empty name or past
/// 65535 names in the process.
TagId intern_tag(std::string_view name);
/// The id of a tag used before, or 0 when no tag has that name.
TagId find_tag(std::string_view name);
/// The name of a tag (empty for 0).
std::string tag_name(TagId id);
/// Sets the calling thread's tag and returns the one before (allocator.cpp, beside the thread's
/// stream cache).
TagId exchange_thread_tag(TagId tag) noexcept;

}  // namespace tensorpool::detail
