// Replays, through the fuzz harnesses (fuzz/harness.cpp) and with the normal compiler, every
// seed of fuzz/corpus/<target>/ and every crash the fuzzers found, kept as regression inputs in
// tests/reliability/regressions/<target>/: each must be accepted or refused with the reader's
// documented error, with no other exception (and, in the asan preset, no memory error).
// Bugs the fuzzers and the differential test found are replayed as regression tests below.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "../../fuzz/harness.hpp"
#include "tensorpool/tensorpool.hpp"

namespace fs = std::filesystem;
using namespace tensorpool;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<fs::path> inputs(const fs::path& dir) {
  std::vector<fs::path> out;
  if (!fs::is_directory(dir)) return out;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_regular_file()) out.push_back(entry.path());
  return out;
}

// Runs every input of the corpus and of the regressions of `target`; returns how many.
std::size_t replay(const std::string& target) {
  const auto harness = fuzz::harness(target);
  REQUIRE(harness != nullptr);
  const fs::path source = TENSORPOOL_SOURCE_DIR;
  auto files = inputs(source / "fuzz" / "corpus" / target);
  for (const auto& p : inputs(source / "tests" / "reliability" / "regressions" / target)) files.push_back(p);
  for (const auto& p : files) {
    INFO(p.string());
    const std::string bytes = read_file(p);
    REQUIRE_NOTHROW(harness(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()));
  }
  return files.size();
}

int run(const std::string& target, const std::string& bytes) {
  return fuzz::harness(target)(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
}

}  // namespace

TEST_CASE("fuzz corpus: pickle", "[fuzz-corpus]") { CHECK(replay("pickle") >= 5); }
TEST_CASE("fuzz corpus: pytorch_snapshot", "[fuzz-corpus]") { CHECK(replay("pytorch_snapshot") >= 5); }
TEST_CASE("fuzz corpus: trace", "[fuzz-corpus]") { CHECK(replay("trace") >= 4); }
TEST_CASE("fuzz corpus: recording", "[fuzz-corpus]") { CHECK(replay("recording") >= 6); }
TEST_CASE("fuzz corpus: rmm_log", "[fuzz-corpus]") { CHECK(replay("rmm_log") >= 4); }
TEST_CASE("fuzz corpus: config", "[fuzz-corpus]") { CHECK(replay("config") >= 5); }

TEST_CASE("fuzz harness: every target refuses garbage without crashing", "[fuzz-corpus]") {
  for (const char* target : {"pickle", "pytorch_snapshot", "trace", "recording", "rmm_log", "config"}) {
    INFO(target);
    CHECK_NOTHROW(run(target, ""));
    CHECK_NOTHROW(run(target, std::string("\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\xff", 11)));
    CHECK_NOTHROW(run(target, "{\"format\":\"tensorpool-trace\"}\n\x89TPT"));
  }
}

// --- regressions of bugs found by fuzzing and the differential test (docs/reliability.md) ------

TEST_CASE("regression: Config::to_string() keeps a memory_limit fraction below 5e-7",
          "[fuzz-corpus][regression]") {
  // Found by fuzz_config: the fraction was printed with six decimals, so 1e-7 came back as
  // "0.000000", which parse() refused.
  const Config c = Config::parse("memory_limit:0.0000001");
  REQUIRE(c.memory_limit_fraction > 0.0);
  REQUIRE_NOTHROW(Config::parse(c.to_string()));
  CHECK(Config::parse(c.to_string()).memory_limit_fraction == c.memory_limit_fraction);
}

TEST_CASE("regression: vmm mode serves a request that fits when its growth step does not",
          "[regression]") {
  // Found by the differential test: a growth mapped max(need, growth step) and did not fall back
  // to just `need` when the step could not be created under the limit or on the device.
  auto sim = std::make_shared<SimulatedDevice>(SimulatedDeviceOptions{.capacity = 8 * GiB});
  Allocator alloc(sim, Config::parse("mode:vmm,vmm_max_growth:32MiB,vmm_max_chunk:32MiB"));
  std::vector<void*> held;
  for (int i = 0; i < 80; ++i) held.push_back(alloc.allocate(64 * MiB));  // 5 GiB: step 32 MiB
  alloc.set_memory_limit(alloc.usage().reserved + 16 * MiB);
  CHECK_NOTHROW(held.push_back(alloc.allocate(16 * MiB)));  // 16 MiB fit; 32 MiB do not
  for (void* p : held) alloc.deallocate(p);
}
