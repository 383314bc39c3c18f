// The unit binary's main: GoogleTest's, plus two checks that keep a run from passing while testing nothing
// (docs/testing.md#no-silent-skips):
//   - a --gtest_filter (or shard) that selects no test fails, naming the filter;
//   - a multi-process worker (TESSERA_DIST_WORKER=1, started by a DistCollectives.* test through the launcher) that
//     passed no test fails, so a worker that skipped or matched nothing fails the test that launched it.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  if (GTEST_FLAG_GET(list_tests)) return rc;
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  const std::string filter = GTEST_FLAG_GET(filter);
  if (unit.test_to_run_count() == 0) {
    std::fprintf(stderr, "tessera_tests: --gtest_filter=%s selects no test; a filter that matches nothing fails\n",
                 filter.c_str());
    return 1;
  }
  const char* worker = std::getenv("TESSERA_DIST_WORKER");
  if (worker != nullptr && std::strcmp(worker, "1") == 0 && unit.successful_test_count() == 0) {
    std::fprintf(stderr, "tessera_tests: a worker (--gtest_filter=%s) passed no test: %d skipped, %d failed\n",
                 filter.c_str(), unit.skipped_test_count(), unit.failed_test_count());
    return 1;
  }
  return rc;
}
