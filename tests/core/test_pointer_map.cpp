// The live-block map (src/core/pointer_map.hpp) against std::unordered_map: inserts, finds and
// erases interleaved across many growths, so that every operation also meets a table that is
// still draining into its successor.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <unordered_map>
#include <vector>

#include "core/pointer_map.hpp"

using namespace tensorpool;
using tensorpool::detail::Block;
using tensorpool::detail::PointerMap;

namespace {

Block* fake_block(std::uint64_t i) { return reinterpret_cast<Block*>(static_cast<std::uintptr_t>(0x1000 + 16 * i)); }

void expect_same(const PointerMap& map, const std::unordered_map<Address, Block*>& model) {
  REQUIRE(map.size() == model.size());
  std::size_t seen = 0;
  map.for_each([&](Address a, Block* b) {
    ++seen;
    const auto it = model.find(a);
    REQUIRE(it != model.end());
    REQUIRE(it->second == b);
  });
  REQUIRE(seen == model.size());
}

}  // namespace

TEST_CASE("pointer map: agrees with a reference map through growths and erases", "[pointer_map]") {
  for (const std::uint64_t seed : {1u, 2u, 3u}) {
    INFO("seed " << seed);
    std::mt19937_64 rng(seed);
    PointerMap map;
    std::unordered_map<Address, Block*> model;
    std::vector<Address> keys;
    std::uint64_t next = 1;
    for (int op = 0; op < 200000; ++op) {
      const unsigned r = static_cast<unsigned>(rng() % 10);
      if (r < 6 || keys.empty()) {  // grows overall: tables of 1024 up to 128k slots
        // Addresses as an allocator makes them: aligned, clustered, sometimes far apart.
        const Address a = (next++ << 9) + (rng() % 4 == 0 ? (rng() % 1024) << 40 : 0);
        if (model.count(a) != 0) continue;
        map.insert(a, fake_block(a));
        model.emplace(a, fake_block(a));
        keys.push_back(a);
      } else if (r < 9) {
        const std::size_t k = rng() % keys.size();
        const Address a = keys[k];
        keys[k] = keys.back();
        keys.pop_back();
        REQUIRE(map.erase(a) == fake_block(a));
        model.erase(a);
        REQUIRE(map.erase(a) == nullptr);
      } else {
        const Address a = keys[rng() % keys.size()];
        REQUIRE(map.find(a) == fake_block(a));
        REQUIRE(map.find(a + 1) == nullptr);
      }
      if (op % 20000 == 0) expect_same(map, model);
    }
    expect_same(map, model);
    for (const Address a : keys) REQUIRE(map.erase(a) == fake_block(a));
    REQUIRE(map.size() == 0);
  }
}

TEST_CASE("pointer map: drained tables are kept until release_retired(), and lookups never need them",
          "[pointer_map]") {
  // An insert never unmaps: a drained table waits for release_retired() (empty_cache).
  PointerMap map;
  std::unordered_map<Address, Block*> model;
  for (std::uint64_t i = 1; i <= 20000; ++i) {
    map.insert(i * 256, fake_block(i));
    model[i * 256] = fake_block(i);
  }
  const std::size_t kept = map.retired_bytes();
  REQUIRE(kept >= 1024 * 16);  // at least the first table (1,024 slots of 16 bytes) drained
  expect_same(map, model);
  map.release_retired();
  REQUIRE(map.retired_bytes() == 0);
  expect_same(map, model);
  for (std::uint64_t i = 1; i <= 20000; i += 2) {
    REQUIRE(map.erase(i * 256) == fake_block(i));
    model.erase(i * 256);
  }
  expect_same(map, model);
}
