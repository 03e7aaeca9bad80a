// Config parsing: every key, units, errors that name the key, TENSORPOOL_CONF.
#include <catch2/catch.hpp>

#include <cstdlib>

#include "tensorpool/config.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/types.hpp"

using namespace tensorpool;
using Catch::Matchers::Contains;

TEST_CASE("parse_bytes accepts binary and decimal units", "[config]") {
  std::size_t v = 0;
  REQUIRE(parse_bytes("512", v));
  REQUIRE(v == 512);
  REQUIRE(parse_bytes("4KiB", v));
  REQUIRE(v == 4096);
  REQUIRE(parse_bytes("20M", v));
  REQUIRE(v == 20 * MiB);
  REQUIRE(parse_bytes("1.5GiB", v));
  REQUIRE(v == 3 * GiB / 2);
  REQUIRE(parse_bytes("2GB", v));
  REQUIRE(v == 2'000'000'000);
  REQUIRE(parse_bytes("7b", v));
  REQUIRE(v == 7);
  for (const char* bad : {"", "-1", "abc", "12XB", "1..5G", "1e3", "99999999999999999999999"})
    REQUIRE_FALSE(parse_bytes(bad, v));
}

TEST_CASE("Config::parse sets every key", "[config]") {
  const Config c = Config::parse(
      "memory_limit:40GiB, max_split_size:256MiB,oversize_slack:8MiB,small_size:512KiB,"
      "small_segment_size:4MiB,large_segment_size:32MiB,min_split_remainder:1MiB,cross_stream_reuse:false");
  REQUIRE(c.memory_limit_bytes == 40 * GiB);
  REQUIRE(c.max_split_size == 256 * MiB);
  REQUIRE(c.oversize_slack == 8 * MiB);
  REQUIRE(c.small_size == 512 * KiB);
  REQUIRE(c.small_segment_size == 4 * MiB);
  REQUIRE(c.large_segment_size == 32 * MiB);
  REQUIRE(c.min_split_remainder == MiB);
  REQUIRE_FALSE(c.cross_stream_reuse);
  const Config v = Config::parse("mode:vmm,vmm_growth_divisor:32,vmm_max_chunk:1GiB,vmm_max_growth:256MiB,vmm_idle_divisor:4");
  REQUIRE(v.vmm_idle_divisor == 4);
  REQUIRE(Config().vmm_chunk_divisor == 16);
  REQUIRE(Config::parse("vmm_chunk_divisor:16").vmm_chunk_divisor == 16);
  REQUIRE(Config::parse("vmm_chunk_divisor:0").vmm_chunk_divisor == 0);
  REQUIRE(Config().vmm_chunk_floor_divisor == 2048);
  REQUIRE(Config::parse("vmm_chunk_floor_divisor:0").vmm_chunk_floor_divisor == 0);
  REQUIRE(Config::parse("vmm_chunk_floor_divisor:512").vmm_chunk_floor_divisor == 512);
  REQUIRE(Config().vmm_plan_max_blocks == 131072);
  REQUIRE(Config::parse("vmm_plan_max_blocks:0").vmm_plan_max_blocks == 0);
  REQUIRE_THROWS_WITH(Config::parse("vmm_plan_max_blocks:-1"), Contains("vmm_plan_max_blocks"));
  REQUIRE_THROWS_WITH(Config::parse("vmm_plan_max_blocks:99999999"), Contains("vmm_plan_max_blocks"));
  REQUIRE(Config().vmm_planner == PlannerMode::background);
  REQUIRE(Config::parse("vmm_planner:synchronous").vmm_planner == PlannerMode::synchronous);
  REQUIRE_THAT(Config::parse("vmm_planner:synchronous").to_string(), Contains("vmm_planner:synchronous"));
  REQUIRE_THROWS_WITH(Config::parse("vmm_planner:later"), Contains("'vmm_planner'") && Contains("background or synchronous"));
  // mode: auto by default (vmm where the device has virtual memory), fixed or vmm when asked.
  REQUIRE(Config().mode == Mode::automatic);
  REQUIRE(Config::parse("mode:auto").mode == Mode::automatic);
  REQUIRE(Config::parse("mode:fixed").mode == Mode::fixed);
  REQUIRE_THAT(Config().to_string(), Contains("mode:auto"));
  REQUIRE_THROWS_WITH(Config::parse("mode:paged"), Contains("'mode'") && Contains("fixed, vmm or auto"));
  REQUIRE(v.vmm_growth_divisor == 32);
  REQUIRE(v.vmm_max_chunk == GiB);
  REQUIRE(v.vmm_max_growth == 256 * MiB);
  REQUIRE(Config::parse(v.to_string()).to_string() == v.to_string());
  // to_string() round-trips through parse().
  const Config again = Config::parse(c.to_string());
  REQUIRE(again.to_string() == c.to_string());
}

TEST_CASE("memory_limit takes a fraction of the capacity", "[config]") {
  const Config c = Config::parse("memory_limit:0.5");
  REQUIRE(c.memory_limit_fraction == Approx(0.5));
  REQUIRE(c.effective_limit(80 * GiB) == 40 * GiB);
  REQUIRE(Config::parse("memory_limit:none").effective_limit(80 * GiB) == 0);
}

TEST_CASE("Config errors name the key, the value and what was expected", "[config]") {
  REQUIRE_THROWS_WITH(Config::parse("bogus:1"), Contains("unknown key 'bogus'") && Contains("max_split_size"));
  REQUIRE_THROWS_WITH(Config::parse("max_split_size:lots"),
                      Contains("bad value 'lots'") && Contains("'max_split_size'") && Contains("expected"));
  REQUIRE_THROWS_WITH(Config::parse("memory_limit:1.5"), Contains("fraction"));
  REQUIRE_THROWS_WITH(Config::parse("cross_stream_reuse:maybe"), Contains("true or false"));
  for (const char* bad : {"vmm_growth_divisor:0", "vmm_growth_divisor:64MiB", "vmm_growth_divisor:-3",
                          "vmm_growth_divisor:9999999999"})
    REQUIRE_THROWS_WITH(Config::parse(bad), Contains("'vmm_growth_divisor'") && Contains("whole number from 1 to"));
  REQUIRE_THROWS_WITH(Config::parse("vmm_max_chunk:huge"), Contains("'vmm_max_chunk'") && Contains("a size"));
  REQUIRE_THROWS_WITH(Config::parse("vmm_idle_divisor:0"), Contains("'vmm_idle_divisor'") && Contains("whole number"));
  REQUIRE_THROWS_WITH(Config::parse("vmm_chunk_divisor:-1"), Contains("'vmm_chunk_divisor'") && Contains("whole number"));
  REQUIRE_THROWS_WITH(Config::parse("vmm_chunk_divisor:4MiB"), Contains("'vmm_chunk_divisor'") && Contains("whole number"));
  REQUIRE_THROWS_WITH(Config::parse("vmm_chunk_floor_divisor:1/2"), Contains("'vmm_chunk_floor_divisor'") && Contains("whole number"));
  REQUIRE_THROWS_WITH(Config::parse("small_size"), Contains("key:value"));
  REQUIRE_THROWS_WITH(Config::parse("small_size:"), Contains("'small_size'"));
  REQUIRE_THROWS_WITH(Config::parse("max_split_size:1MiB"), Contains("at least large_segment_size"));
  REQUIRE_THROWS_WITH(Config::parse("small_size:4MiB"), Contains("small_size"));
  REQUIRE_THROWS_AS(Config::parse("min_split_remainder:1"), ConfigError);
}

TEST_CASE("Config::from_env reads TENSORPOOL_CONF", "[config]") {
  ::setenv("TENSORPOOL_CONF", "max_split_size:64MiB", 1);
  REQUIRE(Config::from_env().max_split_size == 64 * MiB);
  ::setenv("TENSORPOOL_CONF", "max_split_size:64MiB,nope:3", 1);
  REQUIRE_THROWS_WITH(Config::from_env(), Contains("TENSORPOOL_CONF") && Contains("'nope'"));
  ::unsetenv("TENSORPOOL_CONF");
  REQUIRE(Config::from_env().max_split_size == 0);
}

TEST_CASE("config: the nvtx keys are read, printed and refused when bad", "[config]") {
  const Config defaults;
  REQUIRE_FALSE(defaults.nvtx);
  REQUIRE_FALSE(defaults.nvtx_mem);
  const Config c = Config::parse("nvtx:on,nvtx_mem:true");
  REQUIRE(c.nvtx);
  REQUIRE(c.nvtx_mem);
  REQUIRE_THAT(c.to_string(), Contains("nvtx:true") && Contains("nvtx_mem:true"));
  const Config back = Config::parse(c.to_string());
  REQUIRE(back.nvtx);
  REQUIRE(back.nvtx_mem);
  REQUIRE_FALSE(Config::parse("nvtx:off").nvtx);
  REQUIRE_THROWS_WITH(Config::parse("nvtx_mem:loud"), Contains("'nvtx_mem'") && Contains("true or false"));
}
