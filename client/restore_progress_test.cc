#include "client/restore_progress.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ckpt::client {
namespace {

v1::OpenRestoreResponse Slot(int tensors) {
  v1::OpenRestoreResponse r;
  r.set_shm_name("/ckpt.job.r0");
  r.set_arena_bytes(8 << 20);
  r.set_slot_offset(2 << 20);
  r.set_image_bytes(4 << 20);
  for (int i = 0; i < tensors; ++i) {
    v1::TensorMeta* m = r.add_tensors();
    m->set_name("t" + std::to_string(i));
    m->set_offset(4096 * (i + 1));
    m->set_bytes(4096);
    m->set_checksum(100 + i);
  }
  return r;
}

v1::RestoreProgress Opened(int tensors) {
  v1::RestoreProgress m;
  *m.mutable_opened() = Slot(tensors);
  return m;
}

v1::RestoreProgress Verified(std::vector<uint32_t> v) {
  v1::RestoreProgress m;
  for (uint32_t t : v) m.add_verified(t);
  return m;
}

v1::RestoreProgress Done(v1::OpenRestoreResponse r) {
  r.set_lease(7);
  v1::RestoreProgress m;
  *m.mutable_done() = std::move(r);
  return m;
}

void ExpectRefused(const absl::Status& s, const std::string& text) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(std::string(s.message()).find(text), std::string::npos) << s;
}

TEST(RestoreProgressTest, AWellFormedStreamReportsEachTensorOnce) {
  RestoreProgressCheck c;
  std::vector<uint32_t> fresh;
  v1::RestoreProgress first = Opened(4);
  first.add_verified(2);
  ASSERT_TRUE(c.Next(first, &fresh).ok());
  EXPECT_EQ(fresh, std::vector<uint32_t>({2}));
  ASSERT_TRUE(c.Next(Verified({0, 3}), &fresh).ok());
  EXPECT_EQ(fresh, std::vector<uint32_t>({0, 3}));
  ASSERT_TRUE(c.Next(Done(Slot(4)), &fresh).ok());
  EXPECT_TRUE(fresh.empty());
  EXPECT_TRUE(c.has_done());
  EXPECT_EQ(c.done().lease(), 7u);
}

TEST(RestoreProgressTest, ARestoreWithoutALoadIsOneDoneMessage) {
  RestoreProgressCheck c;
  std::vector<uint32_t> fresh;
  ASSERT_TRUE(c.Next(Done(Slot(2)), &fresh).ok());
  EXPECT_FALSE(c.has_opened());
  EXPECT_TRUE(c.has_done());
}

// Each malformed message is refused naming the field, copies nothing, and
// every message after it is refused too.
TEST(RestoreProgressTest, MalformedMessagesAreRefusedNamingTheField) {
  struct Case {
    std::vector<v1::RestoreProgress> before;
    v1::RestoreProgress bad;
    std::string text;
  };
  v1::OpenRestoreResponse moved = Slot(4);
  moved.set_slot_offset(0);
  v1::OpenRestoreResponse other = Slot(4);
  other.mutable_tensors(1)->set_offset(1 << 30);
  v1::RestoreProgress opened_and_done = Done(Slot(4));
  *opened_and_done.mutable_opened() = Slot(4);
  const std::vector<Case> cases = {
      {{}, Verified({0}), "verified: before opened"},
      {{Opened(4)}, Verified({4}), "verified[0]: 4 is not a tensor index (4"},
      {{Opened(4)},
       Verified({1, 4294967295u}),
       "verified[1]: 4294967295 is not a tensor index"},
      {{Opened(4), Verified({1})},
       Verified({2, 1}),
       "verified[1]: tensor 1 reported twice"},
      {{Opened(4)}, Opened(4), "opened: sent twice"},
      {{Opened(4)}, v1::RestoreProgress(), "an empty message"},
      {{Opened(4)}, Done(moved), "is not the opened one"},
      {{Opened(4)}, Done(Slot(3)), "done.tensors: 3 tensors, opened had 4"},
      {{Opened(4)}, Done(other), "done.tensors[1]: not the tensor"},
      {{Opened(4)}, opened_and_done, "done: comes with opened or verified"},
      {{Opened(4), Done(Slot(4))}, Verified({0}), "after the last one"},
  };
  for (size_t n = 0; n < cases.size(); ++n) {
    SCOPED_TRACE(n);
    RestoreProgressCheck c;
    std::vector<uint32_t> fresh;
    for (const v1::RestoreProgress& m : cases[n].before)
      ASSERT_TRUE(c.Next(m, &fresh).ok());
    ExpectRefused(c.Next(cases[n].bad, &fresh), cases[n].text);
    EXPECT_TRUE(fresh.empty());
    ExpectRefused(c.Next(Verified({0}), &fresh), cases[n].text);
    EXPECT_TRUE(fresh.empty());
  }
}

}  // namespace
}  // namespace ckpt::client
