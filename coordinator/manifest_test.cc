// The global commit of a step against what happens meanwhile: a plan or a
// rollback made while MANIFEST.global is being written (the write held at a
// gate), and the audit of every committed step's manifest.
#include <algorithm>
#include <filesystem>
#include <thread>

#include "coordinator/coordinator_testing.h"

namespace ckpt::coordinator {
namespace {

class ManifestCommitTest : public TwoNodeTest {
 protected:
  void SetUp() override {
    wrap_shared_root_ = [this](std::unique_ptr<storage::Backend> b) {
      auto g = std::make_unique<OwningGate>(std::move(b));
      gate_ = g.get();
      return std::unique_ptr<storage::Backend>(std::move(g));
    };
    TwoNodeTest::SetUp();
  }
  void TearDown() override {
    if (gate_) gate_->Open();
    if (committer_.joinable()) committer_.join();
  }
  void Commit(uint64_t step) {
    ReportAll(step, v1::STAGED);
    ReportAll(step, v1::DURABLE);
    ASSERT_EQ(Job().last_good_step(), step);
  }
  // A deposed leader's late write of committed `step`'s manifest: the
  // same shards under another fence. Returns the committed fence.
  uint64_t WriteLateManifest(uint64_t step) {
    auto m = ReadManifest(step);
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return 0;
    const uint64_t fence = m->fence();
    m->set_fence(fence + 7);
    storage::LocalBackendOptions bo;
    bo.root = dir_.path() + "/shared";
    bo.remove_tmp_files = false;
    auto backend = storage::NewLocalBackend(bo);
    EXPECT_TRUE(backend.ok()) << backend.status();
    if (backend.ok()) {
      EXPECT_TRUE(storage::WriteGlobalManifest(**backend, *m).ok());
    }
    return fence;
  }
  // Every rank of `step` staged and durable; the last DURABLE report (rank
  // 3) runs on committer_, its manifest write held at the gate.
  void HoldCommitOf(uint64_t step) {
    ReportAll(step, v1::STAGED);
    for (uint32_t r = 0; r < 3; ++r) {
      auto s =
          Report(r < 2 ? "n1" : "n2", r < 2 ? e1_ : e2_, step, r, v1::DURABLE);
      ASSERT_TRUE(s.ok()) << s.status();
    }
    gate_->Close("MANIFEST.global");
    committer_ = std::thread(
        [this, step] { last_ = Report("n2", e2_, step, 3, v1::DURABLE); });
    while (gate_->waiting() == 0) std::this_thread::yield();
  }
  void Release() {
    gate_->Open();
    committer_.join();
  }
  static bool Has(const v1::JobRecord& j, uint64_t step) {
    return std::find(j.manifest_steps().begin(), j.manifest_steps().end(),
                     step) != j.manifest_steps().end();
  }

  OwningGate* gate_ = nullptr;
  std::thread committer_;
  absl::StatusOr<v1::ReportShardResponse> last_ =
      absl::UnknownError("not reported");
};

// A plan made while the manifest of step 10 is written restores step 10:
// the step stays in the new timeline, so the write is committed and the
// answer "durable everywhere" is true.
TEST_F(ManifestCommitTest, PlanDuringTheManifestWriteStillCommitsItsStep) {
  Commit(5);
  HoldCommitOf(10);
  auto exit = coord_->ReportTrainerExit(TrainerExit("n1", e1_, 0, 9));
  ASSERT_TRUE(exit.ok()) << exit.status();
  ASSERT_TRUE(exit->failure());
  ASSERT_EQ(Job().restore_step(), 10u);
  Release();
  ASSERT_TRUE(last_.ok()) << last_.status();
  EXPECT_TRUE(last_->durable_everywhere());
  v1::JobRecord j = Job();
  EXPECT_EQ(j.last_good_step(), 10u)
      << "answered durable everywhere, never committed";
  EXPECT_TRUE(Has(j, 10));
  auto m = ReadManifest(10);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(j.manifest_stamps().count(10));
  EXPECT_EQ(m->generation(), j.manifest_stamps().at(10).generation());
}

// A plan made while the manifest of step 10 is written is not vindicated
// by step 10's commit: the step completed before the plan, so the plan's
// trainers have shown nothing yet, and the count of plans without a
// commit (--max-failed-plans) keeps it. (A cluster test's job whose every
// restore failed was held one plan late: its first plan, for the kill,
// was "reset" by the commit of the step saved just before the kill.)
TEST_F(ManifestCommitTest, PlanDuringTheManifestWriteStaysCountedAfterIt) {
  Commit(5);
  ASSERT_EQ(Job().plans_since_commit(), 0u);
  HoldCommitOf(10);
  auto exit = coord_->ReportTrainerExit(TrainerExit("n1", e1_, 0, 9));
  ASSERT_TRUE(exit.ok()) << exit.status();
  ASSERT_TRUE(exit->failure());
  ASSERT_EQ(Job().plans_since_commit(), 1u);
  Release();
  ASSERT_TRUE(last_.ok()) << last_.status();
  EXPECT_EQ(Job().last_good_step(), 10u);
  EXPECT_EQ(Job().plans_since_commit(), 1u)
      << "the plan made after step 10 completed is still unproven";
  // A step the new generation completes proves it.
  Commit(11);
  EXPECT_EQ(Job().plans_since_commit(), 0u);
}

// A rollback made while the manifest of step 10 is written drops step 10:
// the answer is not "durable everywhere", and no MANIFEST.global of step
// 10 is left behind with no commit to back it.
TEST_F(ManifestCommitTest, RollbackDuringTheManifestWriteLeavesNoManifest) {
  Commit(5);
  HoldCommitOf(10);
  v1::RollbackRequest rb;
  rb.set_job("job");
  rb.set_step(5);
  auto rolled = coord_->Rollback(rb);
  ASSERT_TRUE(rolled.ok()) << rolled.status();
  Release();
  ASSERT_TRUE(last_.ok()) << last_.status();
  EXPECT_FALSE(last_->durable_everywhere())
      << "step 10 answered durable everywhere; it is not committed";
  v1::JobRecord j = Job();
  EXPECT_EQ(j.last_good_step(), 5u);
  EXPECT_FALSE(Has(j, 10));
  EXPECT_FALSE(std::filesystem::exists(ManifestPath(10)))
      << "an uncommitted MANIFEST.global of step 10 stays on the shared root";
}

// A deposed leader's late write of an older committed step (same shards,
// another fence) is found and written over, not only the last good one's.
TEST_F(ManifestCommitTest, AuditRepairsEveryCommittedStepsManifest) {
  for (uint64_t step : {5, 10, 15}) Commit(step);
  const uint64_t fence = WriteLateManifest(5);
  ASSERT_FALSE(HasFailure());
  // Each audit checks a few steps besides the last good one; every step
  // within as many audits as there are steps.
  for (int i = 0; i < 3 && ReadManifest(5)->fence() != fence; ++i)
    ASSERT_TRUE(coord_->AuditManifests().ok());
  auto back = ReadManifest(5);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->fence(), fence) << "step 5's late write was never repaired";
  bool named = false;
  for (const v1::Event& e : EventsOf(v1::MANIFEST_INVALID))
    named |= e.detail().find("step 5:") == 0;
  EXPECT_TRUE(named);
  EXPECT_TRUE(Has(Job(), 5));
}

// An audit does not decode again the bytes an earlier audit found to be
// the committed write; a late write landing after such an audit is other
// bytes, and is still found and written over.
TEST_F(ManifestCommitTest, AuditFindsALateWriteAfterAPassedAudit) {
  for (uint64_t step : {5, 10}) Commit(step);
  ASSERT_TRUE(coord_->AuditManifests().ok());  // both pass, remembered
  ASSERT_TRUE(coord_->AuditManifests().ok());  // the same bytes: pass
  EXPECT_TRUE(EventsOf(v1::MANIFEST_INVALID).empty());
  const uint64_t fence = WriteLateManifest(10);
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(coord_->AuditManifests().ok());
  auto back = ReadManifest(10);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->fence(), fence)
      << "the late write of step 10 after a passed audit was not repaired";
  bool named = false;
  for (const v1::Event& e : EventsOf(v1::MANIFEST_INVALID))
    named |= e.detail().find("step 10:") == 0;
  EXPECT_TRUE(named);
}

}  // namespace
}  // namespace ckpt::coordinator
