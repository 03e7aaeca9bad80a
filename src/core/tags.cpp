// tags.cpp: the process's tag names (tags.hpp) and the Tag scope.
#include "core/tags.hpp"

#include <limits>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "tensorpool/allocator.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/hooks.hpp"

namespace tensorpool {
namespace detail {

namespace {

struct TagNames {
  std::mutex mutex;
  std::unordered_map<std::string, TagId> ids;
  std::vector<std::string> names{""};  // by id; 0 is no tag
};

TagNames& tag_names() {
  static TagNames* const names = new TagNames;  // never destroyed: tags may be used at exit
  return *names;
}

}  // namespace

TagId intern_tag(std::string_view name) {
  if (name.empty()) throw UsageError("tensorpool: a tag needs a name (got an empty one)");
  TagNames& t = tag_names();
  const std::lock_guard<std::mutex> lock(t.mutex);
  const auto it = t.ids.find(std::string(name));
  if (it != t.ids.end()) return it->second;
  if (t.names.size() > std::numeric_limits<TagId>::max())
    throw UsageError("tensorpool: too many tag names (at most 65535 in a process); cannot add '" +
                     std::string(name) + "'");
  const auto id = static_cast<TagId>(t.names.size());
  t.names.emplace_back(name);
  t.ids.emplace(std::string(name), id);
  return id;
}

TagId find_tag(std::string_view name) {
  TagNames& t = tag_names();
  const std::lock_guard<std::mutex> lock(t.mutex);
  const auto it = t.ids.find(std::string(name));
  return it == t.ids.end() ? 0 : it->second;
}

std::string tag_name(TagId id) {
  TagNames& t = tag_names();
  const std::lock_guard<std::mutex> lock(t.mutex);
  return id < t.names.size() ? t.names[id] : std::string();
}

}  // namespace detail

std::string tag_name(std::uint16_t tag) { return detail::tag_name(tag); }

Tag::Tag(std::string_view name) : previous_(detail::exchange_thread_tag(detail::intern_tag(name))) {}
Tag::~Tag() { detail::exchange_thread_tag(previous_); }

}  // namespace tensorpool
