// Tests of the simulated device's cost model (tensorpool/cost_model.hpp): evaluation between,
// below and beyond the points, the file format and its errors, and the device charging it.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "tensorpool/cost_model.hpp"
#include "tensorpool/errors.hpp"
#include "tensorpool/simulated_device.hpp"

using namespace tensorpool;

TEST_CASE("cost model: the default grows with bytes, through the published figures", "[cost_model]") {
  const CostModel m;
  CHECK(m.source() == "default");
  // The documented points (cost_model.hpp): one call on 2 MiB, and on 1 GiB.
  CHECK(m.cost(CostedCall::physical_create, 2 * MiB) == 193'300);
  CHECK(m.cost(CostedCall::physical_create, GiB) == 31'200'000);
  CHECK(m.cost(CostedCall::map, 2 * MiB) == 37'400);
  CHECK(m.cost(CostedCall::unmap, 2 * MiB) == 25'600);
  CHECK(m.cost(CostedCall::physical_release, GiB) == 2'500'000);
  CHECK(m.cost(CostedCall::segment_alloc, 64 * KiB) == 50'000);  // small cudaMalloc: flat
  CHECK(m.cost(CostedCall::segment_alloc, 2 * MiB) == 230'700);
  // Every call costs more for more bytes, and one large call less than many small ones.
  for (const CostedCall c : {CostedCall::segment_alloc, CostedCall::segment_free, CostedCall::physical_create,
                             CostedCall::physical_release, CostedCall::map, CostedCall::unmap}) {
    INFO(to_string(c));
    CHECK(m.cost(c, 20 * MiB) > m.cost(c, 2 * MiB));
    CHECK(m.cost(c, 4 * GiB) > m.cost(c, GiB));
    CHECK(m.cost(c, 20 * MiB) < 10 * m.cost(c, 2 * MiB));
  }
  // cudaMalloc is a creation and a mapping of its size; cudaFree an unmapping and a release.
  CHECK(m.cost(CostedCall::segment_alloc, GiB) ==
        m.cost(CostedCall::physical_create, GiB) + m.cost(CostedCall::map, GiB));
  CHECK(m.cost(CostedCall::segment_free, GiB) ==
        m.cost(CostedCall::unmap, GiB) + m.cost(CostedCall::physical_release, GiB));
  CHECK(&CostModel::standard() == &CostModel::standard());  // one shared model
  CHECK(CostModel::standard().cost(CostedCall::map, GiB) == m.cost(CostedCall::map, GiB));
}

TEST_CASE("cost model: flat() is the flat cost the simulated device charged before", "[cost_model]") {
  const CostModel m = CostModel::flat();
  CHECK(m.cost(CostedCall::segment_alloc, 2 * MiB) == 20'000);
  CHECK(m.cost(CostedCall::segment_alloc, 10 * GiB) == 20'000);
  CHECK(m.cost(CostedCall::segment_free, 1) == 10'000);
  CHECK(m.cost(CostedCall::physical_create, 2 * MiB) == 15'000);
  CHECK(m.cost(CostedCall::map, 2 * MiB) == 20'000);
  CHECK(m.cost(CostedCall::unmap, 2 * MiB) == 15'000);
  CHECK(m.cost(CostedCall::physical_release, 2 * MiB) == 0);
  CHECK(m.source() == "flat");
  CHECK(load_cost_model("flat").cost(CostedCall::map, GiB) == 20'000);
  CHECK(load_cost_model("default").cost(CostedCall::map, GiB) == 500'000);
}

TEST_CASE("cost model: piecewise linear in bytes, flat below the first point, extrapolated beyond the last",
          "[cost_model]") {
  CostModel m;
  m.set(CostedCall::segment_alloc, {{4 * MiB, 3'000}, {2 * MiB, 1'000}, {8 * MiB, 5'000}});
  CHECK(m.cost(CostedCall::segment_alloc, 1) == 1'000);         // below: the first point
  CHECK(m.cost(CostedCall::segment_alloc, 2 * MiB) == 1'000);
  CHECK(m.cost(CostedCall::segment_alloc, 3 * MiB) == 2'000);   // halfway between 2 and 4 MiB
  CHECK(m.cost(CostedCall::segment_alloc, 4 * MiB) == 3'000);
  CHECK(m.cost(CostedCall::segment_alloc, 6 * MiB) == 4'000);
  CHECK(m.cost(CostedCall::segment_alloc, 16 * MiB) == 9'000);  // beyond: the last slope goes on
  m.set(CostedCall::unmap, {{2 * MiB, 900}, {4 * MiB, 100}});
  CHECK(m.cost(CostedCall::unmap, 64 * MiB) == 0);  // a falling cost stops at 0
  m.set(CostedCall::map, {{2 * MiB, 1}, {2 * MiB, 7}});  // equal bytes: the last point wins
  CHECK(m.points(CostedCall::map).size() == 1);
  CHECK(m.cost(CostedCall::map, GiB) == 7);
}

TEST_CASE("cost model: the file format, comments and defaults for calls it leaves out", "[cost_model]") {
  const CostModel m = parse_cost_model(
      "# tensorpool cost model v1\n"
      "\n"
      "segment_alloc 2097152 9000   # cudaMalloc 2 MiB\n"
      "segment_alloc 1073741824 310000\n"
      "  free_async 2097152 800\n",
      "gpu.txt");
  CHECK(m.source() == "gpu.txt");
  CHECK(m.cost(CostedCall::segment_alloc, 2 * MiB) == 9'000);
  CHECK(m.cost(CostedCall::segment_alloc, GiB) == 310'000);
  CHECK(m.cost(CostedCall::free_async, 2 * MiB) == 800);
  CHECK(m.cost(CostedCall::segment_free, 2 * MiB) == 30'500);  // not in the file: the default's
}

TEST_CASE("cost model: bad lines name the file, the line and what was expected", "[cost_model]") {
  auto error_of = [](const char* text) {
    try {
      parse_cost_model(text, "m.txt");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(error_of("segment_alloc 1 2\ncudaMalloc 1 2\n"),
             Catch::Contains("m.txt: line 2: unknown call 'cudaMalloc'"));
  CHECK_THAT(error_of("map 2MiB 5\n"), Catch::Contains("line 1: expected 'CALL BYTES NANOSECONDS'"));
  CHECK_THAT(error_of("map 10 -5\n"), Catch::Contains("line 1: expected"));
  CHECK_THAT(error_of("map 10\n"), Catch::Contains("line 1: expected"));
  CHECK_THAT(error_of("map 10 5 6\n"), Catch::Contains("line 1: unexpected field '6'"));
  CHECK_THAT(error_of("\n\nunmap 1 99999999999999999999\n"), Catch::Contains("line 3: expected"));
  CHECK_THROWS_AS(load_cost_model("/nonexistent/cost.txt"), ConfigError);
}

TEST_CASE("cost model: the simulated device charges it by the bytes of each call", "[cost_model]") {
  auto model = std::make_shared<CostModel>();
  model->set(CostedCall::segment_alloc, {{2 * MiB, 1'000}, {4 * MiB, 2'000}});
  model->set(CostedCall::segment_free, {{0, 50}});
  model->set(CostedCall::physical_release, {{0, 7}});
  SimulatedDeviceOptions o;
  o.cost_model = model;
  SimulatedDevice d(o);
  void* a = d.allocate_segment(2 * MiB, 0);
  void* b = d.allocate_segment(8 * MiB, 0);  // extrapolated: 4'000
  REQUIRE(d.counters().modelled_ns == 5'000);
  d.free_segment(a, 2 * MiB, 0);
  d.free_segment(b, 8 * MiB, 0);
  REQUIRE(d.counters().modelled_ns == 5'100);
  const PhysicalHandle h = d.create_physical(2 * MiB);  // not in the model: the default's 193.3 us
  d.release_physical(h);
  REQUIRE(d.counters().modelled_ns == 5'100 + 193'300 + 7);
  // A device without a model of its own charges the default one.
  SimulatedDevice plain;
  void* c = plain.allocate_segment(2 * MiB, 0);
  REQUIRE(plain.counters().modelled_ns == CostModel::standard().cost(CostedCall::segment_alloc, 2 * MiB));
  plain.free_segment(c, 2 * MiB, 0);
}
