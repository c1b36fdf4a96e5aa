// A cluster without a shared filesystem: ckptd and ckpt-coordinator get
// --shared-root s3://BUCKET/PREFIX (a real s3rver), the nodes' shards and
// the global manifests go to the object store, and a spare that replaces
// a lost node prefetches the lost ranks' shards from it. The trainers check
// every restored byte.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "storage/keys.h"
#include "storage/manifest.h"
#include "tests/cluster_harness.h"
#include "tests/harness.h"
#include "tests/s3_server.h"

namespace ckpt::testing {
namespace {

using std::chrono::seconds;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs a job of three nodes and a spare on s3rver, kills node b, and checks
// that every rank resumes bit-exact from one step, b's ranks on the spare
// from the object store. The trainers run through trainer_prefix, as
// trainer_uid.
void RecoverLostNodeFromObjectStore(
    const std::vector<std::string>& trainer_prefix, uid_t trainer_uid) {
  S3Server s3;
  ASSERT_TRUE(s3.ok());
  ExportS3Environment(s3.endpoint());
  TempDir dir;
  ClusterOptions o;
  o.dir = dir.path();
  o.world_size = 6;  // three nodes of two ranks, and a spare
  o.bytes_per_rank = 4 << 20;
  o.steps_after_restore = 10;  // the ranks need only show that they run on
  // StrCat: GCC 12 misreads string operator+ here as an over-read.
  o.shared_root_url = absl::StrCat("s3://", kS3Bucket, "/cluster");
  o.trainer_prefix = trainer_prefix;
  Cluster cluster(o);
  auto dump = [&] { return cluster.DumpLogs(); };
  cluster.StartCoordinator();
  cluster.StartNode("a");
  cluster.StartNode("b");
  cluster.StartNode("c");
  cluster.StartNode("d", /*spare=*/true);
  auto last_good = [&]() -> uint64_t {
    auto job = cluster.Job();
    return job && job->has_last_good() ? job->last_good_step() : 0;
  };
  ASSERT_TRUE(Cluster::WaitUntil([&] { return last_good() >= 3; }, seconds(90)))
      << dump();
  // The step the coordinator calls good has its global manifest in the store.
  auto objects = storage::NewObjectBackend(s3.Options("cluster"));
  ASSERT_TRUE(objects.ok()) << objects.status();
  const uint64_t good = last_good();
  auto manifest = storage::ReadGlobalManifest(**objects, "job", good);
  ASSERT_TRUE(manifest.ok()) << manifest.status() << dump();
  EXPECT_EQ(manifest->shards_size(), 6);
  for (const auto& shard : manifest->shards())
    EXPECT_TRUE((*objects)->Stat(shard.key()).ok()) << shard.key();

  cluster.KillNode("b");
  for (const std::string id : {"a", "c", "d"}) {
    auto st = cluster.WaitLauncher(id, seconds(150));
    ASSERT_TRUE(st.has_value())
        << "ckptrun of node " << id << " still running" << dump();
    EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << id << dump();
  }
  std::set<uint64_t> steps;
  for (uint32_t r = 0; r < o.world_size; ++r) {
    struct stat log {};
    ASSERT_EQ(stat((dir.path() + "/trainers/rank-" + std::to_string(r) + ".log")
                       .c_str(),
                   &log),
              0);
    EXPECT_EQ(log.st_uid, trainer_uid) << "rank " << r << " ran as another uid";
    bool done = false;
    for (const auto& l : cluster.TrainerLog(r)) {
      EXPECT_NE(l.kind, "mismatch") << "rank " << r;
      EXPECT_NE(l.kind, "restore_failed") << "rank " << r;
      if (l.kind == "restored") steps.insert(std::stoull(l.fields.at("step")));
      if (l.kind == "done") done = true;
    }
    EXPECT_TRUE(done) << "rank " << r;
  }
  EXPECT_EQ(steps.size(), 1u) << "ranks resumed at different steps" << dump();
  auto job = cluster.Job();
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->rank_node(2), "d");
  EXPECT_EQ(job->rank_node(3), "d");
  const std::string spare_log = Slurp(dir.path() + "/node-d/ckptd.log");
  EXPECT_NE(spare_log.find("prefetched"), std::string::npos) << spare_log;
  EXPECT_NE(spare_log.find("(object tier)"), std::string::npos) << spare_log;
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/shared"))
      << "no shared directory";
}

TEST(ClusterObjectStoreTest,
     NodeLostWithoutSharedDirectoryIsRecoveredFromObjectStoreBitExact) {
  if (std::string why = S3Server::Unavailable(); !why.empty())
    GTEST_SKIP() << why;
  RecoverLostNodeFromObjectStore({}, 0);
}

// The object store records no owner, so the spare must learn the job's uid
// from the coordinator's PREFETCH order; a job it made root's would refuse
// the restarted trainer (PERMISSION_DENIED), whose exit makes one plan
// after another.
TEST(ClusterObjectStoreTest, NodeLostIsRecoveredForTrainersThatAreNotRoot) {
  if (std::string why = S3Server::Unavailable(); !why.empty())
    GTEST_SKIP() << why;
  if (geteuid() != 0)
    GTEST_SKIP() << "needs root to run the trainers as uid 1000";
  if (access("/usr/bin/setpriv", X_OK) != 0)
    GTEST_SKIP() << "needs setpriv (util-linux)";
  RecoverLostNodeFromObjectStore({"/usr/bin/setpriv", "--reuid", "1000",
                                  "--regid", "1000", "--clear-groups"},
                                 1000);
}

}  // namespace
}  // namespace ckpt::testing
