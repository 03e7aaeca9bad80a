// fuzz/make_recording_seeds.cpp: writes the seed corpus of fuzz_recording with the project's own
// trace writer, shaped like live recordings (tensorpool/record.hpp): checkpoints after batches,
// files cut in an event, in a checkpoint and after the header, a corrupted batch, a complete
// recording, and a JSON-lines recording cut mid-line, in the current format version (the seeds
// *_v1.tptrace, written by the version-1 writer, stay for the older version). Usage:
// fuzz_make_recording_seeds DIR
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "tensorpool/trace/format.hpp"

using namespace tensorpool::trace;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// Cycles through alloc, record_stream, free_requested and (format version 2) empty_cache.
TraceEvent event(int i) {
  TraceEvent e;
  e.op = i % 4 == 0 ? Op::alloc : i % 4 == 1 ? Op::record_stream : i % 4 == 2 ? Op::free_requested : Op::empty_cache;
  e.device = static_cast<std::uint16_t>(i % 2);
  e.time_us = i * 13;
  if (e.op == Op::empty_cache) return e;  // no fields
  e.stream = static_cast<std::uint64_t>(i % 4);
  e.addr = 0x7f0000000000 + static_cast<std::uint64_t>(i / 4) * 0x200000;
  e.size = e.op == Op::record_stream ? 0 : 1000 + static_cast<std::uint64_t>(i);
  return e;
}

/// The bytes of a recording of `batches` batches of `per_batch` events with a checkpoint after
/// each, as a killed process leaves them (no end record), or complete.
std::string recording(const std::string& dir, Format format, int batches, int per_batch, bool complete) {
  const std::string target = dir + "/.seed-target";
  const std::string temp = target + ".partial";
  std::string bytes;
  {
    auto writer = TraceWriter::open(target, format, TraceInfo{"tensorpool-recording", {"pid=1"}},
                                    WriteOptions{temp});
    writer->checkpoint();
    for (int b = 0, i = 0; b < batches; ++b) {
      for (int k = 0; k < per_batch; ++k, ++i) writer->write(event(i), i == 0 ? "first" : "");
      writer->checkpoint();
    }
    if (complete) {
      writer->finish();
      bytes = read_file(target);
      std::remove(target.c_str());
    } else {
      bytes = read_file(temp);  // the writer removes its temporary file when destroyed unfinished
    }
  }
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const std::string killed = recording(dir, Format::binary, 3, 5, false);
  write_file(dir + "/killed.tptrace", killed);
  write_file(dir + "/complete.tptrace", recording(dir, Format::binary, 2, 4, true));
  write_file(dir + "/header_only.tptrace", recording(dir, Format::binary, 0, 0, false));
  write_file(dir + "/cut_in_event.tptrace", killed.substr(0, killed.size() - 9));
  write_file(dir + "/cut_in_checkpoint.tptrace", killed.substr(0, killed.size() - 3));
  std::string corrupted = killed;
  corrupted[corrupted.size() - 20] = static_cast<char>(corrupted[corrupted.size() - 20] ^ 0x04);
  write_file(dir + "/corrupted_batch.tptrace", corrupted);
  const std::string jsonl = recording(dir, Format::jsonl, 2, 3, false);
  write_file(dir + "/cut_mid_line.jsonl", jsonl.substr(0, jsonl.size() - 17));
  return 0;
}
