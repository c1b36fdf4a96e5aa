// The step's layout index at the coordinator: each rank's pieces in its
// DURABLE report (checked on receipt), merged at commit into
// MANIFEST.global, and answered to nodes (StepIndex), also after a restart.
#include <string>
#include <vector>

#include "ckpt.pb.h"
#include "coordinator/coordinator_testing.h"
#include "storage/layout.h"
#include "storage/layout_format.h"
#include "storage/layout_merge.h"
#include "storage/layout_testing.h"

namespace ckpt::coordinator {
namespace {

class StepIndexTest : public TwoNodeTest {
 protected:
  // 4 ranks: "w" [8, 3] row-sharded 2 rows each, "b" [3] whole on each.
  static std::vector<std::vector<::ckpt::v1::TensorMeta>> Metas() {
    std::vector<std::vector<::ckpt::v1::TensorMeta>> m(4);
    for (uint64_t r = 0; r < 4; ++r)
      m[r] = {
          storage::testing::Float32Piece("w", {2, 3}, {8, 3}, {2 * r, 0}, 4096),
          storage::testing::Float32Piece("b", {3}, {}, {}, 4096)};
    return m;
  }
  static std::string Blob(uint32_t rank) {
    absl::StatusOr<std::string> b =
        storage::RankLayoutIndex(4, rank, Metas()[rank]);
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? *b : std::string();
  }
  // One rank's DURABLE report in a ReportShards batch; its result.
  v1::ReportResult Durable(uint64_t step, uint32_t rank,
                           std::optional<std::string> index) {
    v1::ReportShardsRequest req;
    req.set_node_id(rank < 2 ? "n1" : "n2");
    req.set_epoch(rank < 2 ? e1_ : e2_);
    v1::ShardReport* r = req.add_reports();
    r->set_job("job");
    r->set_step(step);
    r->set_rank(rank);
    r->set_state(v1::DURABLE);
    r->set_bytes(1000 + rank);
    r->set_checksum_digest(0xabc0 + rank);
    r->set_key("job/step-" + std::to_string(step) + "/rank-" +
               std::to_string(rank));
    if (index) r->set_layout_index(*index);
    auto resp = coord_->ReportShards(req);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? resp->results(0) : v1::ReportResult();
  }
  absl::StatusOr<v1::StepIndexResponse> StepIndex(uint64_t step,
                                                  uint64_t known = 0) {
    v1::StepIndexRequest req;
    req.set_node_id("n1");
    req.set_epoch(e1_);
    req.set_job("job");
    req.set_step(step);
    req.set_known_content_digest(known);
    return coord_->StepIndex(req);
  }
  // What ckptd merges from the two nodes' manifests (each node's index
  // holds its own ranks' pieces, as its persister builds it).
  static std::string NodeManifestsMerged() {
    const auto all = Metas();
    storage::LayoutIndexBuilder b(4);
    for (uint32_t node = 0; node < 2; ++node) {
      std::vector<std::vector<::ckpt::v1::TensorMeta>> own(4);
      own[2 * node] = all[2 * node];
      own[2 * node + 1] = all[2 * node + 1];
      absl::StatusOr<storage::LayoutIndex> manifest =
          storage::BuildLayoutIndex(4, own);
      EXPECT_TRUE(manifest.ok()) << manifest.status();
      for (uint32_t r = 2 * node; r < 2 * node + 2; ++r)
        EXPECT_TRUE(storage::AddIndexPieces(b, *manifest, r, "node").ok());
    }
    absl::StatusOr<storage::LayoutIndex> merged = std::move(b).Finish();
    EXPECT_TRUE(merged.ok()) << merged.status();
    return merged.ok() ? storage::SerializeLayoutIndex(*merged) : "";
  }
};

TEST_F(StepIndexTest, CommitMergesTheRanksPiecesIntoTheGlobalManifest) {
  ReportAll(5, v1::STAGED);
  for (uint32_t r = 0; r < 4; ++r)
    ASSERT_EQ(Durable(5, r, Blob(r)).code(), 0) << r;
  ASSERT_EQ(Job().last_good_step(), 5u);
  auto m = ReadManifest(5);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(m->has_layout_index());
  const std::string expected = NodeManifestsMerged();
  ASSERT_FALSE(expected.empty());
  EXPECT_EQ(m->layout_index(), expected)
      << "the global index is not the merge of the node manifests";
  auto answer = StepIndex(5);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->index(), expected);
  EXPECT_EQ(answer->world_size(), 4u);
  EXPECT_FALSE(answer->unchanged());
  // A node holding this write's index is answered without it.
  ASSERT_NE(answer->content_digest(), 0u);
  auto again = StepIndex(5, answer->content_digest());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->unchanged());
  EXPECT_TRUE(again->index().empty());
  again = StepIndex(5, answer->content_digest() + 1);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->unchanged());
  EXPECT_EQ(again->index(), expected);
  // A step not committed has none to answer.
  ReportAll(6, v1::STAGED);
  auto none = StepIndex(6);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  // Soft state is lost with a restart; the index is MANIFEST.global's.
  Reopen();
  answer = StepIndex(5);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->index(), expected);
}

TEST_F(StepIndexTest, ABadRankIndexRefusesItsReportNamingTheField) {
  ReportAll(5, v1::STAGED);
  for (uint32_t r = 0; r < 3; ++r) ASSERT_EQ(Durable(5, r, Blob(r)).code(), 0);
  std::string flipped = Blob(3);
  flipped[12] ^= 0x40;
  storage::LayoutIndexBuilder five(5);
  ASSERT_TRUE(storage::AddShardPieces(five, 3, Metas()[3], "m").ok());
  const std::string world5 =
      storage::SerializeLayoutIndex(*std::move(five).Finish());
  const std::vector<std::pair<std::string, std::string>> bad = {
      {flipped, "layout_index: layout index: checksum"},
      {Blob(2),
       "layout_index: tensor \"b\": a piece of rank 2, in the index "
       "of rank 3"},
      {std::string(storage::kMaxRankLayoutIndexBytes + 1, 'x'),
       "layout_index: 16777217 bytes, more than 16777216"},
  };
  for (const auto& [blob, says] : bad) {
    v1::ReportResult res = Durable(5, 3, blob);
    EXPECT_EQ(res.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_EQ(res.message().rfind(says, 0), 0u) << res.message();
    // Refused: the rank is not durable, the step not committed.
    EXPECT_FALSE(Job().has_last_good());
  }
  // On a report that is not DURABLE.
  v1::ReportShardsRequest staged;
  staged.set_node_id("n2");
  staged.set_epoch(e2_);
  v1::ShardReport* r = staged.add_reports();
  r->set_job("job");
  r->set_step(5);
  r->set_rank(3);
  r->set_state(v1::STAGED);
  r->set_bytes(1003);
  r->set_checksum_digest(0xabc3);
  r->set_layout_index(Blob(3));
  auto resp = coord_->ReportShards(staged);
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->results(0).message(),
            "layout_index: set on a report that is not DURABLE");
  // A well-formed index of another world size than the job's (a save of
  // a timeline that resized since) is not kept, and neither is the index
  // an older agent never sends: the step commits without one.
  for (uint64_t step : {5, 6}) {
    if (step == 6) {
      ReportAll(6, v1::STAGED);
      for (uint32_t r = 0; r < 3; ++r)
        ASSERT_EQ(Durable(6, r, Blob(r)).code(), 0);
    }
    v1::ReportResult res = Durable(
        step, 3, step == 5 ? std::optional<std::string>(world5) : std::nullopt);
    ASSERT_EQ(res.code(), 0) << res.message();
    ASSERT_EQ(Job().last_good_step(), step);
    auto m = ReadManifest(step);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_FALSE(m->has_layout_index()) << step;
    auto none = StepIndex(step);
    ASSERT_FALSE(none.ok());
    EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
    EXPECT_NE(none.status().message().find("without a layout index"),
              std::string::npos)
        << none.status();
  }
}

}  // namespace
}  // namespace ckpt::coordinator
