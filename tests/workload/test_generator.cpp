// The LLM trace generator: consistent traces, determinism, options.
#include <catch2/catch.hpp>

#include <map>
#include <set>

#include "tensorpool/errors.hpp"
#include "tensorpool/workload/generator.hpp"

using namespace tensorpool;
using namespace tensorpool::workload;
using trace::Op;

namespace {
GeneratorOptions small() {
  GeneratorOptions g;
  g.layers = 3;
  g.hidden = 512;
  g.vocab = 5000;
  g.seq_len = 512;
  g.iterations = 5;
  return g;
}
}  // namespace

TEST_CASE("generated traces free only live blocks and mark iterations", "[generator]") {
  for (bool training : {true, false}) {
    GeneratorOptions g = small();
    g.training = training;
    const trace::Trace t = generate_llm_trace(g);
    std::map<std::uint64_t, std::uint64_t> live;
    int iterations = 0;
    std::set<std::uint64_t> streams;
    for (const auto& e : t.events) {
      switch (e.op) {
        case Op::alloc:
          REQUIRE(e.size > 0);
          REQUIRE(live.emplace(e.addr, e.size).second);
          break;
        case Op::free_requested: REQUIRE(live.count(e.addr) == 1); break;
        case Op::free_completed: REQUIRE(live.erase(e.addr) == 1); break;
        case Op::record_stream: REQUIRE(live.count(e.addr) == 1); streams.insert(e.stream); break;
        case Op::iteration: REQUIRE(e.size == static_cast<std::uint64_t>(iterations++)); break;
        default: break;
      }
    }
    REQUIRE(iterations == 5);
    REQUIRE(!live.empty());  // weights (and optimizer state) stay live
    if (training) REQUIRE(streams.size() == 1);
  }
}

TEST_CASE("the generator is deterministic and varlen varies the sizes", "[generator]") {
  const GeneratorOptions g = small();
  REQUIRE(generate_llm_trace(g).events == generate_llm_trace(g).events);
  GeneratorOptions fixed = g;
  fixed.varlen = false;
  auto activation_sizes = [](const trace::Trace& t) {
    std::set<std::uint64_t> sizes;
    for (const auto& e : t.events)
      if (e.op == Op::alloc && t.labels[e.label] == "mlp.up") sizes.insert(e.size);
    return sizes;
  };
  REQUIRE(activation_sizes(generate_llm_trace(fixed)).size() == 1);
  REQUIRE(activation_sizes(generate_llm_trace(g)).size() > 1);
}

TEST_CASE("generator options parse and reject bad input", "[generator]") {
  GeneratorOptions g;
  g.apply("layers:2,hidden:256,varlen:false,seed:9");
  REQUIRE(g.layers == 2);
  REQUIRE(g.hidden == 256);
  REQUIRE_FALSE(g.varlen);
  GeneratorOptions again;
  again.apply(g.to_string());
  REQUIRE(again.to_string() == g.to_string());
  using Catch::Matchers::Contains;
  REQUIRE_THROWS_WITH(g.apply("layerz:2"), Contains("generator options: unknown key 'layerz'") &&
                                               Contains("known keys: layers, hidden"));
  REQUIRE_THROWS_WITH(g.apply("layers:-2", "--options"),
                      Contains("--options: bad value '-2' for key 'layers': expected a whole number"));
  REQUIRE_THROWS_WITH(g.apply("hidden:32"), Contains("'hidden'") && Contains("at least 64"));
  REQUIRE_THROWS_WITH(g.apply("varlen:maybe"), Contains("'varlen'") && Contains("true or false"));
  REQUIRE_THROWS_WITH(g.apply("layers:2,seed"), Contains("item 'seed' at character 10"));
}
