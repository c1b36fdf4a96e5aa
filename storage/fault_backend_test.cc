#include "storage/fault_backend.h"

#include <cerrno>
#include <string>

#include "gtest/gtest.h"
#include "tests/temp_dir.h"

namespace ckpt::storage {
namespace {

class FaultBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    LocalBackendOptions o;
    o.root = dir_.path();
    auto b = NewLocalBackend(o);
    ASSERT_TRUE(b.ok()) << b.status();
    base_ = std::move(*b);
    fault_ = std::make_unique<FaultInjectionBackend>(base_.get());
  }
  absl::Status Put(Backend& b, const std::string& key,
                   const std::string& data) {
    auto w = b.NewObjectWriter(key, data.size());
    if (!w.ok()) return w.status();
    absl::Status s = (*w)->WriteAt(0, data.data(), data.size());
    if (!s.ok()) return s;
    return (*w)->Commit();
  }
  ckpt::testing::TempDir dir_;
  std::unique_ptr<Backend> base_;
  std::unique_ptr<FaultInjectionBackend> fault_;
};

TEST_F(FaultBackendTest, NameWrapsTheBase) {
  EXPECT_EQ(fault_->name(), "fault(io_uring)");
}

TEST_F(FaultBackendTest, FailedNthWriteSurfacesAndItsObjectNeverCommits) {
  fault_->FailNthWrite(2, EIO);
  auto w = fault_->NewObjectWriter("a", 8);
  ASSERT_TRUE((*w)->WriteAt(0, "1234", 4).ok());
  absl::Status s = (*w)->WriteAt(4, "5678", 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(std::string(s.message()).find("a: injected write failure"),
            std::string::npos);
  EXPECT_FALSE((*w)->Commit().ok());
  EXPECT_TRUE(fault_->List("")->empty());
  EXPECT_TRUE(Put(*fault_, "b", "later").ok());  // only the Nth one fails
}

TEST_F(FaultBackendTest, FailedCommitLeavesNothingVisible) {
  fault_->FailNthCommit(1, EIO);
  EXPECT_FALSE(Put(*fault_, "a", "data").ok());
  EXPECT_EQ(fault_->ObjectSize("a").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(Put(*fault_, "a", "data").ok());
  EXPECT_EQ(*fault_->ObjectSize("a"), 4u);
}

TEST_F(FaultBackendTest, SpaceLimitIsResourceExhausted) {
  fault_->SetSpaceLimit(10);
  EXPECT_TRUE(Put(*fault_, "a", "123456").ok());
  absl::Status s = Put(*fault_, "b", "123456");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(fault_->PutSmallObject("c", "12345").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(*fault_->List(""), std::vector<std::string>{"a"});
  fault_->ClearFaults();
  EXPECT_TRUE(Put(*fault_, "b", "123456").ok());
}

TEST_F(FaultBackendTest, CrashKeepsExactlyTheCommittedObjects) {
  ASSERT_TRUE(Put(*fault_, "job/step-1/rank-0", "committed").ok());
  ASSERT_TRUE(fault_->PutSmallObject("job/step-1/MANIFEST", "m").ok());
  auto pending = fault_->NewObjectWriter("job/step-2/rank-0", 7);
  ASSERT_TRUE((*pending)->WriteAt(0, "pending", 7).ok());

  fault_->SimulateCrash();
  EXPECT_EQ(fault_->List("").status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(fault_->NewObjectWriter("x", 1).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(fault_->PutSmallObject("x", "1").code(),
            absl::StatusCode::kUnavailable);
  EXPECT_FALSE((*pending)->Commit().ok());

  fault_->Restart();
  const std::vector<std::string> committed = {"job/step-1/MANIFEST",
                                              "job/step-1/rank-0"};
  EXPECT_EQ(*fault_->List(""), committed);
  EXPECT_FALSE((*pending)->WriteAt(0, "again", 5).ok());  // lost in the crash
  pending->reset();

  // A fresh backend on the same root sees the same, and no temp file.
  LocalBackendOptions o;
  o.root = dir_.path();
  auto reopened = NewLocalBackend(o);
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ(*(*reopened)->List(""), committed);
  char buf[9];
  ASSERT_TRUE((*reopened)->ReadAt("job/step-1/rank-0", 0, buf, 9).ok());
  EXPECT_EQ(std::string(buf, 9), "committed");
}

TEST_F(FaultBackendTest, ForwardsReadsAndDeletes) {
  ASSERT_TRUE(Put(*fault_, "p/a", "xy").ok());
  char c[2];
  ASSERT_TRUE(fault_->ReadAt("p/a", 0, c, 2).ok());
  EXPECT_EQ(c[1], 'y');
  ASSERT_TRUE(fault_->DeletePrefix("p/").ok());
  EXPECT_TRUE(fault_->List("")->empty());
  EXPECT_EQ(fault_->stats().objects_committed, 1u);
}

}  // namespace
}  // namespace ckpt::storage
