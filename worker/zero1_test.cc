// ZeRO-1 ckpt-worker (--zero1) with real processes against one real ckptd:
// the ranks end bit for bit as plain data parallel (the same allreduced
// gradients, elementwise AdamW), each rank saves only its slice as pieces
// with layouts, and a job that loses a rank to SIGKILL and goes on at
// another world size from the latest common step (every rank resharding
// its new slice from the saved pieces) ends bit for bit as a reference
// that made the same change at the same step without a failure.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/daemon_test.h"
#include "util/checksum.h"
#include "worker/mlp_model.h"
#include "worker/worker_process.h"

namespace ckpt::worker {
namespace {

using testing::FreePort;
using testing::WorkerProcess;
using testing::WorkerRun;

// The small model of WorkerProcess (vocab 64, dim 32, 2 layers).
MlpConfig SmallModel() {
  MlpConfig c;
  c.vocab = 64;
  c.dim = 32;
  return c;
}

class Zero1Test : public ckpt::testing::DaemonTest {
 protected:
  // `world` ranks of one job (job "": no daemon), each with `env` added;
  // kill: SIGKILL rank kill->first once it prints a line starting with
  // kill->second. Rank 0 starts last: the others wait for its store.
  std::vector<WorkerRun> RunRanks(
      int world, const std::vector<std::string>& flags, const std::string& job,
      const std::map<std::string, std::string>& env = {},
      std::optional<std::pair<int, std::string>> kill = std::nullopt) {
    const int port = FreePort();
    std::vector<std::unique_ptr<WorkerProcess>> procs(world);
    for (int r = world - 1; r >= 0; --r) {
      std::map<std::string, std::string> e = env;
      e["RANK"] = std::to_string(r);
      e["LOCAL_RANK"] = std::to_string(r);
      e["WORLD_SIZE"] = std::to_string(world);
      e["MASTER_ADDR"] = "127.0.0.1";
      e["MASTER_PORT"] = std::to_string(port);
      if (!job.empty()) {
        e["CKPT_SOCKET"] = daemon_->socket();
        e["CKPT_JOB"] = job;
      }
      std::optional<std::string> kill_line;
      if (kill && kill->first == r) kill_line = kill->second;
      procs[r] = WorkerProcess::Start(flags, e, kill_line);
    }
    std::vector<WorkerRun> out;
    for (auto& p : procs) out.push_back(p->Wait());
    return out;
  }

  // Every rank exited 0 with one digest; returns it ("" otherwise).
  static std::string CommonDigest(const std::vector<WorkerRun>& runs) {
    std::string digest;
    for (size_t r = 0; r < runs.size(); ++r) {
      EXPECT_TRUE(runs[r].exited_ok()) << "rank " << r << ":\n"
                                       << runs[r].output;
      EXPECT_EQ(runs[r].Digest().size(), 16u) << runs[r].output;
      if (r == 0) digest = runs[r].Digest();
      EXPECT_EQ(runs[r].Digest(), digest) << "rank " << r;
    }
    return digest;
  }
};

TEST_F(Zero1Test, EndsBitForBitAsPlainDataParallelSavingOnlyItsSlice) {
  const std::vector<std::string> flags = {"--steps", "20"};
  const std::string plain = CommonDigest(RunRanks(2, flags, ""));
  std::vector<WorkerRun> z =
      RunRanks(2, {"--steps", "20", "--zero1", "", "--ckpt-every", "10"}, "z1");
  std::vector<WorkerRun> p = RunRanks(2, flags, "");
  ASSERT_EQ(CommonDigest(z), plain);
  for (int s = 1; s <= 20; ++s) {
    ASSERT_TRUE(z[0].LossAt(s).has_value()) << z[0].output;
    EXPECT_EQ(*z[0].LossAt(s), *p[0].LossAt(s)) << "step " << s;
  }
  const std::vector<ParamShape> shapes = MlpParamShapes(SmallModel());
  size_t total = 0;
  for (const ParamShape& s : shapes) total += s.numel;
  EXPECT_NE(
      z[1].output.find(absl::StrCat("zero1 rank 1 of 2 owns elements [",
                                    total / 2, ", ", total, ") of ", total)),
      std::string::npos)
      << z[1].output;

  // Rank 0 saved the first tensor as a piece with its place in the whole.
  {
    auto c = Connect("z1", 0, 2);
    ASSERT_NE(c, nullptr);
    const int64_t n =
        static_cast<int64_t>(std::min(shapes[0].numel, total / 2));
    std::vector<float> piece(n);
    std::vector<Tensor> t = {{"param/0",
                              DType::kFloat32,
                              {n},
                              piece.data(),
                              ckpt::Device::Host(),
                              std::nullopt}};
    std::vector<std::optional<TensorLayout>> layouts;
    absl::Status s = c->Restore(20, t, &layouts);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(layouts.size(), 1u);
    ASSERT_TRUE(layouts[0].has_value());
    EXPECT_EQ(layouts[0]->global_shape,
              (std::vector<int64_t>{static_cast<int64_t>(shapes[0].numel)}));
    EXPECT_EQ(layouts[0]->offsets, (std::vector<int64_t>{0}));
  }
  // One process asks for every master tensor whole: resharded from both
  // ranks' pieces, they hash to the digest the ranks printed.
  auto c = Connect("z1", 0, 1);
  ASSERT_NE(c, nullptr);
  std::vector<float> all(total);
  std::vector<Tensor> whole;
  size_t at = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    whole.push_back({absl::StrCat("param/", i),
                     DType::kFloat32,
                     {static_cast<int64_t>(shapes[i].numel)},
                     all.data() + at,
                     ckpt::Device::Host(),
                     std::nullopt});
    at += shapes[i].numel;
  }
  absl::Status s = c->Restore(20, whole);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(absl::StrFormat("%016x", Hash64(all.data(), total * sizeof(float))),
            plain);
}

// 4 ranks lose rank 3 to SIGKILL; the job goes on at 3 ranks from the
// latest step every rank holds, each rank resharding its new, larger
// slice (uneven: the flattened state does not split in three at tensor
// boundaries) from the 4 saved ranks' pieces. The reference is the same
// code without a failure: 4 ranks train to that step and save it, then
// 3 ranks restore it (a generation each, as a launcher's plans). Plain
// data parallel making the same change ends the same too, and so do all
// three when they grow back to 4 ranks at step 40.
TEST_F(Zero1Test, ShrinkAfterAKillEndsAsTheReferenceThatShrankAtThatStep) {
  const std::vector<std::string> base = {
      "--batch", "12", "--ckpt-every", "5", "--collective-timeout-s", "20"};
  auto flags = [&](int steps, bool zero1) {
    std::vector<std::string> f = base;
    f.insert(f.end(), {"--steps", std::to_string(steps)});
    if (zero1) f.insert(f.end(), {"--zero1", ""});
    return f;
  };
  std::vector<WorkerRun> killed =
      RunRanks(4, flags(40, true), "zk", {{"CKPT_GENERATION", "0"}},
               std::make_pair(3, std::string("step 22 loss")));
  ASSERT_TRUE(killed[3].killed()) << killed[3].output;
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(killed[r].exit_code(), 1) << killed[r].output;
  auto c = Connect("zk", 0, 4);
  ASSERT_NE(c, nullptr);
  absl::StatusOr<int64_t> latest = c->LatestStep();
  ASSERT_TRUE(latest.ok()) << latest.status();
  ASSERT_GE(*latest, 15);
  const std::string step = std::to_string(*latest);
  const std::map<std::string, std::string> shrink = {
      {"CKPT_GENERATION", "1"},
      {"CKPT_RESTORE_STEP", step},
      {"CKPT_RESTORE_WORLD_SIZE", "4"}};
  std::vector<WorkerRun> resumed = RunRanks(3, flags(40, true), "zk", shrink);
  const std::string got = CommonDigest(resumed);
  EXPECT_NE(resumed[2].output.find("restored step " + step), std::string::npos)
      << resumed[2].output;

  // The reference: no failure, the same change at the same step.
  CommonDigest(RunRanks(4, flags(static_cast<int>(*latest), true), "zref",
                        {{"CKPT_GENERATION", "0"}}));
  EXPECT_EQ(CommonDigest(RunRanks(3, flags(40, true), "zref", shrink)), got);

  // Plain data parallel, 3 ranks restoring saved rank 0's whole state.
  CommonDigest(RunRanks(4, flags(static_cast<int>(*latest), false), "pref",
                        {{"CKPT_GENERATION", "0"}}));
  std::map<std::string, std::string> plain = shrink;
  plain["CKPT_RESTORE_RANK"] = "0";
  EXPECT_EQ(CommonDigest(RunRanks(3, flags(40, false), "pref", plain)), got);

  // Back to 4 ranks at step 40 (each new slice smaller, spanning saved
  // ranks' boundaries the other way): the same in all three.
  const std::map<std::string, std::string> grow = {
      {"CKPT_GENERATION", "2"},
      {"CKPT_RESTORE_STEP", "40"},
      {"CKPT_RESTORE_WORLD_SIZE", "3"}};
  const std::string grown =
      CommonDigest(RunRanks(4, flags(50, true), "zk", grow));
  EXPECT_NE(grown, got);
  EXPECT_EQ(CommonDigest(RunRanks(4, flags(50, true), "zref", grow)), grown);
  plain = grow;
  plain["CKPT_RESTORE_RANK"] = "2";
  EXPECT_EQ(CommonDigest(RunRanks(4, flags(50, false), "pref", plain)), grown);
}

// A job turns --zero1 on and off at its resumes, changing its world size
// too: plain 2 ranks to step 10, ZeRO-1 4 ranks (each reading the whole
// tensors its slice touches, from saved rank 0) to 20, plain 2 ranks
// (each reading every tensor whole from the ZeRO-1 pieces) to 30. It
// ends as the same stretches run plain throughout.
TEST_F(Zero1Test, AJobSwitchesModeAndWorldSizeAtAResume) {
  auto stretch = [&](const std::string& job, int world, int steps, bool zero1,
                     int gen, int from_world) {
    std::vector<std::string> f = {"--steps", std::to_string(steps),
                                  "--ckpt-every", "10"};
    if (zero1) f.insert(f.end(), {"--zero1", ""});
    std::map<std::string, std::string> env = {
        {"CKPT_GENERATION", std::to_string(gen)}};
    if (gen > 0) {
      env["CKPT_RESTORE_STEP"] = std::to_string(steps - 10);
      env["CKPT_RESTORE_WORLD_SIZE"] = std::to_string(from_world);
      env["CKPT_RESTORE_RANK"] = "0";
    }
    std::vector<WorkerRun> r = RunRanks(world, f, job, env);
    if (gen > 0) {
      EXPECT_NE(r[0].output.find("restored step " + std::to_string(steps - 10)),
                std::string::npos)
          << r[0].output;
    }
    return CommonDigest(r);
  };
  stretch("mode", 2, 10, false, 0, 0);
  const std::string z = stretch("mode", 4, 20, true, 1, 2);
  const std::string got = stretch("mode", 2, 30, false, 2, 4);
  stretch("mref", 2, 10, false, 0, 0);
  EXPECT_EQ(stretch("mref", 4, 20, false, 1, 2), z);
  EXPECT_EQ(stretch("mref", 2, 30, false, 2, 4), got);
  EXPECT_FALSE(got.empty());
}

}  // namespace
}  // namespace ckpt::worker
