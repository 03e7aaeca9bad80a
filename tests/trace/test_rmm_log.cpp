// Tests of the RMM log importer (trace/rmm_log.hpp): the CSV of logging_resource_adaptor parsed
// field by field, converted event by event (seeds for pointers freed before being allocated,
// free -> free_requested + free_completed, failures -> oom, times across midnight), CRLF and
// trailing newlines, and errors that name the file, line, column and field.
#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "tensorpool/trace/rmm_log.hpp"

namespace fs = std::filesystem;
using namespace tensorpool::trace;

namespace importer_test {  // defined in test_pytorch_snapshot.cpp
struct ReplayResult {
  std::size_t problem_count = 0;
  std::vector<std::string> problems;
  std::map<std::uint16_t, std::uint64_t> held;
  std::map<std::uint16_t, std::uint64_t> live;
};
ReplayResult replay(const Trace& trace, bool check_containment);
}  // namespace importer_test

namespace {

const std::string kHeader = "Thread,Time,Action,Pointer,Size,Stream\n";
constexpr std::int64_t kHourUs = 3600LL * 1000000;

rmm::LogError log_error(const std::string& text) {
  try {
    (void)rmm::parse_log(text, "log.csv");
  } catch (const rmm::LogError& e) {
    return e;
  }
  FAIL("expected a LogError for: " << text);
  throw std::logic_error("unreachable");
}

void check_error(const std::string& text, std::size_t line, std::size_t column,
                 const std::string& field, const std::string& reason) {
  const rmm::LogError e = log_error(text);
  INFO(e.what());
  CHECK(e.source() == "log.csv");
  CHECK(e.line() == line);
  CHECK(e.column() == column);
  CHECK(e.field() == field);
  CHECK_THAT(e.reason(), Catch::Contains(reason));
  const std::string prefix =
      "log.csv:" + std::to_string(line) + ":" + std::to_string(column) + ": ";
  CHECK_THAT(e.what(), Catch::StartsWith(prefix + (field.empty() ? "" : field + ": ")));
}

struct Expected {
  Op op;
  std::uint64_t addr;
  std::uint64_t size;
  std::uint64_t stream;
  std::int64_t time;
};

void check_events(const Trace& trace, const std::vector<Expected>& expected) {
  REQUIRE(trace.events.size() == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    INFO("event " << i);
    const TraceEvent& e = trace.events[i];
    CHECK(e.op == expected[i].op);
    CHECK(e.addr == expected[i].addr);
    CHECK(e.size == expected[i].size);
    CHECK(e.stream == expected[i].stream);
    CHECK(e.time_us == expected[i].time);
    CHECK(e.device == 0);
    CHECK(e.label == 0);
  }
}

}  // namespace

TEST_CASE("rmm: parses the fields of logging_resource_adaptor", "[rmm]") {
  const std::string text = kHeader +
                           "140573312345856,18:19:50.427419,allocate,0x7f8a40000000,1024,0\n"
                           "\n"
                           "7, 18:19:50:427420 ,free,0x7f8a40000000,1024,0x55d0c3a1e2f0\n"
                           "7,18:19:51.5,allocate failure,(nil),99,0\n"
                           "8,1634567890.123456,deallocate,7f8a40000400,2048,10\n";
  const std::vector<rmm::LogEntry> entries = rmm::parse_log(text, "x.csv");
  REQUIRE(entries.size() == 4);
  const std::int64_t t0 = ((18 * 60 + 19) * 60 + 50) * 1000000LL + 427419;
  CHECK(entries[0].thread == 140573312345856ULL);
  CHECK(entries[0].time_us == t0);
  CHECK(entries[0].action == rmm::Action::allocate);
  CHECK(entries[0].pointer == 0x7f8a40000000ULL);
  CHECK(entries[0].size == 1024);
  CHECK(entries[0].stream == 0);
  CHECK(entries[0].line == 2);
  CHECK(entries[1].time_us == t0 + 1);  // "HH:MM:SS:us" as in RMM's replay benchmark
  CHECK(entries[1].action == rmm::Action::free);
  CHECK(entries[1].stream == 0x55d0c3a1e2f0ULL);
  CHECK(entries[1].line == 4);
  CHECK(entries[2].time_us == t0 - 427419 + 1500000);  // a short fraction is tenths
  CHECK(entries[2].action == rmm::Action::allocate_failure);
  CHECK(entries[2].pointer == 0);
  CHECK(entries[3].time_us == 1634567890123456LL);  // seconds since the epoch
  CHECK(entries[3].action == rmm::Action::free);    // "deallocate"
  CHECK(entries[3].pointer == 0x7f8a40000400ULL);
  CHECK(entries[3].stream == 0x10);  // streams are hex
  CHECK(std::string(rmm::to_string(rmm::Action::allocate_failure)) == "allocate failure");
}

TEST_CASE("rmm: converts a CRLF log across midnight, event by event", "[rmm]") {
  const fs::path file = fs::path(TENSORPOOL_IMPORTER_FIXTURES) / "rmm_crlf.csv";
  const Trace trace = rmm::import_log(file);
  CHECK(trace.info.source == "rmm-log:rmm_crlf.csv");
  CHECK(trace.info.metadata == std::vector<std::string>{"threads=2"});
  const std::uint64_t p = 0x7f8a40000000, q = 0x7f8a3f000000, s = 0x55d0c3a1e2f0;
  const std::int64_t last = 24 * kHourUs - 1000;  // 23:59:59.999000
  check_events(trace,
               {
                   {Op::seed_alloc, q, 4096, s, last},  // freed before the log allocates it
                   {Op::alloc, p, 1024, 0, last},
                   {Op::free_requested, q, 4096, s, last + 500},
                   {Op::free_completed, q, 4096, s, last + 500},
                   {Op::oom, 0, std::uint64_t{1} << 40, 0, 24 * kHourUs + 250},  // the next day
                   {Op::free_requested, p, 1024, 0, 24 * kHourUs + 300},
                   {Op::free_completed, p, 1024, 0, 24 * kHourUs + 300},
               });
  const auto r = importer_test::replay(trace, false);
  for (const auto& problem : r.problems) UNSCOPED_INFO(problem);
  CHECK(r.problem_count == 0);
  CHECK(r.live.at(0) == 0);
}

TEST_CASE("rmm: times never go backwards and the options pick the device", "[rmm]") {
  const std::string text = kHeader +
                           "1,10:00:00.000100,allocate,0x100,8,0\n"
                           "2,10:00:00.000050,allocate,0x200,8,0\n";  // another thread, logged late
  rmm::ConvertOptions options;
  options.device = 3;
  const Trace trace = rmm::to_trace(rmm::parse_log(text, "t.csv"), "t.csv", options);
  REQUIRE(trace.events.size() == 2);
  CHECK(trace.events[0].time_us == trace.events[1].time_us);
  CHECK(trace.events[1].device == 3);
}

TEST_CASE("rmm: tolerates a BOM, blank lines and a missing final newline", "[rmm]") {
  const std::string text = "\xEF\xBB\xBF" + kHeader + "\r\n1,00:00:01.000000,allocate,0x10,1,0";
  const auto entries = rmm::parse_log(text, "x.csv");
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].line == 3);
  CHECK(rmm::parse_log(kHeader, "x.csv").empty());
}

TEST_CASE("rmm: errors name the file, line, column and field", "[rmm]") {
  check_error("", 1, 1, "",
              "empty log: expected the header 'Thread,Time,Action,Pointer,Size,Stream'");
  check_error("\n\n", 2, 1, "", "empty log");
  check_error("Thread,Time,Action,Pointer,Size\n", 1, 1, "", "expected the header");
  const std::string good = "1,12:00:00.000001,allocate,0x10,";
  check_error(kHeader + good + "12x,0\n", 2, 33, "Size",
              "expected a decimal byte count, got '12x'");
  check_error(kHeader + good + "12,0xg\n", 2, 36, "Stream", "expected a hexadecimal stream");
  check_error(kHeader + "1,12:00:00.000001,allocate,zz,12,0\n", 2, 28, "Pointer", "got 'zz'");
  check_error(kHeader + "1,12:00:00.000001,alloc,0x10,12,0\n", 2, 19, "Action",
              "expected allocate, free or allocate failure, got 'alloc'");
  check_error(kHeader + "1,25:00:00.000001,allocate,0x10,12,0\n", 2, 3, "Time", "expected a time");
  check_error(kHeader + "1,12:00,allocate,0x10,12,0\n", 2, 3, "Time", "expected a time");
  check_error(kHeader + "x1,12:00:00.000001,allocate,0x10,12,0\n", 2, 1, "Thread",
              "expected a decimal thread id");
  check_error(kHeader + "1,12:00:00.000001,allocate,0x10,99999999999999999999,0\n", 2, 33, "Size",
              "expected a decimal byte count");
  check_error(kHeader + "1,12:00:00.000001,allocate\n", 2, 1, "",
              "expected 6 comma-separated fields");
  check_error(kHeader + good + "1,0\n" + "1,2,3,4,5,6,7\r\n", 3, 1, "", "got 7");
  const rmm::LogError e = log_error(kHeader + good + "12x,0\n");
  CHECK(std::string(e.what()) == "log.csv:2:33: Size: expected a decimal byte count, got '12x'");
}
