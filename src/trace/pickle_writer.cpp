// The plain-data pickle writer: a streaming emitter of protocol-4 opcodes (see pickle_writer.hpp).
//
// Invariants of the open-container stack (open_):
//  - a dict or list has a MARK outstanding exactly when its batch is non-zero (the MARK is
//    emitted lazily before its first item, so an empty container is EMPTY_DICT / EMPTY_LIST only);
//  - a tuple's MARK is emitted by begin_tuple(); its items are never batched;
//  - a dict's items alternate key, value: key_due is true between entries.
#include "tensorpool/trace/pickle_writer.hpp"

#include <bit>
#include <limits>

#include "tensorpool/errors.hpp"
#include "trace/pickle_opcodes.hpp"

namespace tensorpool::trace::pickle {

namespace {

using opcodes::Opcode;

// Python's own batch size: SETITEMS/APPENDS every 1000 entries.
constexpr std::size_t kBatchEntries = 1000;

[[noreturn]] void misuse(const std::string& what) { throw UsageError("pickle writer: " + what); }

void append_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

Writer::Writer() {
  op(Opcode::proto);
  byte(4);
}

void Writer::before_value() {
  if (finished_) misuse("value after finish()");
  if (open_.empty()) {
    if (root_written_) misuse("a second top-level value");
    return;
  }
  Open& o = open_.back();
  if (o.kind == Kind::dict && o.key_due)
    misuse("a value where a dict key is due (call key() first)");
  if (o.kind != Kind::tuple && o.batch == 0) op(Opcode::mark);
}

void Writer::after_item() {
  if (open_.empty()) {
    root_written_ = true;
    return;
  }
  Open& o = open_.back();
  ++o.batch;
  if (o.kind == Kind::dict) o.key_due = true;
  const std::size_t limit = o.kind == Kind::dict ? 2 * kBatchEntries : kBatchEntries;
  if (o.kind != Kind::tuple && o.batch >= limit) close_batch(o);
}

void Writer::close_batch(Open& o) {
  if (o.batch == 0) return;
  op(o.kind == Kind::dict ? Opcode::setitems : Opcode::appends);
  o.batch = 0;
}

void Writer::none() {
  before_value();
  op(Opcode::none);
  after_item();
}

void Writer::boolean(bool v) {
  before_value();
  op(v ? Opcode::newtrue : Opcode::newfalse);
  after_item();
}

void Writer::integer(std::int64_t v) {
  before_value();
  if (v >= 0 && v < 256) {
    op(Opcode::binint1);
    append_le(out_, static_cast<std::uint64_t>(v), 1);
  } else if (v >= 0 && v < 65536) {
    op(Opcode::binint2);
    append_le(out_, static_cast<std::uint64_t>(v), 2);
  } else if (v >= std::numeric_limits<std::int32_t>::min() &&
             v <= std::numeric_limits<std::int32_t>::max()) {
    op(Opcode::binint);
    append_le(out_, static_cast<std::uint64_t>(v), 4);
  } else {
    // LONG1: the shortest little-endian two's complement whose top bit carries the sign.
    const auto bits = static_cast<std::uint64_t>(v);
    int n = 8;
    while (n > 1) {
      const auto top = static_cast<std::uint8_t>(bits >> (8 * (n - 1)));
      const bool next_negative = ((bits >> (8 * (n - 1) - 1)) & 1) != 0;
      if ((top == 0x00 && !next_negative) || (top == 0xff && next_negative))
        --n;
      else
        break;
    }
    op(Opcode::long1);
    byte(static_cast<std::uint8_t>(n));
    append_le(out_, bits, n);
  }
  after_item();
}

void Writer::unsigned_integer(std::uint64_t v) {
  if (v <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    integer(static_cast<std::int64_t>(v));
    return;
  }
  before_value();
  op(Opcode::long1);
  byte(9);  // eight magnitude bytes and a zero sign byte
  append_le(out_, v, 8);
  out_.push_back('\0');
  after_item();
}

void Writer::floating(double v) {
  before_value();
  op(Opcode::binfloat);
  const auto bits = std::bit_cast<std::uint64_t>(v);
  for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  after_item();
}

void Writer::raw_string(std::string_view utf8) {
  if (utf8.size() < 256) {
    op(Opcode::short_binunicode);
    byte(static_cast<std::uint8_t>(utf8.size()));
  } else if (utf8.size() <= std::numeric_limits<std::uint32_t>::max()) {
    op(Opcode::binunicode);
    append_le(out_, utf8.size(), 4);
  } else {
    misuse("a string of 4 GiB or more");
  }
  out_.append(utf8);
}

void Writer::string(std::string_view utf8) {
  before_value();
  raw_string(utf8);
  after_item();
}

void Writer::key(std::string_view utf8) {
  if (finished_ || open_.empty() || open_.back().kind != Kind::dict || !open_.back().key_due)
    misuse("key() outside a dict, or two keys in a row");
  Open& o = open_.back();
  if (o.batch == 0) op(Opcode::mark);
  raw_string(utf8);
  ++o.batch;
  o.key_due = false;
}

void Writer::open(Kind kind) {
  before_value();
  op(kind == Kind::dict ? Opcode::empty_dict : kind == Kind::list ? Opcode::empty_list : Opcode::mark);
  open_.push_back(Open{kind});
}

void Writer::close(Kind kind, const char* call) {
  if (open_.empty() || open_.back().kind != kind)
    misuse(std::string(call) + " without its open container");
  if (kind == Kind::dict && !open_.back().key_due)
    misuse("end_dict() after a key without its value");
  if (kind == Kind::tuple) {
    op(Opcode::tuple);
  } else {
    close_batch(open_.back());
  }
  open_.pop_back();
  after_item();
}

void Writer::begin_dict() { open(Kind::dict); }
void Writer::end_dict() { close(Kind::dict, "end_dict()"); }
void Writer::begin_list() { open(Kind::list); }
void Writer::end_list() { close(Kind::list, "end_list()"); }
void Writer::begin_tuple() { open(Kind::tuple); }
void Writer::end_tuple() { close(Kind::tuple, "end_tuple()"); }

std::string Writer::finish() {
  if (finished_) misuse("finish() called twice");
  if (!open_.empty()) misuse("finish() with containers still open");
  if (!root_written_) misuse("finish() before any value");
  op(Opcode::stop);
  finished_ = true;
  return std::move(out_);
}

}  // namespace tensorpool::trace::pickle
