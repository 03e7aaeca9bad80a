// The key:value list reader shared by Config, the replay targets and the generator.
#include <catch2/catch.hpp>

#include <limits>

#include "tensorpool/errors.hpp"
#include "tensorpool/key_values.hpp"
#include "tensorpool/types.hpp"

using namespace tensorpool;
using Catch::Matchers::Contains;
using Catch::Matchers::Equals;

TEST_CASE("parse_key_values splits items, trims blanks and skips empty items", "[key_values]") {
  const auto items = parse_key_values(" a:1,, b : two words ,c:,d:x:y,", "test");
  REQUIRE(items.size() == 4);
  CHECK(items[0].key == "a");
  CHECK(items[0].value == "1");
  CHECK(items[0].column == 1);
  CHECK(items[1].key == "b");
  CHECK(items[1].value == "two words");
  CHECK(items[1].column == 7);
  CHECK(items[2].key == "c");
  CHECK(items[2].value.empty());  // what an empty value means is the key's reader's business
  CHECK(items[3].key == "d");
  CHECK(items[3].value == "x:y");  // split at the first ':'
  CHECK(parse_key_values("", "test").empty());
  CHECK(parse_key_values(" , ,", "test").empty());
  CHECK(keys_of("x:1,y:2,x:3", "test") == std::vector<std::string>{"x", "y", "x"});
}

TEST_CASE("parse_key_values names the origin, the item and its position", "[key_values]") {
  REQUIRE_THROWS_AS(parse_key_values("a:1,oops", "where"), ConfigError);
  REQUIRE_THROWS_WITH(parse_key_values("a:1, oops", "where"),
                      Equals("where: item 'oops' at character 5 is not of the form key:value"));
  REQUIRE_THROWS_WITH(parse_key_values(":5", "where"),
                      Equals("where: item ':5' at character 1 is not of the form key:value"));
}

TEST_CASE("typed readers return the value or say what they expected", "[key_values]") {
  const auto item = [](const char* key, const char* value) { return KeyValue{key, value, 1}; };
  CHECK(size_value("o", item("k", "20MiB")) == 20 * MiB);
  REQUIRE_THROWS_WITH(size_value("o", item("k", "lots")),
                      Equals("o: bad value 'lots' for key 'k': expected a size such as 512, "
                             "64KiB, 20MiB or 1.5GiB"));
  CHECK(size_or_none("o", item("k", "none")) == std::nullopt);
  CHECK(size_or_none("o", item("k", "unlimited")) == std::nullopt);
  CHECK(size_or_none("o", item("k", "1GiB")) == GiB);
  REQUIRE_THROWS_WITH(size_or_none("o", item("k", "")), Contains("or 'none'"));

  CHECK(whole_number("o", item("n", "7"), 1, 9) == 7);
  for (const char* bad : {"0", "10", "-1", "7x", "", "3.0", "99999999999999999999999"})
    REQUIRE_THROWS_WITH(whole_number("o", item("n", bad), 1, 9),
                        Contains("for key 'n': expected a whole number from 1 to 9"));
  const std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
  CHECK(whole_number("o", item("n", "18446744073709551615"), 0, max) == max);
  REQUIRE_THROWS_WITH(whole_number("o", item("n", "18446744073709551616"), 0, max),
                      Contains("a whole number of at least 0"));

  CHECK(decimal_number("o", item("x", "1.25"), 1.0, 4.0) == 1.25);
  CHECK(decimal_number("o", item("x", "4"), 1.0, 4.0) == 4.0);
  for (const char* bad : {"0.5", "4.5", "-1", "1e2", "", "1.2.3", "nan", "x"})
    REQUIRE_THROWS_WITH(decimal_number("o", item("x", bad), 1.0, 4.0),
                        Contains("for key 'x': expected a number from 1 to 4"));
  REQUIRE_THROWS_WITH(decimal_number("o", item("x", "9"), 0.0, 0.5), Contains("from 0 to 0.5"));

  for (const char* yes : {"true", "True", "1", "on", "yes"}) CHECK(bool_value("o", item("b", yes)));
  for (const char* no : {"false", "False", "0", "off", "no"}) CHECK_FALSE(bool_value("o", item("b", no)));
  REQUIRE_THROWS_WITH(bool_value("o", item("b", "maybe")),
                      Equals("o: bad value 'maybe' for key 'b': expected true or false"));
}

TEST_CASE("throw_unknown_key lists the known keys", "[key_values]") {
  const KeyValue bogus{"bogus", "1", 3};
  REQUIRE_THROWS_WITH(throw_unknown_key("o", bogus, {"a", "b"}),
                      Equals("o: unknown key 'bogus'; known keys: a, b"));
  REQUIRE_THROWS_WITH(throw_unknown_key("o", bogus, {}), Equals("o: unknown key 'bogus'; known keys: none"));
}
