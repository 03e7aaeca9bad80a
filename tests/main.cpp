// The Catch2 main shared by every test executable. Besides Catch2's own exit status it reports a
// run whose every test case was skipped (TP_SKIP, tests/support/skip.hpp) with kSkipExitCode,
// which CTest shows as "Skipped".
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <set>
#include <string>

#include "support/skip.hpp"

namespace {

struct SkipCount {
  std::string current;             // the test case running
  std::size_t started = 0;         // test cases run
  std::set<std::string> skipped;   // ... of which skipped
};
SkipCount& skip_count() {
  static SkipCount count;
  return count;
}

class SkipListener : public Catch::TestEventListenerBase {
 public:
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseStarting(const Catch::TestCaseInfo& info) override {
    skip_count().current = info.name;
    ++skip_count().started;
  }
};

}  // namespace

CATCH_REGISTER_LISTENER(SkipListener)

void tptest::mark_skipped() { skip_count().skipped.insert(skip_count().current); }

int main(int argc, char* argv[]) {
  const int failed = Catch::Session().run(argc, argv);
  const SkipCount& count = skip_count();
  if (failed == 0 && count.started > 0 && count.skipped.size() == count.started) return tptest::kSkipExitCode;
  return failed;
}
