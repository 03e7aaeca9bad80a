// tensorpool/trace/pickle_writer.hpp: writes Python pickles that hold only plain data.
//
// The output is protocol 4 with no framing and no memo, built only from opcodes that Python's
// unpickler, tensorpool's own reader (pickle.hpp) and the JavaScript unpickler of PyTorch's
// memory viewer (pytorch.org/memory_viz) all accept: EMPTY_DICT/EMPTY_LIST + MARK + SETITEMS/
// APPENDS (in batches of 1000), MARK + TUPLE, BININT1/BININT2/BININT/LONG1, BINFLOAT,
// SHORT_BINUNICODE/BINUNICODE, NONE, NEWTRUE/NEWFALSE. No GLOBAL, REDUCE or any opcode that
// imports or calls: a restricted unpickler that refuses every global loads it.
//
//   pickle::Writer w;
//   w.begin_dict();
//   w.key("segments"); w.begin_list(); ... w.end_list();
//   w.end_dict();
//   std::string bytes = w.finish();
//
// Misuse (a value where a dict key is due, end_list() closing a dict, finish() with containers
// open, a string over 4 GiB) throws UsageError; the writer is then unusable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tensorpool::trace::pickle {

namespace opcodes {
enum class Opcode : std::uint8_t;  // pickle_opcodes.hpp (private to the library)
}

class Writer {
 public:
  Writer();

  void none();
  void boolean(bool v);
  void integer(std::int64_t v);
  void unsigned_integer(std::uint64_t v);
  void floating(double v);
  void string(std::string_view utf8);

  void begin_dict();
  /// The next dict entry's key (a str); its value follows.
  void key(std::string_view utf8);
  void end_dict();
  void begin_list();
  void end_list();
  void begin_tuple();
  void end_tuple();

  /// Closes the pickle (STOP) and returns it. Exactly one top-level value must have been written.
  std::string finish();

 private:
  enum class Kind : std::uint8_t { dict, list, tuple };
  struct Open {
    Kind kind;
    std::size_t batch = 0;   // items since the last MARK (dict: keys and values both count)
    bool key_due = true;     // dict: the next item is a key
  };
  void open(Kind kind);                    // begin_dict / begin_list / begin_tuple
  void close(Kind kind, const char* call);  // end_dict / end_list / end_tuple
  void before_value();
  void after_item();
  void close_batch(Open& o);
  void op(opcodes::Opcode code) { out_.push_back(static_cast<char>(code)); }  // src/trace/pickle_opcodes.hpp
  void byte(std::uint8_t b) { out_.push_back(static_cast<char>(b)); }  // an opcode's argument
  void raw_string(std::string_view utf8);

  std::string out_;
  std::vector<Open> open_;
  bool root_written_ = false;
  bool finished_ = false;
};

}  // namespace tensorpool::trace::pickle
