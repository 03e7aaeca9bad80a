// tensorpool/trace/pickle.hpp: a safe reader for Python pickles that hold only plain data.
//
// Reads protocols 2 to 5 without Python: dict, list, tuple, str, bytes/bytearray, int, float, bool
// and None, with memo references (shared, never deep-copied). Every opcode that could import or
// call anything (GLOBAL, REDUCE, BUILD, ...) is refused with a ParseError naming the opcode and its
// byte offset, as are truncated input, unknown opcodes, stack/MARK misuse, bad memo indices and
// recursive structures. The parser is iterative, allocates in proportion to the input only, and
// checks every length field against the bytes that remain, so any input is memory safe.
//
// The result is a Document (an arena of nodes referenced by index) read through Value handles.
// Value accessors throw ParseError with the path of the value ("segments[3].blocks[0].size") when
// the type does not match.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "tensorpool/errors.hpp"

namespace tensorpool::trace::pickle {

/// A malformed or refused pickle (byte offset known), or a value of the wrong shape (path known).
/// what() reads "SOURCE: offset 1234: truncated: expected 8 bytes for BINFLOAT" or
/// "SOURCE: segments[3].blocks[0].size: expected int, got str".
class ParseError : public Error {
 public:
  static ParseError at_offset(std::string source, std::uint64_t offset, std::string reason);
  static ParseError at_path(std::string source, std::string path, std::string reason);

  const std::string& source() const noexcept { return source_; }
  bool has_offset() const noexcept { return has_offset_; }
  std::uint64_t offset() const noexcept { return offset_; }   // meaningful when has_offset()
  const std::string& path() const noexcept { return path_; }  // "" when has_offset() or root
  const std::string& reason() const noexcept { return reason_; }

 private:
  ParseError(std::string what, std::string source, bool has_offset, std::uint64_t offset,
             std::string path, std::string reason);

  std::string source_;
  bool has_offset_ = false;
  std::uint64_t offset_ = 0;
  std::string path_;
  std::string reason_;
};

/// The kinds of plain data. Names follow Python's type names (see kind_name()).
enum class Kind : std::uint8_t {
  none,
  boolean,
  integer,
  floating,
  string,
  bytes,
  list,
  tuple,
  dict
};
const char* kind_name(Kind kind) noexcept;  // "None", "bool", "int", "float", "str", ...

/// Bounds that keep hostile input cheap. The defaults accept any real snapshot.
struct Limits {
  std::uint32_t max_depth = 256;               // container nesting
  std::uint64_t max_input_bytes = 2ULL << 30;  // hard cap 4 GiB - 1 (node ids are 32-bit)
  bool allow_trailing_data = false;            // bytes after STOP (Python ignores them)
};

class Document;
class Value;

namespace detail {
struct Data;
/// One step of a value's path: child `position` of container node `container`.
struct PathStep {
  std::uint32_t container = 0;
  std::uint32_t position = 0;
};
inline constexpr std::size_t kPathSteps = 12;  // deeper paths keep the first and last 6 steps
}  // namespace detail

class ElementRange;
class ItemRange;

/// A read-only handle to one node of a Document; cheap to copy (no allocation: the path is kept
/// as container/position steps and rendered only for error messages). Valid while the Document
/// lives.
class Value {
 public:
  Kind kind() const noexcept;
  const char* type_name() const noexcept;  // kind_name(), but "bytearray" for a bytearray
  bool is(Kind k) const noexcept { return kind() == k; }
  bool is_none() const noexcept { return is(Kind::none); }

  bool as_bool() const;
  std::int64_t as_int() const;         // an int that fits int64 (bool is not accepted)
  std::uint64_t as_uint() const;       // a non-negative int up to 2^64 - 1
  double as_float() const;             // a float, or an int converted
  std::string_view as_string() const;  // str (UTF-8 bytes as stored)
  std::string_view as_bytes() const;   // bytes or bytearray

  /// Elements of a list/tuple, entries of a dict, bytes of a str/bytes.
  std::size_t size() const;
  Value operator[](std::size_t index) const;     // list/tuple element; throws when out of range
  Value operator[](std::string_view key) const;  // dict entry with a str key; throws if missing
  std::optional<Value> find(std::string_view key) const;  // dict lookup; nullopt if missing
  bool contains(std::string_view key) const { return find(key).has_value(); }
  ElementRange elements() const;  // list/tuple; throws for other kinds
  ItemRange items() const;        // dict; throws for other kinds

  /// "segments[3].blocks[0].size"; "" for the root.
  std::string path() const;
  const std::string& source() const noexcept;
  /// Throws ParseError at this value's path.
  [[noreturn]] void fail(std::string_view reason) const;
  /// Throws "expected <what>, got <type>" at this value's path.
  [[noreturn]] void fail_expected(std::string_view what) const;

  /// Identity of the underlying node: equal for memo-shared references.
  std::uint32_t node_id() const noexcept { return node_; }
  /// node_id() of list/tuple element `index`, without making its Value (throws as operator[]).
  std::uint32_t element_id(std::size_t index) const;

 private:
  friend class Document;
  friend class ElementRange;
  friend class ItemRange;
  Value(const detail::Data* data, std::uint32_t node) noexcept : data_(data), node_(node) {}
  Value child(std::uint32_t node, std::uint32_t position) const noexcept;
  void expect(Kind k) const;
  void expect_container(Kind a, Kind b) const;
  std::uint32_t count() const noexcept;

  const detail::Data* data_;
  std::uint32_t node_;
  std::uint32_t depth_ = 0;  // steps from the root (may exceed kPathSteps)
  std::array<detail::PathStep, detail::kPathSteps> steps_{};
};

namespace detail {
/// An input range over the items Range::at(parent, i) of a container Value, for i < size_. Holds
/// a copy of the container's Value, so a range of a temporary is safe in a range-for. Range's
/// constructor checks the container's kind and sets size_.
template <class Range, class Item>
class IndexedRange {
 public:
  class iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Item;
    using difference_type = std::ptrdiff_t;
    iterator(const Value* parent, std::uint32_t index) : parent_(parent), index_(index) {}
    Item operator*() const { return Range::at(*parent_, index_); }
    iterator& operator++() {
      ++index_;
      return *this;
    }
    bool operator==(const iterator& other) const { return index_ == other.index_; }

   private:
    const Value* parent_;
    std::uint32_t index_;
  };
  iterator begin() const { return {&parent_, 0}; }
  iterator end() const { return {&parent_, size_}; }
  std::size_t size() const noexcept { return size_; }

 protected:
  explicit IndexedRange(const Value& parent) : parent_(parent) {}
  Value parent_;
  std::uint32_t size_ = 0;
};
}  // namespace detail

/// Iterates the elements of a list or tuple as Values.
class ElementRange : public detail::IndexedRange<ElementRange, Value> {
 public:
  explicit ElementRange(const Value& parent);

 private:
  friend class detail::IndexedRange<ElementRange, Value>;
  static Value at(const Value& parent, std::uint32_t index);
};

/// Iterates the (key, value) entries of a dict in insertion order.
class ItemRange : public detail::IndexedRange<ItemRange, std::pair<Value, Value>> {
 public:
  explicit ItemRange(const Value& parent);

 private:
  friend class detail::IndexedRange<ItemRange, std::pair<Value, Value>>;
  static std::pair<Value, Value> at(const Value& parent, std::uint32_t index);
};

/// A parsed pickle. Movable; Values stay valid across moves.
class Document {
 public:
  /// Parses `bytes`; `source` names it in errors (a file name, "<memory>").
  static Document parse(std::string bytes, std::string source = "<memory>",
                        const Limits& limits = {});
  /// Reads and parses a file; errors name the path as given.
  static Document load(const std::filesystem::path& file, const Limits& limits = {});

  Document(Document&&) noexcept;
  Document& operator=(Document&&) noexcept;
  ~Document();

  Value root() const noexcept;
  const std::string& source() const noexcept;
  std::size_t node_count() const noexcept;
  int protocol() const noexcept;  // from PROTO; 0 when the pickle has none

 private:
  explicit Document(std::unique_ptr<detail::Data> data) noexcept;
  std::unique_ptr<detail::Data> data_;
};

}  // namespace tensorpool::trace::pickle
