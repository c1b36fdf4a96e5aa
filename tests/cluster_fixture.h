// ClusterTest: the fixture of the multi-node recovery tests (a Cluster of
// real processes, cluster_harness.h) and the checks every scenario ends
// with. Not thread-safe.
#ifndef CKPT_TESTS_CLUSTER_FIXTURE_H_
#define CKPT_TESTS_CLUSTER_FIXTURE_H_

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/cluster_harness.h"
#include "tests/temp_dir.h"
#include "tests/test_util.h"

namespace ckpt::testing {

// Every "done rank=R step N params_digest=D" line that ckpt-worker
// processes wrote to `log`, as R -> D: the weights each rank ended with.
// (Parsed by hand: GCC 12's std::regex trips -Wmaybe-uninitialized in the
// sanitizer build.)
inline std::map<uint32_t, std::string> WorkerDoneDigests(
    const std::string& log) {
  std::map<uint32_t, std::string> out;
  for (size_t at = log.find("done rank="); at != std::string::npos;
       at = log.find("done rank=", at + 1)) {
    unsigned rank = 0;
    unsigned long step = 0;
    char digest[17] = {};
    if (std::sscanf(log.c_str() + at,
                    "done rank=%u step %lu params_digest=%16[0-9a-f]", &rank,
                    &step, digest) == 3 &&
        std::strlen(digest) == 16)
      out[rank] = digest;
  }
  return out;
}

// ckpt-worker's small model of the multi-node tests (vocab 64, width 32,
// 16 x 8 tokens a step, seed 5): `steps` steps, a save every `every`, a
// log line every 10, then `extra`.
inline std::vector<std::string> SmallWorkerFlags(
    int steps, int every, std::vector<std::string> extra = {}) {
  std::vector<std::string> f = {"--steps",      std::to_string(steps),
                                "--ckpt-every", std::to_string(every),
                                "--vocab",      "64",
                                "--dim",        "32",
                                "--seq",        "16",
                                "--batch",      "8",
                                "--seed",       "5",
                                "--lr",         "0.01",
                                "--log-every",  "10"};
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

class ClusterTest : public ::testing::Test {
 protected:
  ClusterOptions Options(uint32_t world_size) {
    ClusterOptions o;
    o.dir = dir_.path();
    o.world_size = world_size;
    return o;
  }
  void TearDown() override {
    if ((HasFailure() || std::getenv("CKPT_TEST_LOGS")) && cluster_)
      std::fprintf(stderr, "%s", cluster_->DumpLogs().c_str());
  }

  uint64_t LastSaved(uint32_t rank) const {
    uint64_t step = 0;
    for (const auto& l : cluster_->TrainerLog(rank))
      if (l.kind == "saved") step = std::stoull(l.fields.at("step"));
    return step;
  }
  uint64_t LastGood() const {
    auto job = cluster_->Job();
    return job && job->has_last_good() ? job->last_good_step() : 0;
  }
  void WaitForProgress(uint64_t last_good) {
    ASSERT_TRUE(Cluster::WaitUntil([&] { return LastGood() >= last_good; },
                                   std::chrono::seconds(60)))
        << "last good step never reached " << last_good;
  }
  void ExpectLaunchersSucceed(const std::vector<std::string>& nodes) {
    for (const auto& id : nodes) {
      auto st = cluster_->WaitLauncher(id, std::chrono::seconds(120));
      ASSERT_TRUE(st.has_value())
          << "ckptrun of node " << id << " still running";
      EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0)
          << "ckptrun of node " << id << " wait status " << *st;
    }
  }
  // Every rank restored exactly once after the failure, all at one step,
  // never saw a wrong byte, and finished. Returns that step.
  uint64_t ExpectAllResumedAtOneStep() {
    std::set<uint64_t> steps;
    for (uint32_t r = 0; r < cluster_->options().world_size; ++r) {
      auto log = cluster_->TrainerLog(r);
      std::optional<uint64_t> restored;
      bool done = false;
      for (const auto& l : log) {
        EXPECT_NE(l.kind, "mismatch") << "rank " << r;
        EXPECT_NE(l.kind, "restore_failed") << "rank " << r;
        if (l.kind == "restored") restored = std::stoull(l.fields.at("step"));
        if (l.kind == "done") done = true;
      }
      EXPECT_TRUE(restored.has_value()) << "rank " << r << " never restored";
      EXPECT_TRUE(done) << "rank " << r << " did not finish";
      if (restored) steps.insert(*restored);
    }
    EXPECT_EQ(steps.size(), 1u) << "ranks resumed at different steps";
    return steps.empty() ? 0 : *steps.begin();
  }
  std::string DaemonLog(const std::string& id) const {
    std::ifstream in(dir_.path() + "/node-" + id + "/ckptd.log");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  // The weights `world` ranks of `argv` (ckpt-worker and its flags) end
  // with undisturbed: no daemon, no launcher, no fault. Every rank must
  // end with the same digest; "" (and a failure) otherwise.
  std::string WorkerReference(const std::vector<std::string>& argv,
                              uint32_t world) {
    const int port = FreeLoopbackPorts(1)[0];
    const std::string log = dir_.path() + "/reference.log";
    std::vector<std::unique_ptr<Proc>> ranks;
    for (uint32_t r = 0; r < world; ++r)
      ranks.push_back(Proc::Spawn(
          argv, log,
          {"RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(world),
           "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port)}));
    for (auto& p : ranks) {
      std::optional<int> st = p->Wait(std::chrono::seconds(120));
      EXPECT_TRUE(st && WIFEXITED(*st) && WEXITSTATUS(*st) == 0)
          << ReadFileToString(log);
    }
    std::map<uint32_t, std::string> d =
        WorkerDoneDigests(ReadFileToString(log));
    std::set<std::string> distinct;
    for (const auto& [rank, digest] : d) distinct.insert(digest);
    EXPECT_EQ(d.size(), world) << ReadFileToString(log);
    EXPECT_EQ(distinct.size(), 1u) << ReadFileToString(log);
    return distinct.size() == 1 ? *distinct.begin() : "";
  }

  TempDir dir_;
  std::unique_ptr<Cluster> cluster_;
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_CLUSTER_FIXTURE_H_
