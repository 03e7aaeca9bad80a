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

namespace tensorpool::trace::pickle {

namespace {

// The opcodes written (names as in Python's pickletools).
constexpr std::uint8_t kProto = 0x80;
constexpr std::uint8_t kStop = '.';
constexpr std::uint8_t kMark = '(';
constexpr std::uint8_t kNone = 'N';
constexpr std::uint8_t kNewTrue = 0x88;
constexpr std::uint8_t kNewFalse = 0x89;
constexpr std::uint8_t kBinInt1 = 'K';
constexpr std::uint8_t kBinInt2 = 'M';
constexpr std::uint8_t kBinInt = 'J';
constexpr std::uint8_t kLong1 = 0x8a;
constexpr std::uint8_t kBinFloat = 'G';
constexpr std::uint8_t kShortBinUnicode = 0x8c;
constexpr std::uint8_t kBinUnicode = 'X';
constexpr std::uint8_t kEmptyDict = '}';
constexpr std::uint8_t kSetItems = 'u';
constexpr std::uint8_t kEmptyList = ']';
constexpr std::uint8_t kAppends = 'e';
constexpr std::uint8_t kTuple = 't';

// Python's own batch size: SETITEMS/APPENDS every 1000 entries.
constexpr std::size_t kBatchEntries = 1000;

[[noreturn]] void misuse(const std::string& what) { throw UsageError("pickle writer: " + what); }

void append_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

Writer::Writer() {
  op(kProto);
  op(4);
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
  if (o.kind != Kind::tuple && o.batch == 0) op(kMark);
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
  op(o.kind == Kind::dict ? kSetItems : kAppends);
  o.batch = 0;
}

void Writer::none() {
  before_value();
  op(kNone);
  after_item();
}

void Writer::boolean(bool v) {
  before_value();
  op(v ? kNewTrue : kNewFalse);
  after_item();
}

void Writer::integer(std::int64_t v) {
  before_value();
  if (v >= 0 && v < 256) {
    op(kBinInt1);
    append_le(out_, static_cast<std::uint64_t>(v), 1);
  } else if (v >= 0 && v < 65536) {
    op(kBinInt2);
    append_le(out_, static_cast<std::uint64_t>(v), 2);
  } else if (v >= std::numeric_limits<std::int32_t>::min() &&
             v <= std::numeric_limits<std::int32_t>::max()) {
    op(kBinInt);
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
    op(kLong1);
    op(static_cast<std::uint8_t>(n));
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
  op(kLong1);
  op(9);  // eight magnitude bytes and a zero sign byte
  append_le(out_, v, 8);
  out_.push_back('\0');
  after_item();
}

void Writer::floating(double v) {
  before_value();
  op(kBinFloat);
  const auto bits = std::bit_cast<std::uint64_t>(v);
  for (int i = 7; i >= 0; --i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  after_item();
}

void Writer::raw_string(std::string_view utf8) {
  if (utf8.size() < 256) {
    op(kShortBinUnicode);
    op(static_cast<std::uint8_t>(utf8.size()));
  } else if (utf8.size() <= std::numeric_limits<std::uint32_t>::max()) {
    op(kBinUnicode);
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
  if (o.batch == 0) op(kMark);
  raw_string(utf8);
  ++o.batch;
  o.key_due = false;
}

void Writer::open(Kind kind) {
  before_value();
  op(kind == Kind::dict ? kEmptyDict : kind == Kind::list ? kEmptyList : kMark);
  open_.push_back(Open{kind});
}

void Writer::close(Kind kind, const char* call) {
  if (open_.empty() || open_.back().kind != kind)
    misuse(std::string(call) + " without its open container");
  if (kind == Kind::dict && !open_.back().key_due)
    misuse("end_dict() after a key without its value");
  if (kind == Kind::tuple) {
    op(kTuple);
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
  op(kStop);
  finished_ = true;
  return std::move(out_);
}

}  // namespace tensorpool::trace::pickle
