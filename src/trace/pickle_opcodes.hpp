// pickle_opcodes.hpp: the pickle opcodes (names as in Python's pickletools), one table for the
// reader (pickle.cpp) and the writer (pickle_writer.cpp).
//
// Every opcode of protocols 0 to 5 is an Opcode enumerator and has one row in kOpcodeTable saying
// how the reader treats it: read (plain data), forbidden (imports or calls code) or unsupported
// (with the reason). The reader dispatches the plain ones in a switch over Opcode with no
// default, compiled with -Werror=switch, so an opcode added here without a reader case does not
// build; the checks at the end of this file keep the table and the enumeration in step.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace tensorpool::trace::pickle::opcodes {

enum class Opcode : std::uint8_t {
  // read: structure
  mark = '(', stop = '.', pop = '0', pop_mark = '1', dup = '2', proto = 0x80, frame = 0x95,
  // read: scalars
  none = 'N', newtrue = 0x88, newfalse = 0x89, binint = 'J', binint1 = 'K', binint2 = 'M',
  long1 = 0x8a, long4 = 0x8b, binfloat = 'G',
  // read: length-prefixed text and bytes
  short_binstring = 'U', binstring = 'T', short_binunicode = 0x8c, binunicode = 'X',
  binunicode8 = 0x8d, short_binbytes = 'C', binbytes = 'B', binbytes8 = 0x8e, bytearray8 = 0x96,
  // read: containers
  empty_list = ']', empty_dict = '}', empty_tuple = ')', tuple1 = 0x85, tuple2 = 0x86,
  tuple3 = 0x87, tuple = 't', list = 'l', dict = 'd', append = 'a', appends = 'e', setitem = 's',
  setitems = 'u',
  // read: the memo
  binput = 'q', long_binput = 'r', memoize = 0x94, binget = 'h', long_binget = 'j',
  // forbidden: they import or call code
  global = 'c', stack_global = 0x93, reduce = 'R', build = 'b', inst = 'i', obj = 'o',
  newobj = 0x81, newobj_ex = 0x92, ext1 = 0x82, ext2 = 0x83, ext4 = 0x84, persid = 'P',
  binpersid = 'Q',
  // unsupported
  int_text = 'I', long_text = 'L', float_text = 'F', string_text = 'S', unicode_text = 'V',
  put_text = 'p', get_text = 'g', empty_set = 0x8f, additems = 0x90, frozenset = 0x91,
  next_buffer = 0x97, readonly_buffer = 0x98,
};

enum class Treatment : std::uint8_t { unknown, read, forbidden, unsupported };

struct OpcodeInfo {
  Opcode op{};
  const char* name = nullptr;  // pickletools' name
  Treatment treatment = Treatment::unknown;
  const char* why = "";  // for unsupported opcodes
};

inline constexpr const char* kWhyText = "a protocol 0 text opcode (only protocols 2 to 5 are read)";
inline constexpr const char* kWhySet = "sets are not plain data";
inline constexpr const char* kWhyBuffer = "out-of-band buffers are not supported";

inline constexpr std::array kOpcodeTable = std::to_array<OpcodeInfo>({
    {Opcode::mark, "MARK", Treatment::read},
    {Opcode::stop, "STOP", Treatment::read},
    {Opcode::pop, "POP", Treatment::read},
    {Opcode::pop_mark, "POP_MARK", Treatment::read},
    {Opcode::dup, "DUP", Treatment::read},
    {Opcode::proto, "PROTO", Treatment::read},
    {Opcode::frame, "FRAME", Treatment::read},
    {Opcode::none, "NONE", Treatment::read},
    {Opcode::newtrue, "NEWTRUE", Treatment::read},
    {Opcode::newfalse, "NEWFALSE", Treatment::read},
    {Opcode::binint, "BININT", Treatment::read},
    {Opcode::binint1, "BININT1", Treatment::read},
    {Opcode::binint2, "BININT2", Treatment::read},
    {Opcode::long1, "LONG1", Treatment::read},
    {Opcode::long4, "LONG4", Treatment::read},
    {Opcode::binfloat, "BINFLOAT", Treatment::read},
    {Opcode::short_binstring, "SHORT_BINSTRING", Treatment::read},
    {Opcode::binstring, "BINSTRING", Treatment::read},
    {Opcode::short_binunicode, "SHORT_BINUNICODE", Treatment::read},
    {Opcode::binunicode, "BINUNICODE", Treatment::read},
    {Opcode::binunicode8, "BINUNICODE8", Treatment::read},
    {Opcode::short_binbytes, "SHORT_BINBYTES", Treatment::read},
    {Opcode::binbytes, "BINBYTES", Treatment::read},
    {Opcode::binbytes8, "BINBYTES8", Treatment::read},
    {Opcode::bytearray8, "BYTEARRAY8", Treatment::read},
    {Opcode::empty_list, "EMPTY_LIST", Treatment::read},
    {Opcode::empty_dict, "EMPTY_DICT", Treatment::read},
    {Opcode::empty_tuple, "EMPTY_TUPLE", Treatment::read},
    {Opcode::tuple1, "TUPLE1", Treatment::read},
    {Opcode::tuple2, "TUPLE2", Treatment::read},
    {Opcode::tuple3, "TUPLE3", Treatment::read},
    {Opcode::tuple, "TUPLE", Treatment::read},
    {Opcode::list, "LIST", Treatment::read},
    {Opcode::dict, "DICT", Treatment::read},
    {Opcode::append, "APPEND", Treatment::read},
    {Opcode::appends, "APPENDS", Treatment::read},
    {Opcode::setitem, "SETITEM", Treatment::read},
    {Opcode::setitems, "SETITEMS", Treatment::read},
    {Opcode::binput, "BINPUT", Treatment::read},
    {Opcode::long_binput, "LONG_BINPUT", Treatment::read},
    {Opcode::memoize, "MEMOIZE", Treatment::read},
    {Opcode::binget, "BINGET", Treatment::read},
    {Opcode::long_binget, "LONG_BINGET", Treatment::read},
    {Opcode::global, "GLOBAL", Treatment::forbidden},
    {Opcode::stack_global, "STACK_GLOBAL", Treatment::forbidden},
    {Opcode::reduce, "REDUCE", Treatment::forbidden},
    {Opcode::build, "BUILD", Treatment::forbidden},
    {Opcode::inst, "INST", Treatment::forbidden},
    {Opcode::obj, "OBJ", Treatment::forbidden},
    {Opcode::newobj, "NEWOBJ", Treatment::forbidden},
    {Opcode::newobj_ex, "NEWOBJ_EX", Treatment::forbidden},
    {Opcode::ext1, "EXT1", Treatment::forbidden},
    {Opcode::ext2, "EXT2", Treatment::forbidden},
    {Opcode::ext4, "EXT4", Treatment::forbidden},
    {Opcode::persid, "PERSID", Treatment::forbidden},
    {Opcode::binpersid, "BINPERSID", Treatment::forbidden},
    {Opcode::int_text, "INT", Treatment::unsupported, kWhyText},
    {Opcode::long_text, "LONG", Treatment::unsupported, kWhyText},
    {Opcode::float_text, "FLOAT", Treatment::unsupported, kWhyText},
    {Opcode::string_text, "STRING", Treatment::unsupported, kWhyText},
    {Opcode::unicode_text, "UNICODE", Treatment::unsupported, kWhyText},
    {Opcode::put_text, "PUT", Treatment::unsupported, kWhyText},
    {Opcode::get_text, "GET", Treatment::unsupported, kWhyText},
    {Opcode::empty_set, "EMPTY_SET", Treatment::unsupported, kWhySet},
    {Opcode::additems, "ADDITEMS", Treatment::unsupported, kWhySet},
    {Opcode::frozenset, "FROZENSET", Treatment::unsupported, kWhySet},
    {Opcode::next_buffer, "NEXT_BUFFER", Treatment::unsupported, kWhyBuffer},
    {Opcode::readonly_buffer, "READONLY_BUFFER", Treatment::unsupported, kWhyBuffer},
});

/// The table indexed by byte (Treatment::unknown where no opcode has that value).
constexpr std::array<OpcodeInfo, 256> by_byte() {
  std::array<OpcodeInfo, 256> t{};
  for (const OpcodeInfo& info : kOpcodeTable) t[static_cast<std::uint8_t>(info.op)] = info;
  return t;
}
inline constexpr std::array<OpcodeInfo, 256> kOpcodeByByte = by_byte();

constexpr bool each_byte_once() {
  std::array<int, 256> seen{};
  for (const OpcodeInfo& info : kOpcodeTable)
    if (++seen[static_cast<std::uint8_t>(info.op)] > 1 || info.name == nullptr) return false;
  return true;
}
static_assert(each_byte_once(), "an opcode listed twice, or without a name");
// One row per enumerator: the enumeration above has 68 opcodes.
static_assert(kOpcodeTable.size() == 68, "kOpcodeTable and Opcode disagree");

}  // namespace tensorpool::trace::pickle::opcodes
