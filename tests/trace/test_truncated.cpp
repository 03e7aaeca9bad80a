// Tests of what a live recording needs from the native formats: checkpoint records (verified by
// every reader), the tolerant reading of a file that ends early (ReadOptions::allow_truncated),
// which must forgive only the cut, a named temporary file, and writing in place to a device.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <filesystem>
#include <string>
#include <vector>

#include "support/temp_dir.hpp"
#include "tensorpool/trace/format.hpp"

using namespace tensorpool::trace;
using tensorpool::Error;
using tensorpool::testing::read_bytes;
using tensorpool::testing::TempDir;
using tensorpool::testing::write_bytes;

namespace {

TraceEvent alloc_event(std::uint64_t i) {
  TraceEvent e;
  e.op = i % 2 == 0 ? Op::alloc : Op::free_requested;
  e.addr = 0x7f0000000000 + (i / 2) * 4096;
  e.size = 1000 + i;
  e.stream = i % 3;
  e.time_us = static_cast<std::int64_t>(i * 7);
  return e;
}

/// Writes `batches` batches of `per_batch` events with a checkpoint after each to `path`; with
/// `finish` the end record too, otherwise `path` is left as a killed recording leaves its file.
/// Returns the events written.
std::vector<TraceEvent> write_batches(const std::string& path, Format format, int batches,
                                 int per_batch, bool finish) {
  const std::string temp = path + ".partial";
  auto writer = TraceWriter::open(path, format, TraceInfo{"live", {"pid=1"}}, WriteOptions{temp});
  std::vector<TraceEvent> events;
  for (int b = 0; b < batches; ++b) {
    for (int i = 0; i < per_batch; ++i) {
      events.push_back(alloc_event(events.size()));
      writer->write(events.back(), b == 0 && i == 0 ? "first" : "");
    }
    writer->checkpoint();
  }
  if (finish) {
    writer->finish();
  } else {  // the writer removes its temporary file when destroyed unfinished: keep a copy
    std::filesystem::copy_file(temp, path, std::filesystem::copy_options::overwrite_existing);
  }
  return events;
}

struct TolerantRead {
  std::vector<TraceEvent> events;
  std::optional<Truncation> truncation;
};

TolerantRead read_tolerant(const std::string& path) {
  auto reader = TraceReader::open(path, ReadOptions{.allow_truncated = true});
  TolerantRead out;
  TraceEvent e;
  while (reader->next(e)) {
    e.label = 0;
    out.events.push_back(e);
  }
  out.truncation = reader->truncation();
  return out;
}

/// Where the first checkpoint record starts in a file write_batches() wrote: the size of the
/// same file with one batch, less the record (tag, length, a one-byte count, CRC).
std::size_t first_checkpoint(const TempDir& dir, int per_batch) {
  const std::string one = dir.file("one-batch.tptrace");
  write_batches(one, Format::binary, 1, per_batch, false);
  return read_bytes(one).size() - 7;
}

std::vector<TraceEvent> without_labels(std::vector<TraceEvent> events) {
  for (TraceEvent& e : events) e.label = 0;
  return events;
}

}  // namespace

TEST_CASE("checkpoints are invisible to readers and checked by them", "[format][truncated]") {
  TempDir dir("tensorpool_test_truncated");
  const std::string path = dir.file("t.tptrace");
  const auto written = write_batches(path, Format::binary, 3, 5, true);
  const Trace t = read_trace(path);
  CHECK(without_labels(t.events) == written);
  const TolerantRead tolerant = read_tolerant(path);
  CHECK(tolerant.events == written);
  CHECK_FALSE(tolerant.truncation.has_value());

  // A corrupted byte inside the first batch: the first checkpoint's CRC catches it, in the
  // strict and in the tolerant mode alike.
  std::string bytes = read_bytes(path);
  const std::size_t checkpoint = first_checkpoint(dir, 5);
  REQUIRE(static_cast<unsigned char>(bytes[checkpoint]) == 0xC0);
  bytes[checkpoint - 1] = static_cast<char>(bytes[checkpoint - 1] ^ 0x01);  // an event's size
  write_bytes(path, bytes);
  CHECK_THROWS_WITH(read_trace(path), Catch::Contains("checksum mismatch: the checkpoint record"));
  CHECK_THROWS_WITH(read_tolerant(path), Catch::Contains("checksum mismatch"));
}

TEST_CASE("a recording cut at any byte reads up to the cut, tolerantly", "[format][truncated]") {
  TempDir dir("tensorpool_test_truncated");
  const std::string full = dir.file("full.tptrace");
  const auto written = write_batches(full, Format::binary, 4, 6, false);  // killed: no end record
  const std::string bytes = read_bytes(full);
  // Offsets where each checkpoint record ends: what a tolerant read must report as verified.
  std::vector<std::pair<std::size_t, std::uint64_t>> checkpoints;  // (end offset, events)
  {
    auto reader = TraceReader::open(full, ReadOptions{.allow_truncated = true});
    TraceEvent e;
    while (reader->next(e)) {
    }
    REQUIRE(reader->truncation().has_value());
    CHECK(reader->truncation()->events == written.size());
    CHECK(reader->truncation()->verified_events == written.size());
    CHECK(reader->truncation()->verified_bytes == bytes.size());
    CHECK_THAT(reader->truncation()->problem, Catch::Contains("missing end record"));
  }
  const std::string cut = dir.file("cut.tptrace");
  const std::size_t header_bytes = 8 + 4 + 1 + 4 + 1 + 1 + 5;  // magic, version, "live", ["pid=1"]
  std::uint64_t last_verified = 0;
  for (std::size_t n = header_bytes; n < bytes.size(); ++n) {
    INFO("cut after " << n << " bytes");
    write_bytes(cut, bytes.substr(0, n));
    CHECK_THROWS_AS(read_trace(cut), TraceFormatError);  // strict: unchanged
    const TolerantRead r = read_tolerant(cut);
    REQUIRE(r.truncation.has_value());
    REQUIRE(r.events.size() <= written.size());
    CHECK(std::equal(r.events.begin(), r.events.end(), written.begin()));
    CHECK(r.truncation->events == r.events.size());
    CHECK(r.truncation->file_bytes == n);
    CHECK(r.truncation->verified_events <= r.events.size());
    CHECK(r.truncation->verified_bytes <= n);
    CHECK(r.truncation->verified_events >= last_verified);  // never goes back
    last_verified = r.truncation->verified_events;
    CHECK(r.truncation->verified_events % 6 == 0);  // a whole batch, or none
  }
  CHECK(last_verified == 18);  // the fourth batch's checkpoint is only in the whole file
}

TEST_CASE("the tolerant mode forgives only the cut", "[format][truncated]") {
  TempDir dir("tensorpool_test_truncated");
  const std::string path = dir.file("t.tptrace");
  write_batches(path, Format::binary, 2, 4, false);
  std::string bytes = read_bytes(path);
  // An unknown record type in the middle is an error, not a cut.
  const std::size_t checkpoint = first_checkpoint(dir, 4);
  REQUIRE(static_cast<unsigned char>(bytes[checkpoint]) == 0xC0);
  std::string bad = bytes;
  bad[checkpoint] = '\x90';
  write_bytes(path, bad);
  CHECK_THROWS_WITH(read_tolerant(path), Catch::Contains("unknown record type 0x90"));
  // A file cut inside its header has nothing to read: it fails to open in both modes.
  write_bytes(path, bytes.substr(0, 14));
  CHECK_THROWS_WITH(TraceReader::open(path, ReadOptions{.allow_truncated = true}),
                    Catch::Contains("truncated header"));
}

TEST_CASE("JSON lines: a last line cut in the middle ends the trace, tolerantly", "[format][truncated]") {
  TempDir dir("tensorpool_test_truncated");
  const std::string path = dir.file("t.jsonl");
  const auto written = write_batches(path, Format::jsonl, 2, 3, true);
  const std::string bytes = read_bytes(path);
  const std::size_t fifth_line = [&] {
    std::size_t pos = 0;
    for (int i = 0; i < 4; ++i) pos = bytes.find('\n', pos) + 1;
    return pos;
  }();
  write_bytes(path, bytes.substr(0, fifth_line + 10));  // header, 3 events, part of the 4th
  CHECK_THROWS_WITH(read_trace(path), Catch::Contains("line 5: malformed JSON"));
  const TolerantRead r = read_tolerant(path);
  CHECK(r.events == std::vector<TraceEvent>(written.begin(), written.begin() + 3));
  REQUIRE(r.truncation.has_value());
  CHECK(r.truncation->position == 5);
  // A malformed line that is not the last one stays an error.
  write_bytes(path, bytes.substr(0, fifth_line + 10) + "\n" + bytes.substr(fifth_line));
  CHECK_THROWS_WITH(read_tolerant(path), Catch::Contains("line 5: malformed JSON"));
}

TEST_CASE("the writer's temporary file can be named, and holds each checkpoint", "[format][truncated]") {
  TempDir dir("tensorpool_test_truncated");
  const std::string target = dir.file("run.tptrace");
  const std::string temp = dir.file("run.tptrace.partial");
  {
    auto writer = TraceWriter::open(target, Format::binary, TraceInfo{}, WriteOptions{temp});
    CHECK(writer->temp_path() == temp);
    writer->write(alloc_event(0));
    writer->checkpoint();
    const TolerantRead r = read_tolerant(temp);  // readable while the writer is open
    CHECK(r.events.size() == 1);
    REQUIRE(r.truncation.has_value());
    CHECK(r.truncation->verified_events == 1);
    CHECK_FALSE(std::filesystem::exists(target));
    // A second writer cannot take the same temporary name.
    CHECK_THROWS_WITH(TraceWriter::open(target, Format::binary, TraceInfo{}, WriteOptions{temp}),
                      Catch::Contains("File exists"));
    writer->finish();
  }
  CHECK(read_trace(target).events.size() == 1);
  CHECK_FALSE(std::filesystem::exists(temp));
}

TEST_CASE("a device target is written in place, and a full one fails cleanly", "[format][truncated]") {
  {
    auto writer = TraceWriter::open("/dev/null", Format::binary, TraceInfo{});
    writer->write(alloc_event(0));
    writer->checkpoint();
    writer->finish();
  }
  struct stat st {};
  REQUIRE(::stat("/dev/null", &st) == 0);
  CHECK(S_ISCHR(st.st_mode));  // still the device: nothing was renamed over it
  auto writer = TraceWriter::open("/dev/full", Format::binary, TraceInfo{});
  writer->write(alloc_event(0));
  CHECK_THROWS_WITH(writer->checkpoint(), Catch::Contains("/dev/full") && Catch::Contains("No space left"));
  CHECK_THROWS_WITH(writer->finish(), Catch::Contains("unusable after an error"));
  REQUIRE(::stat("/dev/full", &st) == 0);
  CHECK(S_ISCHR(st.st_mode));
}
