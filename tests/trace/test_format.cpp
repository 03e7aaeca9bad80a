// Tests of the native trace formats (trace/format.hpp): round trips through the binary and
// JSON-lines formats, streaming in bounded memory, and that every kind of damaged or malformed
// file gives a TraceFormatError naming where, never a crash or a silent success.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tensorpool/trace/format.hpp"
#include "tensorpool/trace/load.hpp"
#include "trace/format_io.hpp"  // crc32_update, put_varint: to craft binary files by hand

#if defined(__linux__)
#include <unistd.h>
#endif

namespace fs = std::filesystem;
using namespace tensorpool::trace;
using tensorpool::Error;

namespace {

constexpr std::uint64_t kMaxU64 = std::numeric_limits<std::uint64_t>::max();
constexpr std::int64_t kMinI64 = std::numeric_limits<std::int64_t>::min();
constexpr std::int64_t kMaxI64 = std::numeric_limits<std::int64_t>::max();

/// A fresh directory, removed with everything in it at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() / ("tensorpool_test_format_" + std::to_string(rd()) + "_" +
                                         std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string file(const std::string& name) const { return (path_ / name).string(); }
  /// The names in the directory, sorted.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& entry : fs::directory_iterator(path_)) out.push_back(entry.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

 private:
  fs::path path_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TraceEvent ev(Op op, std::uint64_t addr, std::uint64_t size, std::uint64_t stream = 0,
         std::int64_t time_us = 0, std::uint16_t device = 0, std::uint8_t flags = 0) {
  return {.op = op, .flags = flags, .device = device, .stream = stream, .addr = addr, .size = size, .time_us = time_us};
}

/// Appends `e` to `t` with label `text` (interned in order of first use, as readers number them).
void add(Trace& t, TraceEvent e, const std::string& text = "") {
  e.label = t.intern(text);
  t.events.push_back(e);
}

/// One event of every op, plausible fields, a few labels.
Trace every_op_trace() {
  Trace t;
  t.info.source = "pytorch-snapshot:unit.pickle";
  t.info.metadata = {"expandable_segments=false", "max_split_size_mb=inf"};
  const std::uint64_t seg = 0x7f3a00000000;
  add(t, ev(Op::seed_segment, seg, 20u << 20, 0, 0, 0, kFlagSmallPool), "seed");
  add(t, ev(Op::seed_alloc, seg + 512, 4096, 0, 0));
  add(t, ev(Op::segment_alloc, seg + (32u << 20), 2u << 20, 7, 10, 0, kFlagSmallPool));
  add(t, ev(Op::alloc, seg + (32u << 20), 1000, 7, 11), "model.forward:linear1");
  add(t, ev(Op::record_stream, seg + (32u << 20), 0, 9, 12));
  add(t, ev(Op::free_requested, seg + (32u << 20), 1000, 7, 13), "model.forward:linear1");
  add(t, ev(Op::stream_sync, 0, 0, 9, 14));
  add(t, ev(Op::free_completed, seg + (32u << 20), 1000, 7, 15));
  add(t, ev(Op::segment_map, seg + (64u << 20), 2u << 20, 0, 16, 1, kFlagExpandable));
  add(t, ev(Op::segment_unmap, seg + (64u << 20), 2u << 20, 0, 17, 1));
  add(t, ev(Op::segment_free, seg + (32u << 20), 2u << 20, 7, 18));
  add(t, ev(Op::iteration, 0, 1, 0, 19), "step");
  add(t, ev(Op::oom, 0, 80ull << 30, 0, 20), "optimizer.step");
  add(t, ev(Op::empty_cache, 0, 0, 0, 21));
  TraceEvent sleep = ev(Op::sleep, 0, 6ull << 30, 0, 22);
  sleep.flags = kFlagKeepContents;
  add(t, sleep, "kv_cache");  // the tag
  TraceEvent capture = ev(Op::graph_pool, 3, 512ull << 20, 7, 23);
  capture.flags = kGraphCaptureEnd;
  add(t, capture);
  return t;
}

/// Extreme values in every field, and labels that stress both encodings.
Trace extreme_trace() {
  Trace t;
  t.info.source = "extreme \"source\" \\ with\nnewline and ünïcödé";
  t.info.metadata = {"", "k=v", std::string(1000, 'm'), "tab=\t", "emoji=🚀"};
  const std::string long_label(100000, 'x');
  const std::vector<std::string> labels = {
      "", "a", long_label, "unicode: Grüße, 日本語, 🚀", "quote\" backslash\\ ctrl\x01\x1f del\x7f",
      "line\nbreak\r\ttab", "{\"json\":\"inside\"}"};
  const std::vector<std::uint64_t> u64s = {0, 1, 127, 128, 0x7f3a00000000, kMaxU64 - 1, kMaxU64};
  const std::vector<std::int64_t> times = {0, kMaxI64, kMinI64, -1, 1, kMinI64, kMaxI64, 0, -5};
  for (std::size_t i = 0; i < 200; ++i) {
    TraceEvent e;
    e.op = static_cast<Op>(i % kNumOps);
    e.flags = static_cast<std::uint8_t>(i % 3 == 0 ? 0 : (i * 37) % 256);
    e.device = static_cast<std::uint16_t>(i % 5 == 0 ? 65535 : i % 17);
    e.stream = i % 7 == 0 ? kMaxU64 : i % 11;
    e.addr = u64s[i % u64s.size()];
    e.size = u64s[(i * 3) % u64s.size()];
    e.time_us = times[i % times.size()];
    add(t, e, labels[i % labels.size()]);
  }
  return t;
}

void require_same(const Trace& a, const Trace& b) {
  REQUIRE(a.info.source == b.info.source);
  REQUIRE(a.info.metadata == b.info.metadata);
  REQUIRE(a.labels == b.labels);
  REQUIRE(a.events.size() == b.events.size());
  for (std::size_t i = 0; i < a.events.size(); ++i) {
    INFO("event " << i);
    REQUIRE(a.events[i] == b.events[i]);
  }
}

/// The same events with the same label texts (label ids may differ).
void require_same_by_text(const Trace& a, const Trace& b) {
  REQUIRE(a.info.source == b.info.source);
  REQUIRE(a.info.metadata == b.info.metadata);
  REQUIRE(a.events.size() == b.events.size());
  for (std::size_t i = 0; i < a.events.size(); ++i) {
    INFO("event " << i);
    TraceEvent x = a.events[i], y = b.events[i];
    REQUIRE(a.labels.at(x.label) == b.labels.at(y.label));
    x.label = y.label = 0;
    REQUIRE(x == y);
  }
}

/// Reads `path` expecting a TraceFormatError; returns it.
TraceFormatError read_error(const std::string& path) {
  try {
    read_trace(path);
  } catch (const TraceFormatError& e) {
    return e;
  }
  FAIL("expected a TraceFormatError reading " << path);
  return TraceFormatError(path, TraceFormatError::Where::byte, 0, "");  // not reached
}

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Event i of a synthetic run, a function of i alone (so a reader can check it without a copy):
/// allocations and frees of 512-byte-aligned blocks in a 512 MiB window, rising times, a few
/// streams and devices, a label on every 8th event.
TraceEvent synthetic_event(std::uint64_t i, std::string& label) {
  const std::uint64_t r = splitmix64(i);
  static constexpr Op kOps[8] = {Op::alloc, Op::alloc, Op::alloc, Op::free_requested,
                                 Op::free_requested, Op::free_completed, Op::free_completed,
                                 Op::record_stream};
  TraceEvent e;
  e.op = i % 100000 == 0 ? Op::iteration : kOps[r % 8];
  e.addr = 0x7f0000000000 + ((r >> 3) % (1u << 20)) * 512;
  e.size = ((r >> 23) % 8192 + 1) * 512;
  e.stream = (r >> 36) % 8 == 0 ? 0x55aa10 : 0;
  e.device = static_cast<std::uint16_t>((i / 250000) % 2);
  e.time_us = static_cast<std::int64_t>(i * 4 + (r >> 40) % 4);
  label = i % 8 == 0 ? "frame_" + std::to_string((r >> 44) % 100) : std::string();
  return e;
}

/// The resident set size of this process (0 where unknown).
std::size_t rss_bytes() {
#if defined(__linux__)
  std::ifstream statm("/proc/self/statm");
  std::size_t total = 0, resident = 0;
  statm >> total >> resident;
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
#else
  return 0;
#endif
}

/// Builds a binary file byte by byte, for inputs the writer never produces.
struct BinaryBuilder {
  std::string bytes;

  BinaryBuilder& raw(const std::string& s) { bytes += s; return *this; }
  BinaryBuilder& byte(unsigned b) { bytes += static_cast<char>(b); return *this; }
  BinaryBuilder& u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) byte((v >> (8 * i)) & 0xFF);
    return *this;
  }
  BinaryBuilder& varint(std::uint64_t v) {
    std::uint8_t buf[10];
    const std::uint8_t* end = detail::put_varint(buf, v);
    bytes.append(reinterpret_cast<const char*>(buf), static_cast<std::size_t>(end - buf));
    return *this;
  }
  BinaryBuilder& str(const std::string& s) { varint(s.size()); return raw(s); }
  /// Magic, a version, an empty header.
  BinaryBuilder& header(std::uint32_t version = 1) {
    raw(std::string(reinterpret_cast<const char*>(detail::kBinaryMagic), 8));
    u32(version);
    return str("").varint(0);
  }
  BinaryBuilder& end(std::uint64_t count) {
    byte(0x81).varint(count);
    return u32(detail::crc32_update(0, bytes.data(), bytes.size()));
  }
  /// A minimal event: tag (op, no optional parts), address delta, size.
  BinaryBuilder& event(unsigned op, std::uint64_t addr_delta_zigzag = 2, std::uint64_t size = 1) {
    return byte(op).varint(addr_delta_zigzag).varint(size);
  }
};

const std::string kJsonHeader =
    R"({"format":"tensorpool-trace","version":1,"source":"unit","metadata":["a=1"]})";

}  // namespace

// =============================================================================================

TEST_CASE("format_from_extension maps .tptrace and .jsonl, rejects the rest", "[format]") {
  CHECK(format_from_extension("a/b/run.tptrace") == Format::binary);
  CHECK(format_from_extension("run.TPTRACE") == Format::binary);
  CHECK(format_from_extension("run.jsonl") == Format::jsonl);
  CHECK_THROWS_WITH(format_from_extension("run.json"), Catch::Contains("run.json") && Catch::Contains(".tptrace"));
  CHECK_THROWS_AS(format_from_extension("tptrace"), Error);
  CHECK_THROWS_AS(format_from_extension(""), Error);
  CHECK(std::string(to_string(Format::binary)) == "binary");
  CHECK(std::string(to_string(Format::jsonl)) == "jsonl");
}

TEST_CASE("every op round-trips through both formats", "[format]") {
  TempDir dir;
  const Trace original = every_op_trace();
  REQUIRE(original.events.size() == static_cast<std::size_t>(kNumOps));
  for (const Format f : {Format::binary, Format::jsonl}) {
    SECTION(to_string(f)) {
      const std::string path = dir.file(f == Format::binary ? "t.tptrace" : "t.jsonl");
      write_trace(path, original, f);
      require_same(original, read_trace(path));
      auto reader = TraceReader::open(path);
      CHECK(reader->format() == f);
      CHECK(reader->path() == path);
      CHECK(reader->info().source == original.info.source);
      CHECK(dir.names().size() == 1);  // no temporary left next to it
    }
  }
}

TEST_CASE("extreme values and awkward labels round-trip", "[format]") {
  TempDir dir;
  const Trace original = extreme_trace();
  for (const Format f : {Format::binary, Format::jsonl}) {
    SECTION(to_string(f)) {
      const std::string path = dir.file("x");
      write_trace(path, original, f);
      require_same(original, read_trace(path));
    }
  }
  SECTION("binary -> jsonl -> binary -> memory") {
    write_trace(dir.file("a.tptrace"), original, Format::binary);
    convert_trace(dir.file("a.tptrace"), dir.file("b.jsonl"), Format::jsonl);
    convert_trace(dir.file("b.jsonl"), dir.file("c.tptrace"), Format::binary);
    require_same(original, read_trace(dir.file("b.jsonl")));
    require_same(original, read_trace(dir.file("c.tptrace")));
  }
}

TEST_CASE("an empty trace round-trips", "[format]") {
  TempDir dir;
  Trace empty;
  Trace with_info;
  with_info.info.source = "s";
  with_info.info.metadata = {"x=y"};
  for (const Format f : {Format::binary, Format::jsonl}) {
    for (const Trace* t : {&empty, &with_info}) {
      write_trace(dir.file("e"), *t, f);
      const Trace back = read_trace(dir.file("e"));
      require_same(*t, back);
      CHECK(back.events.empty());
      CHECK(back.labels == std::vector<std::string>{""});
    }
  }
}

TEST_CASE("binary files keep the trace's label ids, unused labels included", "[format]") {
  TempDir dir;
  Trace t;
  t.intern("unused");
  t.intern("second");
  add(t, ev(Op::alloc, 0x1000, 10), "third");
  add(t, ev(Op::free_requested, 0x1000, 10), "second");
  write_trace(dir.file("l.tptrace"), t, Format::binary);
  require_same(t, read_trace(dir.file("l.tptrace")));

  // JSON lines carry labels inline: ids follow first use, unused labels are gone.
  write_trace(dir.file("l.jsonl"), t, Format::jsonl);
  const Trace j = read_trace(dir.file("l.jsonl"));
  CHECK(j.labels == std::vector<std::string>{"", "third", "second"});
  require_same_by_text(t, j);
}

TEST_CASE("the reader picks the format from the content, not the name", "[format]") {
  TempDir dir;
  const Trace t = every_op_trace();
  write_trace(dir.file("binary.jsonl"), t, Format::binary);
  write_trace(dir.file("text.tptrace"), t, Format::jsonl);
  CHECK(TraceReader::open(dir.file("binary.jsonl"))->format() == Format::binary);
  CHECK(TraceReader::open(dir.file("text.tptrace"))->format() == Format::jsonl);
  require_same(t, read_trace(dir.file("binary.jsonl")));
  require_same(t, read_trace(dir.file("text.tptrace")));

  write_bytes(dir.file("zip.tptrace"), std::string("PK\x03\x04garbage", 11));
  const TraceFormatError e = read_error(dir.file("zip.tptrace"));
  CHECK(contains(e.what(), "bad magic"));
  CHECK(contains(e.what(), "50 4B 03 04"));
  CHECK(e.position() == 0);
}

TEST_CASE("streaming 1M events keeps memory bounded", "[format]") {
  TempDir dir;
  const std::string path = dir.file("big.tptrace");
  constexpr std::uint64_t kEvents = 1'000'000;
  const std::size_t rss_start = rss_bytes();
  std::size_t rss_max = rss_start;
  std::string label;
  {
    auto writer = TraceWriter::open(path, Format::binary, TraceInfo{"synthetic", {}});
    for (std::uint64_t i = 0; i < kEvents; ++i) {
      const TraceEvent e = synthetic_event(i, label);  // sets `label`: before the call reads it
      writer->write(e, label);
      if (i % 100000 == 0) rss_max = std::max(rss_max, rss_bytes());
    }
    CHECK(writer->labels().size() == 101);
    writer->finish();
  }
  auto reader = TraceReader::open(path);
  TraceEvent e;
  std::uint64_t n = 0;
  while (reader->next(e)) {
    const TraceEvent expected = synthetic_event(n, label);
    if (e.op != expected.op || e.addr != expected.addr || e.size != expected.size ||
        e.time_us != expected.time_us || e.stream != expected.stream ||
        e.device != expected.device || reader->label(e.label) != label) {
      FAIL("event " << n << " differs: op " << int(e.op) << "/" << int(expected.op) << " addr "
                     << e.addr << "/" << expected.addr << " size " << e.size << "/" << expected.size
                     << " time " << e.time_us << "/" << expected.time_us << " stream " << e.stream
                     << "/" << expected.stream << " device " << e.device << "/" << expected.device
                     << " label " << reader->label(e.label) << "/" << label);
    }
    if (n % 100000 == 0) rss_max = std::max(rss_max, rss_bytes());
    ++n;
  }
  CHECK(n == kEvents);
  CHECK(reader->events_read() == kEvents);
  CHECK(reader->offset() == fs::file_size(path));
  CHECK(reader->labels().size() == 101);
  // 1M events in memory would be 40 MB; the reader and writer hold a 64 KiB buffer each.
  CHECK(rss_max - rss_start < (8u << 20));
  const double bytes_per_event = static_cast<double>(fs::file_size(path)) / kEvents;
  CHECK(bytes_per_event < 12.0);
}

TEST_CASE("a typical alloc/free pattern takes a few bytes per event", "[format]") {
  TempDir dir;
  Trace t;
  std::int64_t time = 0;
  for (int i = 0; i < 10000; ++i) {
    const std::uint64_t addr = 0x7f3a00000000 + static_cast<std::uint64_t>(i % 64) * (1u << 20);
    const std::uint64_t size = 4096u * static_cast<std::uint64_t>(1 + i % 16);
    add(t, ev(Op::alloc, addr, size, 0, time += 3));
    add(t, ev(Op::free_requested, addr, size, 0, time += 2));
    add(t, ev(Op::free_completed, addr, size, 0, time));
  }
  write_trace(dir.file("t.tptrace"), t, Format::binary);
  const double per_event = static_cast<double>(fs::file_size(dir.file("t.tptrace"))) /
                           static_cast<double>(t.events.size());
  CHECK(per_event < 7.0);
}

TEST_CASE("every truncation of a binary file is a truncation error with an offset", "[format]") {
  TempDir dir;
  write_trace(dir.file("full.tptrace"), every_op_trace(), Format::binary);
  const std::string full = read_bytes(dir.file("full.tptrace"));
  REQUIRE(full.size() > 100);
  for (std::size_t k = 0; k < full.size(); ++k) {
    INFO("truncated to " << k << " of " << full.size() << " bytes");
    write_bytes(dir.file("cut.tptrace"), full.substr(0, k));
    const TraceFormatError e = read_error(dir.file("cut.tptrace"));
    CHECK(e.where() == TraceFormatError::Where::byte);
    CHECK(e.position() <= k);
    CHECK(e.file() == dir.file("cut.tptrace"));
    CHECK(contains(e.what(), "truncated"));
    CHECK(contains(e.what(), dir.file("cut.tptrace") + ": byte " + std::to_string(e.position())));
  }
}

TEST_CASE("every flipped byte of a binary file is detected", "[format]") {
  TempDir dir;
  write_trace(dir.file("full.tptrace"), every_op_trace(), Format::binary);
  const std::string full = read_bytes(dir.file("full.tptrace"));
  for (std::size_t i = 0; i < full.size(); ++i) {
    for (const unsigned mask : {0x01u, 0x10u, 0x80u, 0xFFu}) {
      INFO("byte " << i << " ^ " << mask);
      std::string bad = full;
      bad[i] = static_cast<char>(static_cast<unsigned char>(bad[i]) ^ mask);
      write_bytes(dir.file("bad.tptrace"), bad);
      CHECK_THROWS_AS(read_trace(dir.file("bad.tptrace")), TraceFormatError);
    }
  }
}

TEST_CASE("random damage never crashes or throws anything but TraceFormatError", "[format]") {
  TempDir dir;
  write_trace(dir.file("full.tptrace"), extreme_trace(), Format::binary);
  write_trace(dir.file("full.jsonl"), every_op_trace(), Format::jsonl);
  const std::string inputs[] = {read_bytes(dir.file("full.tptrace")).substr(0, 4000),
                                read_bytes(dir.file("full.jsonl"))};
  std::mt19937_64 rng(12345);
  int errors = 0;
  for (int round = 0; round < 1500; ++round) {
    std::string bytes = inputs[round % 2];
    const int edits = 1 + static_cast<int>(rng() % 8);
    for (int k = 0; k < edits && !bytes.empty(); ++k) {
      const std::size_t at = rng() % bytes.size();
      switch (rng() % 4) {
        case 0: bytes[at] = static_cast<char>(rng()); break;
        case 1: bytes.erase(at, 1 + rng() % 16); break;
        case 2: bytes.insert(at, 1 + rng() % 4, static_cast<char>(rng())); break;
        default: bytes[at] = static_cast<char>(0x80 | rng()); break;  // varint continuation bits
      }
    }
    write_bytes(dir.file("fuzz"), bytes);
    try {
      read_trace(dir.file("fuzz"));
    } catch (const TraceFormatError&) {
      ++errors;
    }
  }
  CHECK(errors > 1400);  // a few jsonl edits (inside a label, say) leave a valid file
}

TEST_CASE("binary format errors say what was expected", "[format]") {
  TempDir dir;
  const std::string path = dir.file("crafted.tptrace");
  const auto error_of = [&](const BinaryBuilder& b) {
    write_bytes(path, b.bytes);
    return read_error(path);
  };
  const auto header_end = BinaryBuilder().header().bytes.size();

  SECTION("a well-formed crafted file reads") {
    write_bytes(path, BinaryBuilder().header().byte(0x80).str("L").event(0).byte(0x20).varint(1).varint(2).varint(1).end(2).bytes);
    const Trace t = read_trace(path);
    REQUIRE(t.events.size() == 2);
    CHECK(t.events[1].label == 1);
    CHECK(t.labels[1] == "L");
  }
  SECTION("unsupported version") {
    const auto e = error_of(BinaryBuilder().header(7).end(0));
    CHECK(contains(e.what(), "unsupported .tptrace format version 7"));
    CHECK(contains(e.what(), "supports versions 1 to 3"));
    CHECK(e.position() == 8);
  }
  SECTION("unknown record type") {
    const auto e = error_of(BinaryBuilder().header().byte(0x90).end(0));
    CHECK(contains(e.what(), "unknown record type 0x90"));
    CHECK(e.position() == header_end);
  }
  SECTION("unknown op") {
    const auto e = error_of(BinaryBuilder().header().event(13).end(1));  // empty_cache: version 2 only
    CHECK(contains(e.what(), "unknown op 13"));
    CHECK(contains(e.what(), "known ops are 0..12 in version 1"));
    const auto e2 = error_of(BinaryBuilder().header(2).event(14).end(1));
    CHECK(contains(e2.what(), "known ops are 0..13 in version 2"));
  }
  SECTION("varint overflow") {
    BinaryBuilder b;
    b.header().byte(0);
    for (int i = 0; i < 11; ++i) b.byte(0xFF);
    b.byte(0).varint(1).end(1);
    CHECK(contains(error_of(b).what(), "varint overflow in address delta"));
    BinaryBuilder b2;
    b2.header().byte(0).varint(0);
    for (int i = 0; i < 9; ++i) b2.byte(0x80);
    b2.byte(0x02).end(1);  // bit 64
    CHECK(contains(error_of(b2).what(), "varint overflow in size"));
  }
  SECTION("the largest varint is fine") {
    write_bytes(path, BinaryBuilder().header().event(0, 2, kMaxU64).end(1).bytes);
    CHECK(read_trace(path).events.at(0).size == kMaxU64);
  }
  SECTION("label used before its definition") {
    const auto e = error_of(BinaryBuilder().header().byte(0x20).varint(1).varint(2).varint(1).end(1));
    CHECK(contains(e.what(), "label id 1 not defined yet"));
    CHECK(e.position() == header_end);
  }
  SECTION("checksum mismatch") {
    BinaryBuilder b;
    b.header().event(0).end(1);
    b.bytes[b.bytes.size() - 1] ^= 0x40;
    CHECK(contains(error_of(b).what(), "checksum mismatch"));
  }
  SECTION("event count mismatch") {
    const auto e = error_of(BinaryBuilder().header().event(0).event(1).end(3));
    CHECK(contains(e.what(), "event count mismatch"));
    CHECK(contains(e.what(), "says 3 events but the file has 2"));
  }
  SECTION("missing end record") {
    const auto e = error_of(BinaryBuilder().header().event(0));
    CHECK(contains(e.what(), "missing end record"));
    CHECK(contains(e.what(), "after 1 events"));
  }
  SECTION("data after the end record") {
    BinaryBuilder b;
    b.header().end(0).byte(0);
    const auto e = error_of(b);
    CHECK(contains(e.what(), "after the end record"));
    CHECK(e.position() == b.bytes.size() - 1);
  }
  SECTION("device out of range") {
    const auto e = error_of(BinaryBuilder().header().byte(0x10).byte(0x02).varint(65536).varint(2).varint(1).end(1));
    CHECK(contains(e.what(), "device 65536 out of range"));
  }
  SECTION("reserved context bits") {
    CHECK(contains(error_of(BinaryBuilder().header().byte(0x10).byte(0x20).varint(2).varint(1).end(1)).what(),
                   "reserved bits"));
  }
  SECTION("over-long strings are refused before they are read") {
    const auto e = error_of(BinaryBuilder().header().byte(0x80).varint(kMaxU64 / 2));
    CHECK(contains(e.what(), "longer than the limit"));
    BinaryBuilder b;
    b.raw(std::string(reinterpret_cast<const char*>(detail::kBinaryMagic), 8)).u32(1).varint(1000).raw("short");
    CHECK(contains(error_of(b).what(), "truncated header"));
  }
  SECTION("extension records are skipped (and checksummed)") {
    write_bytes(path, BinaryBuilder().header().byte(0xC3).str("future data").event(0).end(1).bytes);
    CHECK(read_trace(path).events.size() == 1);
    const auto e = error_of(BinaryBuilder().header().byte(0xC3).varint(1000).raw("abc"));
    CHECK(contains(e.what(), "truncated extension record"));
  }
}

TEST_CASE("the reader's accessors, and next() after the end and after an error", "[format]") {
  TempDir dir;
  write_trace(dir.file("t.tptrace"), every_op_trace(), Format::binary);
  auto reader = TraceReader::open(dir.file("t.tptrace"));
  CHECK(reader->info().metadata.size() == 2);
  CHECK(reader->label(0).empty());
  CHECK_THROWS_AS(reader->label(999), Error);
  TraceEvent e;
  std::uint64_t n = 0;
  while (reader->next(e)) {
    CHECK(e.label < reader->labels().size());
    ++n;
  }
  CHECK(n == static_cast<std::uint64_t>(kNumOps));
  CHECK_FALSE(reader->next(e));
  CHECK(reader->line() == 0);

  std::string bytes = read_bytes(dir.file("t.tptrace"));
  bytes.resize(bytes.size() - 2);
  write_bytes(dir.file("cut.tptrace"), bytes);
  auto cut = TraceReader::open(dir.file("cut.tptrace"));
  std::string first_error;
  try {
    while (cut->next(e)) {
    }
  } catch (const TraceFormatError& error) {
    first_error = error.what();
  }
  REQUIRE_FALSE(first_error.empty());
  CHECK_THROWS_WITH(cut->next(e), first_error);

  CHECK_THROWS_AS(TraceReader::open(dir.file("missing.tptrace")), Error);
  CHECK_THROWS_WITH(TraceReader::open(dir.file("missing.tptrace")), Catch::Contains("missing.tptrace"));
}

TEST_CASE("JSON lines: the writer's layout", "[format]") {
  TempDir dir;
  Trace t;
  t.info.source = "s";
  add(t, ev(Op::alloc, 0x7f0000001000, 1024, 0, 5), "text");
  add(t, ev(Op::seed_segment, 0x7f0000000000, 2u << 20, 3, 0, 1, kFlagSmallPool));
  write_trace(dir.file("t.jsonl"), t, Format::jsonl);
  std::istringstream lines(read_bytes(dir.file("t.jsonl")));
  std::string line;
  std::getline(lines, line);
  CHECK(line == R"({"format":"tensorpool-trace","version":3,"source":"s","metadata":[]})");
  std::getline(lines, line);
  CHECK(line == R"({"op":"alloc","device":0,"stream":0,"addr":"0x7f0000001000","size":1024,"time_us":5,"label":"text"})");
  std::getline(lines, line);
  CHECK(line == R"({"op":"seed_segment","device":1,"stream":3,"addr":"0x7f0000000000","size":2097152,"time_us":0,"flags":1})");
  std::getline(lines, line);
  CHECK(line == R"({"end":true,"events":2})");
  CHECK_FALSE(std::getline(lines, line));
}

TEST_CASE("JSON lines written by other tools: minimal keys, CRLF, BOM, no end object", "[format]") {
  TempDir dir;
  const std::string text =
      "\xEF\xBB\xBF{\"version\":1,\"format\":\"tensorpool-trace\"}\r\n"
      "\r\n"
      "{\"size\":64,\"addr\":4096,\"op\":\"alloc\",\"label\":\"caf\\u00e9\"}\r\n"
      "{\"op\":\"stream_sync\",\"stream\":\"0x1F\"}\r\n"
      "{\"op\":\"iteration\",\"size\":3,\"time_us\":-7}";  // no final newline
  write_bytes(dir.file("tool.jsonl"), text);
  const Trace t = read_trace(dir.file("tool.jsonl"));
  CHECK(t.info.source.empty());
  CHECK(t.info.metadata.empty());
  REQUIRE(t.events.size() == 3);
  CHECK(t.events[0] == TraceEvent{.op = Op::alloc, .label = 1, .addr = 4096, .size = 64});
  CHECK(t.labels.at(1) == "caf\xC3\xA9");
  CHECK(t.events[1] == TraceEvent{.op = Op::stream_sync, .stream = 0x1F});
  CHECK(t.events[2] == TraceEvent{.op = Op::iteration, .size = 3, .time_us = -7});
}

TEST_CASE("JSON lines: malformed lines are reported with their line number", "[format]") {
  TempDir dir;
  const std::string ok_event = R"({"op":"alloc","addr":"0x10","size":1})";
  struct Case {
    std::string name;
    std::vector<std::string> lines;
    std::uint64_t line;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"malformed JSON", {kJsonHeader, R"({"op":"alloc","addr":"0x10","size":)"}, 2, "malformed JSON"},
      {"not UTF-8", {kJsonHeader, "{\"op\":\"alloc\",\"addr\":\"0x10\",\"size\":1,\"label\":\"\xFF\"}"}, 2, "malformed JSON"},
      {"missing op", {kJsonHeader, ok_event, R"({"addr":"0x10","size":1})"}, 3, "missing key \"op\""},
      {"unknown op", {kJsonHeader, R"({"op":"allocate","addr":"0x10","size":1})"}, 2, "unknown op \"allocate\""},
      {"op not a string", {kJsonHeader, R"({"op":3,"addr":"0x10","size":1})"}, 2, "key \"op\" must be a string"},
      {"size as string", {kJsonHeader, R"({"op":"alloc","addr":"0x10","size":"12"})"}, 2, "key \"size\" must be a non-negative integer, found string \"12\""},
      {"size as float", {kJsonHeader, R"({"op":"alloc","addr":"0x10","size":1e3})"}, 2, "key \"size\" must be a non-negative integer"},
      {"negative size", {kJsonHeader, R"({"op":"alloc","addr":"0x10","size":-5})"}, 2, "negative size -5"},
      {"size past 64 bits", {kJsonHeader, R"({"op":"alloc","addr":"0x10","size":18446744073709551616})"}, 2, "key \"size\" must be a non-negative integer"},
      {"addr not hex", {kJsonHeader, R"({"op":"alloc","addr":"0xZZ","size":1})"}, 2, "key \"addr\" must be a hex string"},
      {"addr without 0x", {kJsonHeader, R"({"op":"alloc","addr":"1234","size":1})"}, 2, "key \"addr\" must be a hex string"},
      {"addr too long", {kJsonHeader, R"({"op":"alloc","addr":"0x10000000000000000","size":1})"}, 2, "1 to 16 digits"},
      {"addr negative", {kJsonHeader, R"({"op":"alloc","addr":-16,"size":1})"}, 2, "negative addr -16"},
      {"missing addr", {kJsonHeader, R"({"op":"alloc","size":1})"}, 2, "missing key \"addr\" (a alloc event needs it)"},
      {"missing stream", {kJsonHeader, R"({"op":"stream_sync"})"}, 2, "missing key \"stream\""},
      {"unknown key", {kJsonHeader, R"({"op":"alloc","adress":"0x10","size":1})"}, 2, "unknown key \"adress\""},
      {"device out of range", {kJsonHeader, R"({"op":"alloc","addr":"0x10","size":1,"device":70000})"}, 2, "\"device\": 70000 is out of range"},
      {"flags out of range", {kJsonHeader, R"({"op":"alloc","addr":"0x10","size":1,"flags":256})"}, 2, "\"flags\": 256 is out of range"},
      {"time not an integer", {kJsonHeader, R"({"op":"alloc","addr":"0x10","size":1,"time_us":1.5})"}, 2, "key \"time_us\" must be an integer"},
      {"time past int64", {kJsonHeader, R"({"op":"alloc","addr":"0x10","size":1,"time_us":9223372036854775808})"}, 2, "out of range"},
      {"label not a string", {kJsonHeader, R"({"op":"alloc","addr":"0x10","size":1,"label":7})"}, 2, "key \"label\" must be a string"},
      {"event not an object", {kJsonHeader, R"([1,2,3])"}, 2, "expected an event object"},
      {"blank lines count", {kJsonHeader, "", ok_event, "   ", R"({"op":"alloc"})"}, 5, "missing key"},
      {"no header", {ok_event}, 1, "expected the header object"},
      {"wrong format name", {R"({"format":"other","version":1})"}, 1, "expected the header object"},
      {"unsupported version", {R"({"format":"tensorpool-trace","version":4})", ok_event}, 1, "unsupported tensorpool-trace JSON-lines version 4 (this reader supports versions 1 to 3"},
      {"sleep in version 2", {R"({"format":"tensorpool-trace","version":2})", R"({"op":"sleep"})"}, 2, "unknown op \"sleep\" in version 2"},
      {"empty_cache in version 1", {R"({"format":"tensorpool-trace","version":1})", R"({"op":"empty_cache"})"}, 2, "unknown op \"empty_cache\" in version 1"},
      {"missing version", {R"({"format":"tensorpool-trace"})"}, 1, "missing key \"version\""},
      {"metadata not strings", {R"({"format":"tensorpool-trace","version":1,"metadata":[1]})"}, 1, "array of strings"},
      {"unknown header key", {R"({"format":"tensorpool-trace","version":1,"sauce":"x"})"}, 1, "unknown key \"sauce\" in the header"},
      {"only blank lines", {"", "  "}, 2, "no header line"},
      {"end count mismatch", {kJsonHeader, ok_event, R"({"end":true,"events":2})"}, 3, "event count mismatch: the end object says 2 events but the file has 1"},
      {"data after the end", {kJsonHeader, ok_event, R"({"end":true,"events":1})", ok_event}, 4, "after the end object"},
      {"end not true", {kJsonHeader, R"({"end":1,"events":0})"}, 2, "key \"end\" must be true"},
      {"deep nesting", {kJsonHeader, std::string(100000, '[') + std::string(100000, ']')}, 2, "nested deeper than 8 levels"},
      {"nested value", {kJsonHeader, R"({"op":"alloc","addr":"0x10","size":[[1]]})"}, 2, "found array [[1]]"},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    std::string text;
    for (const std::string& l : c.lines) text += l + "\n";
    write_bytes(dir.file("bad.jsonl"), text);
    const TraceFormatError e = read_error(dir.file("bad.jsonl"));
    CHECK(e.where() == TraceFormatError::Where::line);
    CHECK(e.position() == c.line);
    CHECK_THAT(e.what(), Catch::Contains(c.expected) &&
                             Catch::Contains("bad.jsonl: line " + std::to_string(c.line) + ": "));
  }
}

TEST_CASE("JSON lines: a cut line is an error, the end object catches a cut at a line end", "[format]") {
  TempDir dir;
  write_trace(dir.file("t.jsonl"), every_op_trace(), Format::jsonl);
  const std::string full = read_bytes(dir.file("t.jsonl"));
  // Without the end object (the last line) the file is still a valid trace, with every event.
  const std::size_t end_line = full.rfind('\n', full.size() - 2) + 1;
  write_bytes(dir.file("noend.jsonl"), full.substr(0, end_line));
  CHECK(read_trace(dir.file("noend.jsonl")).events.size() == static_cast<std::size_t>(kNumOps));
  // Cut inside any event line: that line is malformed JSON.
  for (std::size_t k = full.find('\n') + 2; k < end_line - 1; k += 7) {
    if (full[k - 1] == '\n' || full[k] == '\n') continue;  // a whole line: valid
    INFO("cut at " << k);
    write_bytes(dir.file("cut.jsonl"), full.substr(0, k));
    CHECK_THROWS_AS(read_trace(dir.file("cut.jsonl")), TraceFormatError);
  }
  // An end object that disagrees with a file that lost lines.
  const std::size_t second_event = full.find('\n', full.find('\n') + 1) + 1;
  const std::size_t third_event = full.find('\n', second_event) + 1;
  write_bytes(dir.file("lost.jsonl"), full.substr(0, second_event) + full.substr(third_event));
  CHECK_THROWS_WITH(read_trace(dir.file("lost.jsonl")), Catch::Contains("event count mismatch"));
}

TEST_CASE("the writer never leaves a partial file under the target name", "[format]") {
  TempDir dir;
  const std::string target = dir.file("out.tptrace");
  const TraceEvent good = ev(Op::alloc, 0x1000, 8);

  SECTION("abandoned without finish()") {
    for (const Format f : {Format::binary, Format::jsonl}) {
      auto writer = TraceWriter::open(target, f, TraceInfo{});
      writer->write(good, "label");
      CHECK(dir.names().size() == 1);  // the temporary
      writer.reset();
      CHECK(dir.names().empty());
    }
  }
  SECTION("a bad event fails the writer and removes the temporary at once") {
    auto writer = TraceWriter::open(target, Format::binary, TraceInfo{});
    TraceEvent bad = good;
    bad.label = 5;
    CHECK_THROWS_WITH(writer->write(bad), Catch::Contains("label id 5"));
    CHECK(dir.names().empty());
    CHECK_THROWS_WITH(writer->write(good), Catch::Contains("unusable"));
    CHECK_THROWS_AS(writer->finish(), Error);
    bad = good;
    bad.op = static_cast<Op>(kNumOps);
    auto writer2 = TraceWriter::open(target, Format::jsonl, TraceInfo{});
    CHECK_THROWS_WITH(writer2->write(bad), Catch::Contains("not a trace::Op"));
    CHECK(dir.names().empty());
  }
  SECTION("a failed write_trace keeps the existing file") {
    write_bytes(target, "previous contents");
    Trace t = every_op_trace();
    t.events.back().label = 77;
    CHECK_THROWS_WITH(write_trace(target, t, Format::binary), Catch::Contains("label id 77"));
    CHECK(read_bytes(target) == "previous contents");
    CHECK(dir.names() == std::vector<std::string>{"out.tptrace"});
  }
  SECTION("finish() fails when the rename fails") {
    fs::create_directory(target);  // a directory where the file should go
    auto writer = TraceWriter::open(target, Format::binary, TraceInfo{});
    writer->write(good);
    CHECK_THROWS_AS(writer->finish(), Error);
    CHECK(dir.names() == std::vector<std::string>{"out.tptrace"});
    CHECK(fs::is_directory(target));
    CHECK(fs::is_empty(target));
  }
  SECTION("JSON lines refuse text that is not UTF-8") {
    CHECK_THROWS_WITH(TraceWriter::open(dir.file("s.jsonl"), Format::jsonl, TraceInfo{"\xC3", {}}),
                      Catch::Contains("not valid UTF-8"));
    auto writer = TraceWriter::open(dir.file("l.jsonl"), Format::jsonl, TraceInfo{});
    CHECK_THROWS_WITH(writer->write(good, "bad \xED\xA0\x80 surrogate"), Catch::Contains("not valid UTF-8"));
    CHECK(dir.names().empty());
  }
  SECTION("no directory to write to") {
    CHECK_THROWS_WITH(TraceWriter::open(dir.file("no/such/dir/x.tptrace"), Format::binary, TraceInfo{}),
                      Catch::Contains("no/such/dir/x.tptrace"));
  }
  SECTION("finish() twice") {
    auto writer = TraceWriter::open(target, Format::binary, TraceInfo{});
    writer->finish();
    CHECK_THROWS_WITH(writer->finish(), Catch::Contains("already finished"));
    CHECK(read_trace(target).events.empty());
  }
}

// Not run by default (hidden tag): `tensorpool_test_format "[.speed]"`, best in a Release build.
// TENSORPOOL_FORMAT_SPEED_EVENTS overrides the number of events (default 1M).
TEST_CASE("binary format speed", "[.speed]") {
  TempDir dir;
  const std::string path = dir.file("speed.tptrace");
  std::uint64_t events = 1'000'000;
  if (const char* env = std::getenv("TENSORPOOL_FORMAT_SPEED_EVENTS")) events = std::stoull(env);
  std::vector<TraceEvent> batch(4096);  // generated outside the timed loops
  std::vector<std::string> labels(4096);
  for (std::size_t i = 0; i < batch.size(); ++i) batch[i] = synthetic_event(i, labels[i]);

  // Wall time, and CPU time (user + system) which a busy machine disturbs less.
  using Clock = std::chrono::steady_clock;
  const std::clock_t c0 = std::clock();
  const auto t0 = Clock::now();
  {
    auto writer = TraceWriter::open(path, Format::binary, TraceInfo{"speed", {}});
    for (std::uint64_t i = 0; i < events; ++i) {
      const std::size_t j = i % batch.size();
      writer->write(batch[j], labels[j]);
    }
    writer->finish();
  }
  const auto t1 = Clock::now();
  const std::clock_t c1 = std::clock();
  auto reader = TraceReader::open(path);
  TraceEvent e;
  std::uint64_t n = 0, checksum = 0;
  while (reader->next(e)) {
    checksum += e.addr ^ e.size;
    ++n;
  }
  const auto t2 = Clock::now();
  const std::clock_t c2 = std::clock();
  REQUIRE(n == events);
  const auto rate = [&](double seconds) { return static_cast<double>(events) / seconds / 1e6; };
  const auto cpu = [](std::clock_t a, std::clock_t b) { return static_cast<double>(b - a) / CLOCKS_PER_SEC; };
  const double write_s = std::chrono::duration<double>(t1 - t0).count();
  const double read_s = std::chrono::duration<double>(t2 - t1).count();
  std::cout << "binary format, " << events << " events, " << fs::file_size(path) << " bytes ("
            << static_cast<double>(fs::file_size(path)) / static_cast<double>(events)
            << " bytes/event)\n  write " << rate(write_s) << " M events/s (CPU time: "
            << rate(cpu(c0, c1)) << "), read " << rate(read_s) << " M events/s (CPU time: "
            << rate(cpu(c1, c2)) << "); checksum " << checksum << ", rss " << (rss_bytes() >> 20)
            << " MiB\n";
}

// ============================================================================================
// load() and convert_to_native(): the kind from the first bytes, one open of the file
// ============================================================================================

TEST_CASE("load() says which kind of trace it read and reads it whole", "[format][load]") {
  TempDir dir;
  const Trace t = every_op_trace();
  const std::string bin = dir.file("t.tptrace"), jsonl = dir.file("t.jsonl");
  write_trace(bin, t, Format::binary);
  write_trace(jsonl, t, Format::jsonl);
  const LoadedTrace b = load(bin);
  CHECK(b.kind == SourceKind::native_binary);
  CHECK(b.trace.events == t.events);
  CHECK(b.trace.info.metadata == t.info.metadata);
  CHECK(detect_source(bin) == SourceKind::native_binary);
  const LoadedTrace j = load(jsonl);
  CHECK(j.kind == SourceKind::native_jsonl);
  CHECK(j.trace.events.size() == t.events.size());
  CHECK(load_trace(jsonl).events == j.trace.events);

  write_bytes(dir.file("empty"), "");
  REQUIRE_THROWS_WITH(load(dir.file("empty")), Catch::Matchers::Contains("the file is empty"));
  write_bytes(dir.file("junk"), "junk junk junk");
  REQUIRE_THROWS_WITH(load(dir.file("junk")), Catch::Matchers::Contains("junk: offset 0: not a trace"));
  REQUIRE_THROWS_WITH(load(dir.file("absent")), Catch::Matchers::Contains("absent"));
  // Four bytes of the magic pass detection; the binary reader then says what is wrong.
  write_bytes(dir.file("cut.tptrace"), read_bytes(bin).substr(0, 6));
  REQUIRE_THROWS_AS(load(dir.file("cut.tptrace")), TraceFormatError);
}

TEST_CASE("convert_to_native() streams native inputs and keeps every event", "[format][load]") {
  TempDir dir;
  const Trace t = every_op_trace();
  write_trace(dir.file("in.jsonl"), t, Format::jsonl);
  REQUIRE(convert_to_native(dir.file("in.jsonl"), dir.file("out.tptrace"), Format::binary) ==
          SourceKind::native_jsonl);
  const Trace back = read_trace(dir.file("out.tptrace"));
  REQUIRE(back.events.size() == t.events.size());
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    CHECK(back.labels[back.events[i].label] == t.labels[t.events[i].label]);
    TraceEvent a = back.events[i], b = t.events[i];
    a.label = b.label = 0;
    CHECK(a == b);
  }
  write_bytes(dir.file("junk"), "junk junk junk");
  REQUIRE_THROWS(convert_to_native(dir.file("junk"), dir.file("never.tptrace"), Format::binary));
  CHECK_FALSE(fs::exists(dir.file("never.tptrace")));
}
