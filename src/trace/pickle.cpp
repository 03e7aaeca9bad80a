// The plain-data pickle reader: an iterative opcode interpreter that builds an arena of nodes, and
// the Value handles that read it.
//
// Safety invariants (the input is untrusted and will be fuzzed):
//  - every read checks the remaining bytes first (take()); lengths are compared with what is
//    left before anything is sized from them;
//  - the only allocations grow with the number of opcodes read (nodes, stack, children) or are
//    bounded by the input size (memo indices);
//  - there is no recursion: the interpreter is a loop and Value paths are fixed-size arrays;
//  - containers can be mutated (APPEND, SETITEM, ...) only while "unsealed": a list/dict is sealed
//    when its stack slot is consumed or when a memo GET/DUP references it. A container inside
//    another is therefore always sealed, so no cycle can form and a container's height (its
//    nesting depth) is final once it is sealed.
#include "tensorpool/trace/pickle.hpp"

#include "trace/pickle_opcodes.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace tensorpool::trace::pickle {

namespace detail {

enum NodeFlag : std::uint8_t {
  kSealed = 1,      // list/dict: no longer mutable (consumed from the stack or referenced)
  kUnsigned = 2,    // int: payload is a uint64 >= 2^63
  kUnhashable = 4,  // tuple: holds a list/dict (directly or through tuples)
  kByteArray = 8,   // bytes: came from BYTEARRAY8
};

struct Node {
  Kind kind = Kind::none;
  std::uint8_t flags = 0;
  std::uint16_t height = 0;   // containers: 1 + the children's maximum; scalars: 0
  std::uint32_t count = 0;    // str/bytes: length; list/tuple: elements; dict: entries
  std::uint64_t payload = 0;  // int/float bits, byte offset of str/bytes, or children offset
};
static_assert(sizeof(Node) == 16);

struct Data {
  std::string bytes;   // the pickle itself: str/bytes nodes point into it
  std::string source;  // names the pickle in errors
  std::vector<Node> nodes;
  std::vector<std::uint32_t> children;  // flattened; a dict's are key0, value0, key1, ...
  std::uint32_t root = 0;
  int protocol = 0;
};

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// ParseError

ParseError::ParseError(std::string what, std::string source, bool has_offset, std::uint64_t offset,
                       std::string path, std::string reason)
    : Error(what),
      source_(std::move(source)),
      has_offset_(has_offset),
      offset_(offset),
      path_(std::move(path)),
      reason_(std::move(reason)) {}

ParseError ParseError::at_offset(std::string source, std::uint64_t offset, std::string reason) {
  std::string what = fmt::format("{}: offset {}: {}", source, offset, reason);
  return ParseError(std::move(what), std::move(source), true, offset, "", std::move(reason));
}

ParseError ParseError::at_path(std::string source, std::string path, std::string reason) {
  std::string what = path.empty() ? fmt::format("{}: {}", source, reason)
                                  : fmt::format("{}: {}: {}", source, path, reason);
  return ParseError(std::move(what), std::move(source), false, 0, std::move(path),
                    std::move(reason));
}

const char* kind_name(Kind kind) noexcept {
  switch (kind) {
    case Kind::none: return "None";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::floating: return "float";
    case Kind::string: return "str";
    case Kind::bytes: return "bytes";
    case Kind::list: return "list";
    case Kind::tuple: return "tuple";
    case Kind::dict: return "dict";
  }
  return "?";
}

// An opcode the reader does not handle must not build (pickle_opcodes.hpp).
#pragma GCC diagnostic error "-Wswitch"

namespace {

using detail::Data;
using opcodes::kOpcodeByByte;
using opcodes::Opcode;
using opcodes::OpcodeInfo;
using opcodes::Treatment;
using detail::Node;

constexpr std::uint32_t kNoNode = std::numeric_limits<std::uint32_t>::max();
constexpr std::uint32_t kNoneNode = 0;  // shared constants, created first
constexpr std::uint32_t kFalseNode = 1;
constexpr std::uint32_t kTrueNode = 2;
constexpr int kMaxProtocol = 5;
constexpr std::size_t kMaxReserve = std::size_t{1} << 22;  // nodes reserved up front, at most
constexpr std::uint64_t kHardMaxInput = std::numeric_limits<std::uint32_t>::max() - 1;

// The length-prefixed str/bytes opcodes. Python 3 reads the Python 2 strings (SHORT_BINSTRING,
// BINSTRING) as str too.
struct TextOp {
  Opcode op;
  std::uint8_t len_bytes;  // size of the little-endian length field
  bool signed_len;         // BINSTRING's length is signed: negative is an error
  Kind kind;
  std::uint8_t flags;
  const char* data;  // names the payload in truncation errors
};

constexpr std::array<TextOp, 9> kTextOps = {{
    {Opcode::short_binstring, 1, false, Kind::string, 0, "SHORT_BINSTRING data"},
    {Opcode::binstring, 4, true, Kind::string, 0, "BINSTRING data"},
    {Opcode::short_binunicode, 1, false, Kind::string, 0, "SHORT_BINUNICODE data"},
    {Opcode::binunicode, 4, false, Kind::string, 0, "BINUNICODE data"},
    {Opcode::binunicode8, 8, false, Kind::string, 0, "BINUNICODE8 data"},
    {Opcode::short_binbytes, 1, false, Kind::bytes, 0, "SHORT_BINBYTES data"},
    {Opcode::binbytes, 4, false, Kind::bytes, 0, "BINBYTES data"},
    {Opcode::binbytes8, 8, false, Kind::bytes, 0, "BINBYTES8 data"},
    {Opcode::bytearray8, 8, false, Kind::bytes, detail::kByteArray, "BYTEARRAY8 data"},
}};

bool is_mutable_container(Kind k) { return k == Kind::list || k == Kind::dict; }

// ---------------------------------------------------------------------------------------------
// The interpreter.

class Parser {
 public:
  Parser(Data& data, const Limits& limits) : d_(data), limits_(limits) {
    in_ = reinterpret_cast<const unsigned char*>(d_.bytes.data());
    size_ = d_.bytes.size();
    d_.nodes.reserve(std::min<std::size_t>(size_ / 4, kMaxReserve) + 16);  // ~1 node per 4 bytes
    d_.nodes.push_back(Node{Kind::none, 0, 0, 0, 0});
    d_.nodes.push_back(Node{Kind::boolean, 0, 0, 0, 0});
    d_.nodes.push_back(Node{Kind::boolean, 0, 0, 0, 1});
  }

  void run() {
    if (size_ > std::min(limits_.max_input_bytes, kHardMaxInput)) {
      fail_at(0, fmt::format("input of {} bytes exceeds the limit of {} bytes", size_,
                             std::min(limits_.max_input_bytes, kHardMaxInput)));
    }
    while (!stopped_) step();
    if (pos_ != size_ && !limits_.allow_trailing_data) {
      fail_at(pos_, fmt::format("{} bytes of trailing data after STOP", size_ - pos_));
    }
    flatten();
  }

 private:
  // --- input -----------------------------------------------------------------------------------

  std::size_t remaining() const { return size_ - pos_; }

  [[noreturn]] void fail_at(std::uint64_t offset, std::string reason) const {
    throw ParseError::at_offset(d_.source, offset, std::move(reason));
  }
  [[noreturn]] void fail(std::string reason) const { fail_at(op_pos_, std::move(reason)); }

  // Returns the next n bytes and advances; errors (at the opcode) when fewer remain.
  const unsigned char* take(std::uint64_t n, const char* what) {
    if (n > remaining()) fail(fmt::format("truncated: expected {} bytes for {}", n, what));
    const unsigned char* p = in_ + pos_;
    pos_ += static_cast<std::size_t>(n);
    return p;
  }

  std::uint64_t read_le(std::size_t n, const char* what) {
    const unsigned char* p = take(n, what);
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < n; ++i) v |= std::uint64_t{p[i]} << (8 * i);
    return v;
  }

  // A 4-byte little-endian signed length (BINSTRING, LONG4); negative lengths are errors.
  std::uint64_t read_len4_signed(const char* what) {
    const auto raw = static_cast<std::uint32_t>(read_le(4, what));
    if (raw & 0x80000000U) fail(fmt::format("negative length for {}", what));
    return raw;
  }

  // --- stack -----------------------------------------------------------------------------------

  std::size_t fence() const { return marks_.empty() ? 0 : marks_.back(); }
  std::size_t above_fence() const { return stack_.size() - fence(); }

  void need(std::size_t n) const {
    if (above_fence() < n) {
      fail(fmt::format("stack underflow: {} needs {} values, {} available", op_name_, n,
                       above_fence()));
    }
  }

  void seal(std::uint32_t node) { d_.nodes[node].flags |= detail::kSealed; }

  // Consuming a stack slot seals a list/dict: from here on it may be inside another container.
  std::uint32_t pop() {
    const std::uint32_t node = stack_.back();
    stack_.pop_back();
    seal(node);
    return node;
  }

  void truncate_stack(std::size_t size) {
    for (std::size_t i = size; i < stack_.size(); ++i) seal(stack_[i]);
    stack_.resize(size);
  }

  // Pops the topmost MARK and returns the stack position it recorded.
  std::size_t pop_mark() {
    if (marks_.empty()) fail(fmt::format("{} without a MARK", op_name_));
    const std::size_t at = marks_.back();
    marks_.pop_back();
    return at;
  }

  // The container just below a MARK (APPENDS, SETITEMS): must be above the enclosing fence.
  std::uint32_t target_below(std::size_t mark_at) const {
    if (mark_at == 0 || mark_at - 1 < fence()) {
      fail(fmt::format("stack underflow: {} has no container below its MARK", op_name_));
    }
    return stack_[mark_at - 1];
  }

  // --- nodes -----------------------------------------------------------------------------------

  std::uint32_t add_node(const Node& n) {
    d_.nodes.push_back(n);
    return static_cast<std::uint32_t>(d_.nodes.size() - 1);
  }

  void push(std::uint32_t node) { stack_.push_back(node); }

  std::uint32_t new_container(Kind kind) {
    building_.emplace_back();
    return add_node(Node{kind, 0, 1, 0, building_.size() - 1});
  }

  // Checks that `target` is an unsealed container of `kind` that this opcode may mutate.
  void check_mutable(std::uint32_t target, Kind kind) const {
    const Node& n = d_.nodes[target];
    if (n.kind != kind) {
      fail(fmt::format("{} target is {}, expected {}", op_name_, kind_name(n.kind),
                       kind_name(kind)));
    }
    if (n.flags & detail::kSealed) {
      fail(
          fmt::format("{} to a {} that is already referenced elsewhere (recursive or "
                      "modified-after-sharing structures are not supported)",
                      op_name_, kind_name(kind)));
    }
  }

  void grow_height(std::uint32_t container, std::uint32_t child) {
    const std::uint32_t h = std::uint32_t{d_.nodes[child].height} + 1;
    if (h > limits_.max_depth) {
      fail(fmt::format("nesting deeper than {} containers", limits_.max_depth));
    }
    Node& c = d_.nodes[container];
    c.height = static_cast<std::uint16_t>(std::max<std::uint32_t>(c.height, h));
  }

  bool unhashable(std::uint32_t node) const {
    const Node& n = d_.nodes[node];
    return is_mutable_container(n.kind) || (n.flags & detail::kUnhashable);
  }

  void add_child(std::uint32_t container, std::uint32_t child) {
    grow_height(container, child);
    Node& c = d_.nodes[container];
    building_[c.payload].push_back(child);
    ++c.count;
  }

  void add_entry(std::uint32_t dict, std::uint32_t key, std::uint32_t value) {
    if (unhashable(key)) {
      fail(fmt::format("{}: unhashable dict key of type {}", op_name_,
                       kind_name(d_.nodes[key].kind)));
    }
    grow_height(dict, key);
    grow_height(dict, value);
    Node& c = d_.nodes[dict];
    auto& kids = building_[c.payload];
    kids.push_back(key);
    kids.push_back(value);
    ++c.count;
  }

  // Builds a tuple/list/dict from the stack slots [from, end) and pops them.
  void build_from(std::size_t from, Kind kind) {
    const std::uint32_t node = new_container(kind);
    const std::size_t n = stack_.size() - from;
    if (kind == Kind::dict && n % 2 != 0)
      fail(fmt::format("{} with an odd number of values", op_name_));
    if (kind == Kind::dict) {
      for (std::size_t i = from; i < stack_.size(); i += 2)
        add_entry(node, stack_[i], stack_[i + 1]);
    } else {
      for (std::size_t i = from; i < stack_.size(); ++i) add_child(node, stack_[i]);
    }
    if (kind == Kind::tuple) {
      for (std::size_t i = from; i < stack_.size(); ++i) {
        if (unhashable(stack_[i])) d_.nodes[node].flags |= detail::kUnhashable;
      }
      seal(node);  // tuples are immutable
    }
    truncate_stack(from);
    push(node);
  }

  void push_int(std::uint64_t bits, bool is_unsigned) {
    const auto flags = static_cast<std::uint8_t>(is_unsigned ? detail::kUnsigned : 0);
    push(add_node(Node{Kind::integer, flags, 0, 0, bits}));
  }

  // LONG1/LONG4: n bytes of little-endian two's complement.
  void push_long(const unsigned char* b, std::size_t n) {
    if (n == 0) return push_int(0, false);
    const bool neg = (b[n - 1] & 0x80) != 0;
    const unsigned char ext = neg ? 0xFF : 0x00;
    // Drop sign-extension bytes that do not change the value.
    while (n > 1 && b[n - 1] == ext && ((b[n - 2] & 0x80) != 0) == neg) --n;
    if (n > 9 || (n == 9 && (neg || b[8] != 0))) fail("int does not fit in 64 bits");
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < std::min<std::size_t>(n, 8); ++i)
      v |= std::uint64_t{b[i]} << (8 * i);
    if (n == 9) return push_int(v, true);  // 2^63 <= v < 2^64
    if (neg && n < 8) v |= ~std::uint64_t{0} << (8 * n);
    push_int(v, false);
  }

  void push_text(Kind kind, std::uint64_t len, const char* what, std::uint8_t flags = 0) {
    const unsigned char* p = take(len, what);
    const auto offset = static_cast<std::uint64_t>(p - in_);
    push(add_node(Node{kind, flags, 0, static_cast<std::uint32_t>(len), offset}));
  }

  // --- memo ------------------------------------------------------------------------------------

  void memo_put(std::uint64_t index) {
    need(1);
    if (index >= memo_.size()) {
      // Python's pickler numbers memo entries densely; a sparse index is legal but may not size
      // the memo beyond the input length.
      if (index > size_ + 256) fail(fmt::format("memo index {} is too large", index));
      memo_.resize(static_cast<std::size_t>(index) + 1, kNoNode);
    }
    auto& slot = memo_[static_cast<std::size_t>(index)];
    if (slot == kNoNode) ++memo_count_;
    slot = stack_.back();
  }

  void memo_get(std::uint64_t index) {
    if (index >= memo_.size() || memo_[static_cast<std::size_t>(index)] == kNoNode) {
      fail(fmt::format("bad memo index {} (never stored)", index));
    }
    const std::uint32_t node = memo_[static_cast<std::size_t>(index)];
    seal(node);  // a referenced container must not change any more (see the file comment)
    push(node);
  }

  // --- opcodes ---------------------------------------------------------------------------------

  void step() {
    if (pos_ >= size_) fail_at(pos_, "truncated: expected an opcode (no STOP)");
    op_pos_ = pos_;
    const unsigned char byte = in_[pos_++];
    const OpcodeInfo& info = kOpcodeByByte[byte];
    op_name_ = info.name;
    switch (info.treatment) {
      case Treatment::read: return read(info.op);
      case Treatment::forbidden:
        fail(fmt::format("forbidden opcode {} (0x{:02x}): a plain-data pickle never imports or calls code",
                         info.name, byte));
      case Treatment::unsupported:
        fail(fmt::format("unsupported opcode {} (0x{:02x}): {}", info.name, byte, info.why));
      case Treatment::unknown: break;
    }
    fail(fmt::format("unknown opcode 0x{:02x}", byte));
  }

  // Every opcode the table says is read, and no other (the switch names every Opcode: a new one
  // does not build until it is handled here, pickle_opcodes.hpp).
  void read(Opcode op) {
    switch (op) {
      case Opcode::mark: return marks_.push_back(stack_.size());
      case Opcode::stop: return stop();
      case Opcode::pop: return pop_op();
      case Opcode::pop_mark: return truncate_stack(pop_mark());
      case Opcode::dup: return dup();
      case Opcode::proto: return proto();
      case Opcode::frame: return frame();
      case Opcode::none: return push(kNoneNode);
      case Opcode::newtrue: return push(kTrueNode);
      case Opcode::newfalse: return push(kFalseNode);
      case Opcode::binint:  // a signed 32-bit int, sign-extended to 64 bits
        return push_int(static_cast<std::uint64_t>(std::int64_t{
                            static_cast<std::int32_t>(static_cast<std::uint32_t>(read_le(4, "BININT")))}),
                        false);
      case Opcode::binint1: return push_int(read_le(1, "BININT1"), false);
      case Opcode::binint2: return push_int(read_le(2, "BININT2"), false);
      case Opcode::long1: return long_payload(read_le(1, "LONG1"), "LONG1 data");
      case Opcode::long4: return long_payload(read_len4_signed("LONG4"), "LONG4 data");
      case Opcode::binfloat: return binfloat();
      case Opcode::short_binstring:
      case Opcode::binstring:
      case Opcode::short_binunicode:
      case Opcode::binunicode:
      case Opcode::binunicode8:
      case Opcode::short_binbytes:
      case Opcode::binbytes:
      case Opcode::binbytes8:
      case Opcode::bytearray8: return text(op);
      case Opcode::empty_list: return push(new_container(Kind::list));
      case Opcode::empty_dict: return push(new_container(Kind::dict));
      case Opcode::empty_tuple: return build_from(stack_.size(), Kind::tuple);
      case Opcode::tuple1: return tuple_of(1);
      case Opcode::tuple2: return tuple_of(2);
      case Opcode::tuple3: return tuple_of(3);
      case Opcode::tuple: return build_from(pop_mark(), Kind::tuple);
      case Opcode::list: return build_from(pop_mark(), Kind::list);
      case Opcode::dict: return build_from(pop_mark(), Kind::dict);
      case Opcode::append: return append();
      case Opcode::appends: return appends();
      case Opcode::setitem: return setitem();
      case Opcode::setitems: return setitems();
      case Opcode::binput: return memo_put(read_le(1, "BINPUT"));
      case Opcode::long_binput: return memo_put(read_le(4, "LONG_BINPUT"));
      case Opcode::memoize: return memo_put(memo_count_);  // Python: the key is len(memo)
      case Opcode::binget: return memo_get(read_le(1, "BINGET"));
      case Opcode::long_binget: return memo_get(read_le(4, "LONG_BINGET"));
      // Refused by step() before they get here (Treatment::forbidden, unsupported).
      case Opcode::global:
      case Opcode::stack_global:
      case Opcode::reduce:
      case Opcode::build:
      case Opcode::inst:
      case Opcode::obj:
      case Opcode::newobj:
      case Opcode::newobj_ex:
      case Opcode::ext1:
      case Opcode::ext2:
      case Opcode::ext4:
      case Opcode::persid:
      case Opcode::binpersid:
      case Opcode::int_text:
      case Opcode::long_text:
      case Opcode::float_text:
      case Opcode::string_text:
      case Opcode::unicode_text:
      case Opcode::put_text:
      case Opcode::get_text:
      case Opcode::empty_set:
      case Opcode::additems:
      case Opcode::frozenset:
      case Opcode::next_buffer:
      case Opcode::readonly_buffer: break;
    }
    fail(fmt::format("opcode {} is not read", op_name_));
  }

  void long_payload(std::uint64_t n, const char* what) {
    push_long(take(n, what), static_cast<std::size_t>(n));
  }

  void binfloat() {
    const unsigned char* p = take(8, "BINFLOAT");
    std::uint64_t bits = 0;
    for (int i = 0; i < 8; ++i) bits = (bits << 8) | p[i];  // big-endian
    push(add_node(Node{Kind::floating, 0, 0, 0, bits}));
  }

  void text(Opcode op) {
    const TextOp& t = *std::find_if(kTextOps.begin(), kTextOps.end(), [op](const TextOp& x) { return x.op == op; });
    const std::uint64_t len = t.signed_len ? read_len4_signed(op_name_) : read_le(t.len_bytes, op_name_);
    push_text(t.kind, len, t.data, t.flags);
  }

  void tuple_of(std::size_t n) {
    need(n);
    build_from(stack_.size() - n, Kind::tuple);
  }

  void proto() {
    const std::uint64_t version = read_le(1, "PROTO");
    if (version > kMaxProtocol) fail(fmt::format("unsupported protocol {}", version));
    d_.protocol = static_cast<int>(version);
  }

  // Frames only group opcodes for buffering; the declared length must be present.
  void frame() {
    const std::uint64_t n = read_le(8, "FRAME");
    if (n > remaining()) {
      fail(fmt::format("truncated: FRAME declares {} bytes, {} left", n, remaining()));
    }
  }

  void stop() {
    if (!marks_.empty()) fail("STOP inside an unclosed MARK");
    if (stack_.size() != 1) {
      fail(fmt::format("STOP with {} values on the stack, expected 1", stack_.size()));
    }
    d_.root = pop();
    stopped_ = true;
  }

  // Python pops the topmost MARK when no value is above it.
  void pop_op() {
    if (above_fence() > 0) {
      pop();
    } else if (!marks_.empty()) {
      marks_.pop_back();
    } else {
      need(1);
    }
  }

  void dup() {
    need(1);
    const std::uint32_t node = stack_.back();
    const Node& n = d_.nodes[node];
    if (is_mutable_container(n.kind) && !(n.flags & detail::kSealed)) {
      fail(
          fmt::format("DUP of a {} that is still being built is not supported", kind_name(n.kind)));
    }
    push(node);
  }

  void append() {
    need(2);
    const std::uint32_t list = stack_[stack_.size() - 2];
    check_mutable(list, Kind::list);
    add_child(list, pop());
  }

  void appends() {
    const std::size_t at = pop_mark();
    const std::uint32_t list = target_below(at);
    check_mutable(list, Kind::list);
    for (std::size_t i = at; i < stack_.size(); ++i) add_child(list, stack_[i]);
    truncate_stack(at);
  }

  void setitem() {
    need(3);
    const std::uint32_t dict = stack_[stack_.size() - 3];
    check_mutable(dict, Kind::dict);
    const std::uint32_t value = pop();
    const std::uint32_t key = pop();
    add_entry(dict, key, value);
  }

  void setitems() {
    const std::size_t at = pop_mark();
    const std::uint32_t dict = target_below(at);
    check_mutable(dict, Kind::dict);
    if ((stack_.size() - at) % 2 != 0) fail("SETITEMS with an odd number of values");
    for (std::size_t i = at; i < stack_.size(); i += 2) add_entry(dict, stack_[i], stack_[i + 1]);
    truncate_stack(at);
  }

  // Moves the containers' children into one flat array (payload becomes their offset).
  void flatten() {
    std::size_t total = 0;
    for (const auto& kids : building_) total += kids.size();
    d_.children.reserve(total);
    for (Node& n : d_.nodes) {
      if (n.kind != Kind::list && n.kind != Kind::tuple && n.kind != Kind::dict) continue;
      auto& kids = building_[n.payload];
      n.payload = d_.children.size();
      d_.children.insert(d_.children.end(), kids.begin(), kids.end());
      std::vector<std::uint32_t>().swap(kids);
    }
    building_.clear();
  }

  Data& d_;
  const Limits& limits_;
  const unsigned char* in_ = nullptr;
  std::size_t size_ = 0;
  std::size_t pos_ = 0;
  std::size_t op_pos_ = 0;
  const char* op_name_ = "";
  bool stopped_ = false;
  std::vector<std::uint32_t> stack_;
  std::vector<std::size_t> marks_;  // stack sizes at each MARK
  std::vector<std::uint32_t> memo_;
  std::uint64_t memo_count_ = 0;
  std::vector<std::vector<std::uint32_t>> building_;  // children of containers while parsing
};

bool is_identifier(std::string_view s) {
  if (s.empty() || (s[0] >= '0' && s[0] <= '9')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Document

Document::Document(std::unique_ptr<detail::Data> data) noexcept : data_(std::move(data)) {}
Document::Document(Document&&) noexcept = default;
Document& Document::operator=(Document&&) noexcept = default;
Document::~Document() = default;

Document Document::parse(std::string bytes, std::string source, const Limits& limits) {
  auto data = std::make_unique<detail::Data>();
  data->bytes = std::move(bytes);
  data->source = std::move(source);
  Parser(*data, limits).run();
  return Document(std::move(data));
}

Document Document::load(const std::filesystem::path& file, const Limits& limits) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error(fmt::format("{}: cannot open: {}", file.string(), std::strerror(errno)));
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0) throw Error(fmt::format("{}: cannot determine the size", file.string()));
  if (static_cast<std::uint64_t>(size) > std::min(limits.max_input_bytes, kHardMaxInput)) {
    throw ParseError::at_offset(file.string(), 0,
                                fmt::format("file of {} bytes exceeds the limit", size));
  }
  std::string bytes(static_cast<std::size_t>(size), '\0');
  in.seekg(0, std::ios::beg);
  if (!in.read(bytes.data(), size)) throw Error(fmt::format("{}: read failed", file.string()));
  return parse(std::move(bytes), file.string(), limits);
}

Value Document::root() const noexcept { return Value(data_.get(), data_->root); }
const std::string& Document::source() const noexcept { return data_->source; }
std::size_t Document::node_count() const noexcept { return data_->nodes.size(); }
int Document::protocol() const noexcept { return data_->protocol; }

// ---------------------------------------------------------------------------------------------
// Value

namespace {
const Node& node_of(const detail::Data* d, std::uint32_t id) { return d->nodes[id]; }
}  // namespace

Kind Value::kind() const noexcept { return node_of(data_, node_).kind; }

const char* Value::type_name() const noexcept {
  const Node& n = node_of(data_, node_);
  if (n.kind == Kind::bytes && (n.flags & detail::kByteArray)) return "bytearray";
  return kind_name(n.kind);
}

const std::string& Value::source() const noexcept { return data_->source; }

void Value::fail(std::string_view reason) const {
  throw ParseError::at_path(data_->source, path(), std::string(reason));
}

void Value::fail_expected(std::string_view what) const {
  fail(fmt::format("expected {}, got {}", what, type_name()));
}

void Value::expect(Kind k) const {
  if (kind() != k) fail_expected(kind_name(k));
}

void Value::expect_container(Kind a, Kind b) const {
  if (kind() != a && kind() != b)
    fail_expected(fmt::format("{} or {}", kind_name(a), kind_name(b)));
}

std::uint32_t Value::count() const noexcept { return node_of(data_, node_).count; }

bool Value::as_bool() const {
  expect(Kind::boolean);
  return node_of(data_, node_).payload != 0;
}

std::int64_t Value::as_int() const {
  expect(Kind::integer);
  const Node& n = node_of(data_, node_);
  if (n.flags & detail::kUnsigned) fail(fmt::format("int {} does not fit in int64", n.payload));
  return static_cast<std::int64_t>(n.payload);
}

std::uint64_t Value::as_uint() const {
  expect(Kind::integer);
  const Node& n = node_of(data_, node_);
  if (n.flags & detail::kUnsigned) return n.payload;
  const auto v = static_cast<std::int64_t>(n.payload);
  if (v < 0) fail(fmt::format("expected a non-negative int, got {}", v));
  return n.payload;
}

double Value::as_float() const {
  const Node& n = node_of(data_, node_);
  if (n.kind == Kind::floating) return std::bit_cast<double>(n.payload);
  if (n.kind == Kind::integer) {
    if (n.flags & detail::kUnsigned) return static_cast<double>(n.payload);
    return static_cast<double>(static_cast<std::int64_t>(n.payload));
  }
  fail_expected("float");
}

std::string_view Value::as_string() const {
  expect(Kind::string);
  const Node& n = node_of(data_, node_);
  return std::string_view(data_->bytes).substr(n.payload, n.count);
}

std::string_view Value::as_bytes() const {
  expect(Kind::bytes);
  const Node& n = node_of(data_, node_);
  return std::string_view(data_->bytes).substr(n.payload, n.count);
}

std::size_t Value::size() const {
  switch (kind()) {
    case Kind::string:
    case Kind::bytes:
    case Kind::list:
    case Kind::tuple:
    case Kind::dict: return count();
    default: break;
  }
  fail_expected("a container, str or bytes");
}

Value Value::child(std::uint32_t node, std::uint32_t position) const noexcept {
  Value c = *this;
  c.node_ = node;
  const detail::PathStep step{node_, position};
  if (depth_ < detail::kPathSteps) {
    c.steps_[depth_] = step;
  } else {
    // Keep the first half fixed and slide the second half (rendered with "[...]" between).
    constexpr std::size_t half = detail::kPathSteps / 2;
    std::copy(c.steps_.begin() + half + 1, c.steps_.end(), c.steps_.begin() + half);
    c.steps_.back() = step;
  }
  c.depth_ = depth_ + 1;
  return c;
}

Value Value::operator[](std::size_t index) const {
  return child(element_id(index), static_cast<std::uint32_t>(index));
}

std::uint32_t Value::element_id(std::size_t index) const {
  expect_container(Kind::list, Kind::tuple);
  if (index >= count()) fail(fmt::format("index {} out of range (size {})", index, count()));
  return data_->children[node_of(data_, node_).payload + index];
}

std::optional<Value> Value::find(std::string_view key) const {
  expect(Kind::dict);
  const Node& n = node_of(data_, node_);
  const std::uint32_t* kids = data_->children.data() + n.payload;
  // Scan from the end: with duplicate keys (never written by Python's pickler) the last wins,
  // as in Python.
  for (std::uint32_t i = n.count; i-- > 0;) {
    const Node& k = node_of(data_, kids[2 * std::uint64_t{i}]);
    if (k.kind != Kind::string || k.count != key.size()) continue;
    if (std::string_view(data_->bytes).substr(k.payload, k.count) == key)
      return child(kids[2 * std::uint64_t{i} + 1], i);
  }
  return std::nullopt;
}

Value Value::operator[](std::string_view key) const {
  std::optional<Value> v = find(key);
  if (!v) fail(fmt::format("missing key '{}'", key));
  return *v;
}

ElementRange Value::elements() const { return ElementRange(*this); }
ItemRange Value::items() const { return ItemRange(*this); }

namespace {

void append_step(std::string& out, const detail::Data* d, const detail::PathStep& step) {
  const Node& c = d->nodes[step.container];
  if (c.kind != Kind::dict) {
    out += fmt::format("[{}]", step.position);
    return;
  }
  const Node& k = d->nodes[d->children[c.payload + 2 * std::uint64_t{step.position}]];
  if (k.kind == Kind::string) {
    const std::string_view key = std::string_view(d->bytes).substr(k.payload, k.count);
    if (is_identifier(key)) {
      if (!out.empty()) out += '.';
      out += key;
    } else {
      out += fmt::format("['{}']", key);
    }
  } else if (k.kind == Kind::integer && !(k.flags & detail::kUnsigned)) {
    out += fmt::format("[{}]", static_cast<std::int64_t>(k.payload));
  } else {
    out += fmt::format("[<{} key>]", kind_name(k.kind));
  }
}

}  // namespace

std::string Value::path() const {
  std::string out;
  const std::size_t kept = std::min<std::size_t>(depth_, detail::kPathSteps);
  for (std::size_t i = 0; i < kept; ++i) {
    if (depth_ > detail::kPathSteps && i == detail::kPathSteps / 2) out += "[...]";
    append_step(out, data_, steps_[i]);
  }
  return out;
}

ElementRange::ElementRange(const Value& parent) : IndexedRange(parent) {
  parent.expect_container(Kind::list, Kind::tuple);
  size_ = parent.count();
}

Value ElementRange::at(const Value& parent, std::uint32_t index) { return parent[index]; }

ItemRange::ItemRange(const Value& parent) : IndexedRange(parent) {
  parent.expect(Kind::dict);
  size_ = parent.count();
}

std::pair<Value, Value> ItemRange::at(const Value& parent, std::uint32_t index) {
  const detail::Data* d = parent.data_;
  const std::uint64_t base = d->nodes[parent.node_].payload + 2 * std::uint64_t{index};
  // The key's path is the entry's path too: it names the entry whose key is wrong.
  return {parent.child(d->children[base], index), parent.child(d->children[base + 1], index)};
}

}  // namespace tensorpool::trace::pickle
