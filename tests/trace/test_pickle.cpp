// Tests of the plain-data pickle reader (trace/pickle.hpp): every plain opcode Python emits at
// protocols 2 to 5 (fixtures from make_fixtures.py), memo sharing, the Value API and its path
// errors, and hand-built malformed input: each truncation point, each forbidden and unsupported
// opcode, unknown opcodes, bad memo indices, stack and MARK misuse, limits; plus random damage.
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "support/skip.hpp"
#include "tensorpool/trace/pickle.hpp"

namespace fs = std::filesystem;
using namespace tensorpool::trace::pickle;
using namespace std::string_literals;  // "...\x00..."s keeps the NULs

namespace {

fs::path fixture(const std::string& name) { return fs::path(TENSORPOOL_IMPORTER_FIXTURES) / name; }

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

/// Parses `bytes`, which must fail; returns the error.
ParseError parse_error(const std::string& bytes, const Limits& limits = {}) {
  try {
    (void)Document::parse(bytes, "test.pickle", limits);
  } catch (const ParseError& e) {
    return e;
  }
  FAIL("expected a ParseError");
  throw std::logic_error("unreachable");
}

template <typename F>
ParseError value_error(F&& f) {
  try {
    f();
  } catch (const ParseError& e) {
    return e;
  }
  FAIL("expected a ParseError");
  throw std::logic_error("unreachable");
}

void check_offset_error(const std::string& bytes, std::uint64_t offset, const std::string& text) {
  const ParseError e = parse_error(bytes);
  INFO(e.what());
  CHECK(e.has_offset());
  CHECK(e.offset() == offset);
  CHECK(e.source() == "test.pickle");
  CHECK_THAT(e.what(), Catch::Contains(text));
  CHECK_THAT(e.what(), Catch::StartsWith("test.pickle: offset " + std::to_string(offset) + ": "));
}

std::string le32(std::uint32_t v) {
  std::string s;
  for (int i = 0; i < 4; ++i) s += static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}

std::string le64(std::uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s += static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}

const std::string kProto2 = "\x80\x02";

// A small valid protocol 2 pickle, opcode by opcode:
// {'a': [1, 256, -1, -1, 1.5, None, True], 'b': <the same list>}
const std::vector<std::string> kSmallOps = {
    std::string("\x80\x02", 2),                           // PROTO 2
    "}",                                                  // EMPTY_DICT
    std::string("q\x00", 2),                              // BINPUT 0
    "(",                                                  // MARK
    "X" + le32(1) + "a",                                  // BINUNICODE 'a'
    std::string("q\x01", 2),                              // BINPUT 1
    "]",                                                  // EMPTY_LIST
    std::string("q\x02", 2),                              // BINPUT 2
    "(",                                                  // MARK
    std::string("K\x01", 2),                              // BININT1 1
    std::string("M\x00\x01", 3),                          // BININT2 256
    std::string("J\xff\xff\xff\xff", 5),                  // BININT -1
    std::string("\x8a\x01\xff", 3),                       // LONG1 -1
    std::string("G\x3f\xf8\x00\x00\x00\x00\x00\x00", 9),  // BINFLOAT 1.5
    "N",                                                  // NONE
    "\x88",                                               // NEWTRUE
    "e",                                                  // APPENDS
    "X" + le32(1) + "b",                                  // BINUNICODE 'b'
    std::string("h\x02", 2),                              // BINGET 2
    "u",                                                  // SETITEMS
    ".",                                                  // STOP
};

std::string join(const std::vector<std::string>& ops) {
  std::string s;
  for (const auto& op : ops) s += op;
  return s;
}

void check_ints(const Value& ints) {
  const std::vector<std::int64_t> expected = {0,
                                              1,
                                              255,
                                              256,
                                              65535,
                                              65536,
                                              -1,
                                              -256,
                                              2147483647LL,
                                              -2147483648LL,
                                              2147483648LL,
                                              -2147483649LL,
                                              std::int64_t{1} << 62,
                                              -(std::int64_t{1} << 62),
                                              std::numeric_limits<std::int64_t>::max(),
                                              std::numeric_limits<std::int64_t>::min()};
  REQUIRE(ints.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    INFO("ints[" << i << "]");
    CHECK(ints[i].kind() == Kind::integer);
    CHECK(ints[i].as_int() == expected[i]);
  }
}

void check_scalars(const Value& v) {
  CHECK(v["none"].is_none());
  CHECK(v["true"].as_bool());
  CHECK_FALSE(v["false"].as_bool());
  check_ints(v["ints"]);
  const Value uints = v["uints"];
  CHECK(uints[0].as_uint() == (std::uint64_t{1} << 63));
  CHECK(uints[1].as_uint() == std::numeric_limits<std::uint64_t>::max());
  const Value floats = v["floats"];
  CHECK(floats[0].as_float() == 0.0);
  CHECK(floats[1].as_float() == -1.5);
  CHECK(floats[2].as_float() == 1e300);
  CHECK(floats[3].as_float() == 5e-324);
  CHECK(floats[4].as_float() == std::numeric_limits<double>::infinity());
  CHECK(floats[5].as_float() == -std::numeric_limits<double>::infinity());
  const Value strings = v["strings"];
  CHECK(strings[0].as_string().empty());
  CHECK(strings[1].as_string() == "ascii");
  CHECK(strings[2].as_string() == "h\xC3\xA9llo w\xC3\xB6rld \xE2\x9C\x93");
  CHECK(strings[3].as_string() == "\xF0\x9F\x98\x80");
  CHECK(strings[4].as_string() == std::string(300, 'x'));
}

void check_containers(const Value& v) {
  const Value empty = v["empty"];
  CHECK(empty[0].kind() == Kind::list);
  CHECK(empty[0].size() == 0);
  CHECK(empty[1].kind() == Kind::dict);
  CHECK(empty[1].size() == 0);
  CHECK(empty[2].kind() == Kind::tuple);
  CHECK(empty[2].size() == 0);
  CHECK(empty[3].as_string().empty());
  const Value tuples = v["tuples"];
  for (std::size_t i = 0; i < 4; ++i) {
    const std::size_t n = i < 3 ? i + 1 : 5;
    REQUIRE(tuples[i].kind() == Kind::tuple);
    REQUIRE(tuples[i].size() == n);
    for (std::size_t j = 0; j < n; ++j)
      CHECK(tuples[i][j].as_int() == static_cast<std::int64_t>(j + 1));
  }
  const Value nested = v["nested"]["a"];
  CHECK(nested[0].as_int() == 1);
  CHECK(nested[1][0].as_int() == 2);
  CHECK(nested[1][1][0].as_int() == 3);
  CHECK(nested[1][1][1]["b"].is_none());
  CHECK(nested[1][1][1]["b"].path() == "nested.a[1][1][1].b");
  CHECK(v["one"]["only"][0].as_int() == 42);
}

void check_long_and_shared(const Value& v) {
  const Value long_list = v["long_list"];
  REQUIRE(long_list.size() == 2500);
  std::int64_t expect = 0;
  for (const Value item : long_list.elements()) CHECK(item.as_int() == expect++);
  const Value long_dict = v["long_dict"];
  REQUIRE(long_dict.size() == 1001);
  std::int64_t i = 0;
  for (const auto& [key, value] : long_dict.items()) {
    CHECK(key.as_string() == "k" + std::to_string(i));
    CHECK(value.as_int() == i);
    ++i;
  }
  CHECK(long_dict["k777"].as_int() == 777);
  // Memo references share the node instead of copying it.
  const Value shared = v["shared"];
  CHECK(shared[0].node_id() == shared[1].node_id());
  CHECK(shared[0]["k"].node_id() == shared[2].node_id());
  CHECK(shared[2][1].as_int() == 2);
  CHECK(v["shared_str"][0].node_id() == v["shared_str"][1].node_id());
  CHECK(v["shared_str"][1].as_string() == "shared-string");
  // element_id(i) is element i's node_id() without making its Value.
  for (std::size_t k = 0; k < shared.size(); ++k) CHECK(shared.element_id(k) == shared[k].node_id());
  CHECK(shared.element_id(0) == shared.element_id(1));
  CHECK(shared.element_id(0) != shared.element_id(2));
  const Value again = v["again"];
  CHECK(again[0].as_string() == "k500");
  CHECK(again[1].as_string() == "k1000");
}

void check_bytes(const Value& v, int protocol) {
  CHECK(v.contains("bytes") == (protocol >= 3));
  if (protocol >= 3) {
    const Value bytes = v["bytes"];
    CHECK(bytes[0].kind() == Kind::bytes);
    CHECK(bytes[0].as_bytes().empty());
    CHECK(bytes[1].as_bytes() == std::string("\x00\xff", 2));
    CHECK(bytes[2].as_bytes() == std::string(300, 'y'));
    CHECK(std::string(bytes[1].type_name()) == "bytes");
  }
  CHECK(v.contains("bytearray") == (protocol >= 5));
  if (protocol >= 5) {
    CHECK(v["bytearray"].as_bytes() == "abc");
    CHECK(std::string(v["bytearray"].type_name()) == "bytearray");
  }
}

}  // namespace

TEST_CASE("pickle: plain values at protocols 2 to 5", "[pickle]") {
  for (int protocol = 2; protocol <= 5; ++protocol) {
    DYNAMIC_SECTION("protocol " << protocol) {
      const Document doc =
          Document::load(fixture("plain_p" + std::to_string(protocol) + ".pickle"));
      CHECK(doc.protocol() == protocol);
      const Value v = doc.root();
      REQUIRE(v.kind() == Kind::dict);
      check_scalars(v);
      check_containers(v);
      check_long_and_shared(v);
      check_bytes(v, protocol);
    }
  }
}

TEST_CASE("pickle: a hand-built pickle and the rarer plain opcodes", "[pickle]") {
  const Document doc = Document::parse(join(kSmallOps));
  const Value root = doc.root();
  REQUIRE(root.size() == 2);
  const Value a = root["a"];
  CHECK(a.node_id() == root["b"].node_id());
  CHECK(a[0].as_int() == 1);
  CHECK(a[1].as_int() == 256);
  CHECK(a[2].as_int() == -1);
  CHECK(a[3].as_int() == -1);
  CHECK(a[4].as_float() == 1.5);
  CHECK(a[5].is_none());
  CHECK(a[6].as_bool());

  // MARK LIST, MARK DICT, MARK TUPLE, LONG4, SHORT_BINSTRING, BINSTRING, TUPLE3, POP, POP_MARK,
  // DUP, BINUNICODE8, BINBYTES8, MEMOIZE/BINGET of a scalar, a sparse LONG_BINPUT.
  const std::string rare = kProto2 + "((K\x01K\x02l(X" + le32(1) + "kK\x03" +
                           "d(K\x04K\x05K\x06K\x07t" + "\x8b" + le32(2) +
                           std::string("\x00\x01", 2) + "U\x02hiT" + le32(2) + "yo\x87" + "N0(NN1" +
                           "K\x09" + "2" + "\x86" + "\x8d" + le64(3) + "abc" + "\x8e" + le64(2) +
                           "zz" + "\x94h\x00"s + "r" + le32(300) + "j" + le32(300) + "t.";
  const Document rdoc = Document::parse(rare);
  const Value t = rdoc.root();
  REQUIRE(t.kind() == Kind::tuple);
  REQUIRE(t.size() == 9);
  CHECK(t[0].kind() == Kind::list);
  CHECK(t[0][1].as_int() == 2);
  CHECK(t[1]["k"].as_int() == 3);
  CHECK(t[2].size() == 4);
  CHECK(t[3][0].as_int() == 256);
  CHECK(t[3][1].as_string() == "hi");
  CHECK(t[3][2].as_string() == "yo");
  CHECK(t[4][0].as_int() == 9);  // DUP
  CHECK(t[4][1].as_int() == 9);
  CHECK(t[5].as_string() == "abc");
  CHECK(t[6].as_bytes() == "zz");
  CHECK(t[7].node_id() == t[6].node_id());  // MEMOIZE at index 0, BINGET 0
  CHECK(t[8].node_id() == t[6].node_id());  // LONG_BINPUT 300, LONG_BINGET 300
}

TEST_CASE("pickle: the Value API reports paths on type mismatches", "[pickle]") {
  const Document doc = Document::load(fixture("plain_p4.pickle"));
  const Value v = doc.root();
  ParseError e = value_error([&] { (void)v["ints"][3].as_string(); });
  CHECK_FALSE(e.has_offset());
  CHECK(e.path() == "ints[3]");
  CHECK(e.reason() == "expected str, got int");
  CHECK_THAT(e.what(), Catch::EndsWith("plain_p4.pickle: ints[3]: expected str, got int"));
  e = value_error([&] { (void)v["nested"]["a"][1]["x"]; });
  CHECK(e.path() == "nested.a[1]");
  CHECK(e.reason() == "expected dict, got tuple");
  e = value_error([&] { (void)v["nested"]["zz"]; });
  CHECK(e.path() == "nested");
  CHECK(e.reason() == "missing key 'zz'");
  e = value_error([&] { (void)v["tuples"][7]; });
  CHECK(e.reason() == "index 7 out of range (size 4)");
  e = value_error([&] { (void)v["tuples"].element_id(7); });
  CHECK(e.path() == "tuples");
  CHECK(e.reason() == "index 7 out of range (size 4)");
  e = value_error([&] { (void)v["nested"].element_id(0); });
  CHECK(e.reason() == "expected list or tuple, got dict");
  e = value_error([&] { (void)v["uints"][0].as_int(); });
  CHECK_THAT(e.reason(), Catch::Contains("does not fit in int64"));
  e = value_error([&] { (void)v["ints"][6].as_uint(); });
  CHECK(e.reason() == "expected a non-negative int, got -1");
  e = value_error([&] { (void)v["true"].as_int(); });
  CHECK(e.reason() == "expected int, got bool");
  e = value_error([&] { (void)v["none"].size(); });
  CHECK(e.path() == "none");
  e = value_error([&] { (void)v["strings"].items(); });
  CHECK(e.reason() == "expected dict, got list");
  CHECK(v["ints"][1].as_float() == 1.0);  // ints read as floats
  CHECK_FALSE(v.find("absent").has_value());
  CHECK(v.path().empty());
}

TEST_CASE("pickle: paths with unusual keys and deep nesting", "[pickle]") {
  // {'a b': {5: [None]}}
  const std::string odd = kProto2 + "}(X" + le32(3) + "a b}K\x05]N" + "asu.";
  const Document doc = Document::parse(odd, "odd");
  const Value none = doc.root()["a b"].items().begin().operator*().second[0];
  CHECK(none.path() == "['a b'][5][0]");
  // 20 nested lists: the path keeps the first and last 6 steps.
  std::string deep = kProto2;
  for (int i = 0; i < 20; ++i) deep += "]";
  deep += "N";
  for (int i = 0; i < 20; ++i) deep += "a";
  deep += ".";
  const Document ddoc = Document::parse(deep);
  Value v = ddoc.root();
  for (int i = 0; i < 20; ++i) v = v[0];
  CHECK(v.is_none());
  CHECK(v.path() == "[0][0][0][0][0][0][...][0][0][0][0][0][0]");
}

TEST_CASE("pickle: every truncation point is an error at the cut opcode", "[pickle]") {
  const std::string full = join(kSmallOps);
  std::vector<std::size_t> starts;
  std::size_t at = 0;
  for (const auto& op : kSmallOps) {
    starts.push_back(at);
    at += op.size();
  }
  for (std::size_t cut = 0; cut < full.size(); ++cut) {
    std::size_t expected = 0;
    for (std::size_t s : starts) {
      if (s <= cut) expected = s;
    }
    INFO("cut at " << cut);
    check_offset_error(full.substr(0, cut), expected, "truncated");
  }
  check_offset_error("", 0, "truncated: expected an opcode");
  check_offset_error(kProto2 + "G\x3f\xf8", 2, "truncated: expected 8 bytes for BINFLOAT");
  // A FRAME that declares more than is left is truncated at the FRAME.
  check_offset_error("\x80\x04\x95" + le64(100) + "N.", 2,
                     "truncated: FRAME declares 100 bytes, 2 left");
}

TEST_CASE("pickle: length fields never allocate beyond the input", "[pickle]") {
  check_offset_error(kProto2 + "\x8d" + le64(std::uint64_t{1} << 62) + "ab", 2,
                     "truncated: expected 4611686018427387904 bytes for BINUNICODE8 data");
  check_offset_error(kProto2 + "B" + le32(0xFFFFFFFF) + "ab", 2,
                     "expected 4294967295 bytes for BINBYTES data");
  check_offset_error(kProto2 + "\x8e" + le64(~std::uint64_t{0}), 2, "BINBYTES8 data");
  check_offset_error(kProto2 + "\x96" + le64(1000), 2, "BYTEARRAY8 data");
  check_offset_error(kProto2 + "\x8b" + le32(0x80000000), 2, "negative length for LONG4");
  check_offset_error(kProto2 + "T" + le32(0xFFFFFFF0), 2, "negative length for BINSTRING");
  check_offset_error(kProto2 + "\x95" + le64(~std::uint64_t{0}), 2, "truncated: FRAME declares");
  check_offset_error(kProto2 + "N" + "r" + le32(0xFFFFFFFF) + ".", 3,
                     "memo index 4294967295 is too large");
}

TEST_CASE("pickle: opcodes that import or call are refused with their name and offset",
          "[pickle]") {
  const std::vector<std::pair<char, std::string>> forbidden = {
      {'c', "GLOBAL"},    {'\x93', "STACK_GLOBAL"},
      {'R', "REDUCE"},    {'b', "BUILD"},
      {'i', "INST"},      {'o', "OBJ"},
      {'\x81', "NEWOBJ"}, {'\x92', "NEWOBJ_EX"},
      {'\x82', "EXT1"},   {'\x83', "EXT2"},
      {'\x84', "EXT4"},   {'P', "PERSID"},
      {'Q', "BINPERSID"}};
  for (const auto& [op, name] : forbidden) {
    INFO(name);
    // After some valid opcodes, so that the offset is not trivially 0.
    check_offset_error(kProto2 + "NN" + std::string(1, op) + "xxxx\n.", 4,
                       "forbidden opcode " + name + " (0x");
  }
  const std::vector<std::pair<char, std::string>> unsupported = {
      {'I', "INT"},          {'L', "LONG"},           {'F', "FLOAT"},
      {'S', "STRING"},       {'V', "UNICODE"},        {'p', "PUT"},
      {'g', "GET"},          {'\x8f', "EMPTY_SET"},   {'\x90', "ADDITEMS"},
      {'\x91', "FROZENSET"}, {'\x97', "NEXT_BUFFER"}, {'\x98', "READONLY_BUFFER"}};
  for (const auto& [op, name] : unsupported) {
    INFO(name);
    check_offset_error(kProto2 + std::string(1, op) + "1\n.", 2, "unsupported opcode " + name);
  }
}

TEST_CASE("pickle: Python-written pickles that are not plain data are refused", "[pickle]") {
  std::ifstream manifest(fixture("refused.txt"));
  REQUIRE(manifest.good());
  std::string line;
  int cases = 0;
  while (std::getline(manifest, line)) {
    if (line.empty()) continue;
    const auto bar1 = line.find('|');
    const auto bar2 = line.find('|', bar1 + 1);
    const std::string file = line.substr(0, bar1);
    const std::uint64_t offset = std::stoull(line.substr(bar1 + 1, bar2 - bar1 - 1));
    const std::string text = line.substr(bar2 + 1);
    INFO(file);
    try {
      (void)Document::load(fixture(file));
      FAIL("accepted " << file);
    } catch (const ParseError& e) {
      CHECK(e.has_offset());
      CHECK(e.offset() == offset);
      CHECK_THAT(e.what(), Catch::Contains(text));
      CHECK_THAT(e.what(), Catch::Contains(file));
    }
    ++cases;
  }
  CHECK(cases == 8);
}

TEST_CASE("pickle: unknown opcodes, protocols and every single-byte opcode", "[pickle]") {
  check_offset_error(kProto2 + "N\xff.", 3, "unknown opcode 0xff");
  check_offset_error(kProto2 + std::string("\x00", 1), 2, "unknown opcode 0x00");
  check_offset_error(kProto2 + "z", 2, "unknown opcode 0x7a");
  check_offset_error("\x80\x06N.", 0, "unsupported protocol 6");
  // Any single opcode after PROTO is an error (never a crash): none of them forms a whole pickle.
  for (int op = 0; op < 256; ++op) {
    INFO("opcode " << op);
    const ParseError e = parse_error(kProto2 + std::string(1, static_cast<char>(op)));
    CHECK(e.has_offset());
  }
}

TEST_CASE("pickle: stack, MARK and memo misuse", "[pickle]") {
  check_offset_error(kProto2 + "a.", 2, "stack underflow: APPEND needs 2 values, 0 available");
  check_offset_error(kProto2 + "Ns.", 3, "stack underflow: SETITEM");
  check_offset_error(kProto2 + "N\x87.", 3, "stack underflow: TUPLE3 needs 3 values, 1 available");
  check_offset_error(kProto2 + "q\x00."s, 2, "stack underflow: BINPUT");
  check_offset_error(kProto2 + "2", 2, "stack underflow: DUP");
  check_offset_error(kProto2 + "0", 2, "stack underflow: POP");
  check_offset_error(kProto2 + ".", 2, "STOP with 0 values on the stack, expected 1");
  check_offset_error(kProto2 + "NN.", 4, "STOP with 2 values on the stack, expected 1");
  check_offset_error(kProto2 + "(N.", 4, "STOP inside an unclosed MARK");
  check_offset_error(kProto2 + "]Ne.", 4, "APPENDS without a MARK");
  check_offset_error(kProto2 + "1", 2, "POP_MARK without a MARK");
  check_offset_error(kProto2 + "t", 2, "TUPLE without a MARK");
  // A value below the MARK is out of reach of the opcodes above it.
  check_offset_error(kProto2 + "](Na", 5, "stack underflow: APPEND needs 2 values, 1 available");
  check_offset_error(kProto2 + "(Ne", 4, "APPENDS has no container below its MARK");
  check_offset_error(kProto2 + "}(Nu.", 5, "SETITEMS with an odd number of values");
  check_offset_error(kProto2 + "(Nd.", 4, "DICT with an odd number of values");
  check_offset_error(kProto2 +
                         "K\x01(K\x02"
                         "e.",
                     7, "APPENDS target is int, expected list");
  check_offset_error(kProto2 + "}Na.", 4, "APPEND target is dict, expected list");
  check_offset_error(kProto2 + "h\x05.", 2, "bad memo index 5 (never stored)");
  check_offset_error(kProto2 + "Nq\x00j"s + le32(70000) + ".", 5, "bad memo index 70000");
  check_offset_error(kProto2 + "}]NsN.", 5, "unhashable dict key of type list");
  check_offset_error(kProto2 + "}(]tNs.", 7, "unhashable dict key of type tuple");
  // A list may not change once referenced (that is how cycles would form).
  check_offset_error(kProto2 +
                         "]q\x00h\x00"
                         "a."s,
                     7, "APPEND to a list that is already referenced");
  check_offset_error(kProto2 + "]2", 3, "DUP of a list that is still being built");
}

TEST_CASE("pickle: limits on nesting, size and trailing data", "[pickle]") {
  std::string deep = kProto2;
  for (int i = 0; i < 300; ++i) deep += "]";
  for (int i = 0; i < 299; ++i) deep += "a";
  deep += ".";
  // 300 lists nest 300 deep; the first APPEND to exceed 256 is the 256th (height 257).
  check_offset_error(deep, 2 + 300 + 255, "nesting deeper than 256 containers");
  Limits shallow;
  shallow.max_depth = 2;
  CHECK_NOTHROW(Document::parse(kProto2 + "]]a.", "x", shallow));
  CHECK_THROWS_AS(Document::parse(kProto2 + "]]]aa.", "x", shallow), ParseError);
  Limits small;
  small.max_input_bytes = 4;
  const ParseError e = parse_error(kProto2 + "NNN0.", small);
  CHECK(e.offset() == 0);
  CHECK_THAT(e.what(), Catch::Contains("exceeds the limit"));
  check_offset_error(kProto2 + "N.xyz", 4, "3 bytes of trailing data after STOP");
  Limits lax;
  lax.allow_trailing_data = true;
  CHECK(Document::parse(kProto2 + "N.xyz", "x", lax).root().is_none());
}

TEST_CASE("pickle: damaged pickles fail cleanly", "[pickle]") {
  const std::string good = read_file(fixture("plain_p4.pickle"));
  std::mt19937 rng(12345);
  int accepted = 0;
  for (int round = 0; round < 3000; ++round) {
    std::string bad = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < flips; ++i) {
      bad[rng() % bad.size()] = static_cast<char>(rng() & 0xFF);
    }
    if (round % 3 == 0) bad.resize(rng() % bad.size());
    try {
      const Document doc = Document::parse(bad);
      (void)doc.root().kind();
      ++accepted;
    } catch (const ParseError& err) {
      CHECK(err.has_offset());
      CHECK(err.offset() <= bad.size());
    }
  }
  CHECK(accepted < 3000);
}

// Its load time is a benchmark (BM_LoadSnapshot in bench/bench_replay.cpp), not checked here.
TEST_CASE("pickle: loads the largest shared trace", "[pickle][shared]") {
  TP_REQUIRE_SHARED_TRACES(dir);
  const Document doc = Document::load(dir / "cs336-2.7b-seq128-fullstep.pickle");
  CHECK(doc.root()["segments"].size() == 1010);
}
