// ckptd on a shared root (cluster mode), as a real process: what its start
// may and may not touch there. Other nodes (and the coordinator) write to
// the same directory tree at the same time.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/harness.h"

namespace ckpt::testing {
namespace {

// A node that (re)starts must not delete the temp files of writes other
// nodes have in flight (their persists would fail at the rename); only
// its own leftovers, from before its restart, go.
TEST(SharedRootTest, DaemonStartKeepsOtherNodesTempFiles) {
  TempDir dir, run;
  const std::string shared = dir.path() + "/shared";
  const std::string step = shared + "/job/step-00000001";
  std::filesystem::create_directories(step);
  const std::string other = step + "/rank-00001.b.shard.tmp.b.77-abc-0";
  const std::string coordinator = step + "/MANIFEST.global.tmp.78-abd-1";
  const std::string own = step + "/rank-00000.a.shard.tmp.a.66-def-0";
  for (const std::string& f : {other, coordinator, own})
    std::ofstream(f) << "in flight";
  // No coordinator answers at this address; the daemon starts anyway.
  auto d =
      DaemonProcess::Start(dir.path() + "/root", run.path(), UniqueShmPrefix(),
                           {"--coordinator", "127.0.0.1:1", "--insecure",
                            "--node-id", "a", "--shared-root", shared});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(std::filesystem::exists(other)) << "node b's write in flight";
  EXPECT_TRUE(std::filesystem::exists(coordinator))
      << "the coordinator's manifest write in flight";
  EXPECT_FALSE(std::filesystem::exists(own)) << "node a's own leftover";
}

}  // namespace
}  // namespace ckpt::testing
