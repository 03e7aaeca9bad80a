// The RMM log writer (trace/rmm_log_writer.hpp): what it writes, our RMM reader reads back
// entry for entry, across midnight too; the temporary file and the in-place device behave like
// the native writer's.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "support/temp_dir.hpp"
#include "tensorpool/trace/rmm_log_writer.hpp"

using namespace tensorpool::trace;
using tensorpool::testing::read_bytes;
using tensorpool::testing::TempDir;

namespace {

rmm::LogEntry entry(std::uint64_t thread, std::int64_t time_us, rmm::Action action,
                    std::uint64_t pointer, std::uint64_t size, std::uint64_t stream) {
  return {.thread = thread, .time_us = time_us, .action = action, .pointer = pointer, .size = size, .stream = stream};
}

}  // namespace

TEST_CASE("RMM log writer: lines our RMM reader reads back unchanged", "[rmm-log]") {
  TempDir dir("tensorpool_test_rmm_writer");
  const std::string path = dir.file("log.csv");
  constexpr std::int64_t kHour = 3600LL * 1'000'000;
  const std::vector<rmm::LogEntry> entries = {
      entry(140234, 9 * kHour + 1, rmm::Action::allocate, 0x7f8a40000000, 1024, 0),
      entry(140235, 9 * kHour + 17, rmm::Action::allocate, 0x7f8a40000400, 4096, 0x55d0c3a1e2f0),
      entry(140234, 23 * kHour + 59 * 60'000'000LL + 999'999, rmm::Action::free, 0x7f8a40000000, 1024, 0),
      entry(140234, 24 * kHour + 5, rmm::Action::allocate_failure, 0, 1ULL << 40, 0),  // after midnight
      entry(7, 25 * kHour, rmm::Action::free, 0x7f8a40000400, 4096, 0x55d0c3a1e2f0),
  };
  {
    auto writer = rmm::LogWriter::open(path);
    for (const auto& e : entries) writer->write(e);
    CHECK(writer->entries_written() == entries.size());
    CHECK_FALSE(std::filesystem::exists(path));  // in a temporary file until finish()
    writer->finish();
  }
  const std::string text = read_bytes(path);
  CHECK(text.rfind("Thread,Time,Action,Pointer,Size,Stream\n140234,09:00:00.000001,allocate,0x7f8a40000000,1024,0\n", 0) == 0);
  CHECK(text.find(",allocate failure,(nil),1099511627776,0\n") != std::string::npos);
  const auto back = rmm::load_log(path);
  REQUIRE(back.size() == entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i) {
    INFO("entry " << i);
    CHECK(back[i].thread == entries[i].thread);
    CHECK(back[i].time_us == entries[i].time_us);
    CHECK(back[i].action == entries[i].action);
    CHECK(back[i].pointer == entries[i].pointer);
    CHECK(back[i].size == entries[i].size);
    CHECK(back[i].stream == entries[i].stream);
  }
}

TEST_CASE("RMM log writer: checkpoints reach the file, failures are errors", "[rmm-log]") {
  TempDir dir("tensorpool_test_rmm_writer");
  const std::string path = dir.file("log.csv");
  auto writer = rmm::LogWriter::open(path, WriteOptions{path + ".partial"});
  CHECK(writer->temp_path() == path + ".partial");
  writer->write(entry(1, 5, rmm::Action::allocate, 0x1000, 10, 0));
  writer->checkpoint();
  CHECK(rmm::load_log(path + ".partial").size() == 1);  // readable while recording
  writer->finish();
  CHECK_THROWS_WITH(writer->write(entry(1, 6, rmm::Action::free, 0x1000, 10, 0)), Catch::Contains("already finished"));

  auto full = rmm::LogWriter::open("/dev/full");
  full->write(entry(1, 5, rmm::Action::allocate, 0x1000, 10, 0));
  CHECK_THROWS_WITH(full->checkpoint(), Catch::Contains("'/dev/full'") && Catch::Contains("No space left"));
  CHECK_THROWS_WITH(full->finish(), Catch::Contains("unusable after an error"));
}
