// The sending and fetching sides of peer replicas (doc/replicas.md),
// in-process engines over real storage and a real replica listener: the
// replicate stage sends each rank's newest staged shard, a stopped holder
// never holds up a save, a PREFETCH from a replica restores the exact
// bytes, a failed peer fetch falls back to the shared root, and a restore
// waits for a fetch in flight instead of failing.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <thread>

#include "daemon/agent/peer_fetch.h"
#include "storage/keys.h"
#include "storage/manifest.h"
#include "tests/engine_save.h"
#include "tests/replica_fixture.h"
#include "tests/test_util.h"
#include "util/thread_priority.h"

namespace ckpt::testing {
namespace {

using ReplicaFetchTest = ReplicaFixture;

const daemon::PeerCreds kMe{getpid(), getuid(), getgid()};

// The bytes of a node's shard in memory (what it would replicate).
std::vector<char> SlotBytes(daemon::Engine& e, const std::string& job,
                            uint64_t step, uint32_t rank) {
  auto snap = e.SnapshotStaged(job, step, rank);
  EXPECT_TRUE(snap.ok()) << snap.status();
  if (!snap.ok()) return {};
  return {snap->data(), snap->data() + snap->copy.image_bytes()};
}

// Step 4 of job "core" (rank 0 of 1) saved on `e` and durable on its
// storage root: the bytes it holds.
std::vector<char> SaveDurableStep4(daemon::Engine& e,
                                   std::unique_ptr<shm::Arena>* arena) {
  EXPECT_TRUE(SaveOneTensorStep(&e, kMe, {"core", 4, true}, arena).ok());
  EXPECT_TRUE(e.WaitIdle(std::chrono::seconds(20)));
  return SlotBytes(e, "core", 4, 0);
}

// A PREFETCH order's source: the replica held by node "b" at `port`.
coord::v1::ShardSource ReplicaOnB(int port) {
  coord::v1::ShardSource src;
  src.set_node_id("b");
  src.set_host("127.0.0.1");
  src.set_port(port);
  src.set_replica(true);
  return src;
}

TEST_F(ReplicaFetchTest, ReplicateStageSendsEachRanksNewestStagedShard) {
  StartHolder(1ull << 30);
  Node& a = OpenNode("a", dir_.path() + "/shared");
  StartReplicator(a, "a", Holder());
  std::unique_ptr<shm::Arena> arena;
  for (uint64_t step = 1; step <= 3; ++step)
    ASSERT_TRUE(
        SaveOneTensorStep(a.engine.get(), kMe, {"core", step, true}, &arena)
            .ok());
  ASSERT_TRUE(
      Eventually([&] { return store_->Find("core", 3, 0) != nullptr; }));
  auto held = store_->Find("core", 3, 0);
  EXPECT_EQ(held->copy.source_node(), "a");
  const std::vector<char> want = SlotBytes(*a.engine, "core", 3, 0);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), held->data()));
  EXPECT_TRUE(Eventually([&] { return replicated_.load() >= 1; }));
}

TEST_F(ReplicaFetchTest, TheReplicateStageRunsInTheBackground) {
  Node& a = OpenNode("a", dir_.path() + "/shared");
  StartReplicator(a, "a", std::nullopt);
  // Its thread, by the name `top -H` shows, at nice 19.
  std::optional<int> nice;
  ASSERT_TRUE(Eventually([&] {
    for (const auto& task :
         std::filesystem::directory_iterator("/proc/self/task")) {
      std::ifstream comm(task.path() / "comm");
      std::string name;
      if (std::getline(comm, name) && name == "ckpt-replicate") {
        nice = getpriority(
            PRIO_PROCESS, static_cast<id_t>(std::stoi(task.path().filename())));
        return true;
      }
    }
    return false;
  }));
  EXPECT_EQ(nice, kBackgroundNice);
}

// The series of `name` labelled ckpt_job=`job` in what `m` exports now.
std::optional<double> JobCounter(const daemon::ReplicaMetrics& m,
                                 const std::string& name,
                                 const std::string& job) {
  for (const auto& f : m.Collect()) {
    if (f.name != name) continue;
    for (const auto& s : f.metric)
      for (const auto& l : s.label)
        if (l.name == "ckpt_job" && l.value == job) return s.counter.value;
  }
  return std::nullopt;
}

// A sender slower than two saves never completes a copy: each streams from
// the slot the next-but-one save reuses, and is abandoned (or refused as
// torn). Exported per job, and warned about once per rank.
TEST_F(ReplicaFetchTest, ASenderSlowerThanTwoSavesIsCountedAndWarnedAbout) {
  StartHolder(1ull << 30);
  Node& a = OpenNode("a", dir_.path() + "/shared");
  // 64 KiB copies at 128 KiB/s take half a second; a save, milliseconds.
  daemon::Replicator& rep =
      StartReplicator(a, "a", Holder(), std::chrono::seconds(10), 128 << 10);
  daemon::ReplicaMetrics metrics;
  metrics.Attach(nullptr, &rep);
  ::testing::internal::CaptureStderr();
  std::unique_ptr<shm::Arena> arena;
  uint64_t step = 0;
  // Saves back to back until a run of three overwritten copies was warned
  // about (a copy that completes meanwhile starts the run again).
  while (rep.Stats().overwritten_warnings == 0 && step < 20000) {
    ++step;
    ASSERT_TRUE(
        SaveOneTensorStep(a.engine.get(), kMe, {"core", step, true}, &arena)
            .ok());
  }
  // No more saves: the newest step's copy completes.
  ASSERT_TRUE(Eventually([&] { return rep.Stats().pending == 0; }));
  const std::string err = ::testing::internal::GetCapturedStderr();
  metrics.Detach();
  const daemon::ReplicatorStats s = rep.Stats();
  EXPECT_GE(s.overwritten, 3u);
  EXPECT_EQ(s.overwritten_warnings, 1u);
  daemon::ReplicaMetrics after;
  after.Attach(nullptr, &rep);
  EXPECT_EQ(JobCounter(after, "ckptd_replica_sends_overwritten_total", "core"),
            static_cast<double>(s.overwritten));
  after.Detach();
  EXPECT_NE(err.find("replica copies of job 'core' rank 0 to b were "
                     "overwritten 3 times in a row and none completed"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("--slots"), std::string::npos) << err;
  EXPECT_NE(err.find("--replica-bandwidth"), std::string::npos) << err;
}

TEST_F(ReplicaFetchTest, AnOlderStepBecomingDurableDoesNotReplaceTheNewest) {
  StartHolder(1ull << 30);
  Node& a = OpenNode("a", dir_.path() + "/shared");
  std::unique_ptr<shm::Arena> arena;
  for (uint64_t step = 1; step <= 3; ++step)
    ASSERT_TRUE(
        SaveOneTensorStep(a.engine.get(), kMe, {"core", step, true}, &arena)
            .ok());
  ASSERT_TRUE(a.engine->WaitIdle(std::chrono::seconds(20)));
  // The reports as the engine may order them: step 3 committed, then
  // step 1's persist done.
  daemon::Replicator& rep = StartReplicator(a, "a", std::nullopt);
  a.replicator = nullptr;  // only the calls below
  rep.Staged("core", 3, 0);
  rep.Staged("core", 1, 0, /*durable=*/true);
  rep.SetTarget(Holder());
  ASSERT_TRUE(Eventually([&] { return rep.Stats().sent == 1; }));
  EXPECT_NE(store_->Find("core", 3, 0), nullptr);
  EXPECT_EQ(rep.Stats().pending, 0u);
}

TEST_F(ReplicaFetchTest, CopyDamagedOnTheWayIsRefusedAndNeverCounted) {
  StartHolder(1ull << 30);
  Node& a = OpenNode("a", dir_.path() + "/shared");
  daemon::ReplicatorOptions ro;
  ro.node_id = "a";
  ro.retry_delay = std::chrono::milliseconds(20);
  ro.max_retry_delay = std::chrono::milliseconds(100);
  ro.corrupt = true;  // CKPTD_TEST_FAULT=corrupt-replica-sends
  replicators_.push_back(std::make_unique<daemon::Replicator>(ro));
  daemon::Replicator& rep = *replicators_.back();
  rep.SetTarget(Holder());
  rep.Start(a.engine.get());
  a.replicator = &rep;
  std::unique_ptr<shm::Arena> arena;
  ASSERT_TRUE(
      SaveOneTensorStep(a.engine.get(), kMe, {"core", 1, true}, &arena).ok());
  // Sent, refused and retried, again and again. The holder counts a
  // refusal before the sender hears of it: wait for both.
  ASSERT_TRUE(Eventually([&] {
    return store_->Stats().rejected >= 3 && rep.Stats().failed >= 3;
  }));
  EXPECT_EQ(store_->Stats().held, 0u);
  EXPECT_EQ(replicated_.load(), 0);
  EXPECT_EQ(rep.Stats().sent, 0u);
  EXPECT_GE(rep.Stats().failed, 3u);
  EXPECT_NE(rep.Stats().last_error.find("checksum mismatch"), std::string::npos)
      << rep.Stats().last_error;
  // The slot itself was never touched: its bytes still verify.
  auto snap = a.engine->SnapshotStaged("core", 1, 0);
  ASSERT_TRUE(snap.ok());
  EXPECT_TRUE(
      daemon::VerifyReplicaImage(snap->data(), snap->copy, "slot").ok());
}

// A "stopped" holder on loopback: the kernel accepts connections, nobody
// reads. Closes its socket when it goes.
struct StuckHolder {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  uint16_t port = 0;
  StuckHolder() {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
        listen(fd, 16) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
      port = ntohs(addr.sin_port);
  }
  ~StuckHolder() { close(fd); }
  // Whether a connection waits to be accepted (the kernel took it).
  bool Connected() const {
    pollfd p{fd, POLLIN, 0};
    return poll(&p, 1, 0) == 1;
  }
  daemon::ReplicaPeer Peer() const { return {"b", "127.0.0.1", port}; }
};

TEST_F(ReplicaFetchTest, SavesGoOnWhileTheHolderIsStoppedThenItIsReplaced) {
  StuckHolder stuck;
  ASSERT_NE(stuck.port, 0);
  Node& a = OpenNode("a", dir_.path() + "/shared");
  daemon::Replicator& rep =
      StartReplicator(a, "a", stuck.Peer(), std::chrono::milliseconds(500));
  std::unique_ptr<shm::Arena> arena;
  for (uint64_t step = 1; step <= 20; ++step)
    ASSERT_TRUE(
        SaveOneTensorStep(a.engine.get(), kMe, {"core", step, true}, &arena)
            .ok())
        << "save " << step;
  // Every save committed while the stage could deliver nothing.
  EXPECT_EQ(rep.Stats().sent, 0u);
  EXPECT_EQ(rep.Stats().pending, 1u);
  // The coordinator places the replica elsewhere: the newest step goes.
  StartHolder(1ull << 30);
  rep.SetTarget(Holder());
  ASSERT_TRUE(
      Eventually([&] { return store_->Find("core", 20, 0) != nullptr; }));
  // The holder keeps it before the sender hears back.
  ASSERT_TRUE(Eventually([&] { return rep.Stats().sent == 1; }));
  EXPECT_EQ(store_->Stats().held, 1u);
}

TEST_F(ReplicaFetchTest, ASendInFlightToAStoppedHolderIsCancelledOnANewTarget) {
  // The send to the stopped holder would last its whole deadline (two
  // minutes here, past Eventually's 30 s): a new target cancels it.
  StuckHolder stuck;
  ASSERT_NE(stuck.port, 0);
  Node& a = OpenNode("a", dir_.path() + "/shared");
  daemon::Replicator& rep =
      StartReplicator(a, "a", stuck.Peer(), std::chrono::minutes(2));
  std::unique_ptr<shm::Arena> arena;
  ASSERT_TRUE(
      SaveOneTensorStep(a.engine.get(), kMe, {"core", 1, true}, &arena).ok());
  // In flight: the sender has connected to the stopped holder.
  ASSERT_TRUE(Eventually([&] { return stuck.Connected(); }));
  StartHolder(1ull << 30);
  rep.SetTarget(Holder());
  ASSERT_TRUE(Eventually([&] { return rep.Stats().sent == 1; }));
  EXPECT_NE(store_->Find("core", 1, 0), nullptr);
  // A cancel is not a failure of the holder.
  EXPECT_EQ(rep.Stats().failed, 0u) << rep.Stats().last_error;
}

TEST_F(ReplicaFetchTest, AHolderWithoutRoomIsReportedUntilTheTargetChanges) {
  StartHolder(4096);  // not one shard
  Node& a = OpenNode("a", dir_.path() + "/shared");
  daemon::Replicator& rep = StartReplicator(a, "a", Holder());
  EXPECT_FALSE(rep.Refused().has_value());
  std::unique_ptr<shm::Arena> arena;
  ASSERT_TRUE(
      SaveOneTensorStep(a.engine.get(), kMe, {"core", 1, true}, &arena).ok());
  ASSERT_TRUE(Eventually([&] { return rep.Refused().has_value(); }));
  EXPECT_EQ(rep.Refused()->holder, "b");
  EXPECT_NE(rep.Refused()->reason.find("replica_memory_bytes"),
            std::string::npos)
      << rep.Refused()->reason;
  EXPECT_EQ(store_->Stats().used_bytes, 0u);
  EXPECT_EQ(store_->Stats().held, 0u);
  // The coordinator names another target (here: none): the refusal was of
  // the old one.
  rep.SetTarget(std::nullopt);
  EXPECT_FALSE(rep.Refused().has_value());
  EXPECT_EQ(rep.Stats().pending, 1u);
}

// Another node's copy of the rank at a huge generation and step (any peer
// may send one) does not keep this node's copies out of the holder.
TEST_F(ReplicaFetchTest, AnotherNodesClaimOnARankDoesNotKeepItsCopiesOut) {
  StartHolder(1ull << 30);
  const storage::Shard claim = ReplicaImage("core", 1000, 0, 1);
  ASSERT_TRUE(Put(CopyOf(claim, 9, "p"), claim.image).ok());
  Node& a = OpenNode("a", dir_.path() + "/shared");
  daemon::Replicator& rep = StartReplicator(a, "a", Holder());
  std::unique_ptr<shm::Arena> arena;
  ASSERT_TRUE(
      SaveOneTensorStep(a.engine.get(), kMe, {"core", 1, true}, &arena).ok());
  EXPECT_TRUE(
      Eventually([&] { return store_->Find("core", 1, 0) != nullptr; }));
  EXPECT_TRUE(Eventually([&] { return rep.Stats().sent == 1; }));
  EXPECT_EQ(rep.Stats().failed, 0u) << rep.Stats().last_error;
}

// A holder that refuses this node's copy as older than the one it holds
// (here: a job of the same name, deleted and started again, whose steps
// and generation start low again) is reported as a refusal, so that the
// coordinator places the copies elsewhere; the copy never counts as sent.
TEST_F(ReplicaFetchTest, AHolderRefusingACopyAsOlderIsReportedNotCountedSent) {
  StartHolder(1ull << 30);
  const storage::Shard old_job = ReplicaImage("core", 1000, 0, 1);
  ASSERT_TRUE(Put(CopyOf(old_job, 9, "a"), old_job.image).ok());
  Node& a = OpenNode("a", dir_.path() + "/shared");
  daemon::Replicator& rep = StartReplicator(a, "a", Holder());
  std::unique_ptr<shm::Arena> arena;
  ASSERT_TRUE(
      SaveOneTensorStep(a.engine.get(), kMe, {"core", 1, true}, &arena).ok());
  ASSERT_TRUE(Eventually([&] { return rep.Refused().has_value(); }));
  EXPECT_EQ(rep.Refused()->holder, "b");
  EXPECT_NE(rep.Refused()->reason.find("copy.step"), std::string::npos)
      << rep.Refused()->reason;
  EXPECT_EQ(rep.Stats().sent, 0u);
  EXPECT_GE(rep.Stats().failed, 1u);
  EXPECT_EQ(store_->Find("core", 1, 0), nullptr);
}

// A job deleted on its node and registered again under the same name is a
// new life there: its steps start low again (at the same generation), and
// its copies are kept by the holder, which drops and withdraws every copy
// of the deleted life from that node (all ranks, not only the one whose
// new copy came), so no plan can name them and they hold no memory. A late
// copy of the deleted life is refused.
TEST_F(ReplicaFetchTest, AJobDeletedAndRegisteredAgainIsANewLifeAtTheHolder) {
  StartHolder(1ull << 30);
  Node& a = OpenNode("a", dir_.path() + "/shared");
  daemon::Replicator& rep = StartReplicator(a, "a", Holder());
  std::unique_ptr<shm::Arena> arena;
  // Each rank's newest staged shard is sent: one step at a time, so that
  // the holder keeps two steps of each rank.
  for (uint64_t step = 5; step <= 6; ++step) {
    for (uint32_t rank = 0; rank < 2; ++rank)
      ASSERT_TRUE(SaveOneTensorStep(a.engine.get(), kMe,
                                    {"core", step, true, false, rank, 2, 0xAA},
                                    &arena)
                      .ok());
    ASSERT_TRUE(Eventually([&] {
      return store_->Find("core", step, 0) && store_->Find("core", step, 1);
    }));
  }
  const rv1::ShardCopy old_life = store_->Find("core", 6, 0)->copy;
  ASSERT_NE(old_life.job_life(), 0u);
  ASSERT_TRUE(Eventually([&] { return rep.Stats().pending == 0; }));
  const uint64_t sent_before = rep.Stats().sent;
  v1::DeleteRequest del;
  del.set_job("core");
  del.set_all_steps(true);
  ASSERT_TRUE(a.engine->Delete(kMe, del).ok());
  ASSERT_TRUE(SaveOneTensorStep(a.engine.get(), kMe,
                                {"core", 1, true, false, 0, 2, 0x11}, &arena)
                  .ok());
  ASSERT_TRUE(Eventually([&] { return store_->Find("core", 1, 0) != nullptr; }))
      << "the new life's copy was not kept: "
      << (rep.Refused() ? rep.Refused()->reason : rep.Stats().last_error);
  const std::vector<char> mine = SlotBytes(*a.engine, "core", 1, 0);
  EXPECT_TRUE(
      std::equal(mine.begin(), mine.end(), store_->Find("core", 1, 0)->data()));
  EXPECT_GT(store_->Find("core", 1, 0)->copy.job_life(), old_life.job_life());
  for (uint64_t step : {5, 6})
    for (uint32_t rank : {0, 1})
      EXPECT_EQ(store_->Find("core", step, rank), nullptr)
          << "step " << step << " rank " << rank << " of the deleted life";
  EXPECT_EQ(store_->Stats().held, 1u);
  std::set<std::pair<uint64_t, uint32_t>> withdrawn;
  for (const rv1::ShardCopy& c : Evicted())
    withdrawn.insert({c.step(), c.rank()});
  EXPECT_EQ(withdrawn, (std::set<std::pair<uint64_t, uint32_t>>{
                           {5, 0}, {5, 1}, {6, 0}, {6, 1}}));
  EXPECT_FALSE(rep.Refused().has_value());
  EXPECT_TRUE(Eventually([&] { return rep.Stats().sent == sent_before + 1; }))
      << rep.Stats().sent;
  // A copy of the deleted life arriving late is refused, naming the life.
  const storage::Shard late = ReplicaImage("core", 7, 1, 2);
  rv1::ShardCopy late_copy = CopyOf(late, old_life.generation(), "a");
  late_copy.set_job_life(old_life.job_life());
  auto put = Put(late_copy, late.image);
  EXPECT_EQ(put.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(put.status().message().find("job_life"), std::string::npos)
      << put.status();
  EXPECT_EQ(store_->Find("core", 7, 1), nullptr);
}

TEST_F(ReplicaFetchTest, SavesBeforeTheTargetIsKnownAreSentOnceItIs) {
  // The node learns its target with a heartbeat after its trainer saved.
  StartHolder(1ull << 30);
  Node& a = OpenNode("a", dir_.path() + "/shared");
  daemon::Replicator& rep = StartReplicator(a, "a", std::nullopt);
  std::unique_ptr<shm::Arena> arena;
  for (uint64_t step = 1; step <= 2; ++step)
    ASSERT_TRUE(
        SaveOneTensorStep(a.engine.get(), kMe, {"core", step, true}, &arena)
            .ok());
  EXPECT_EQ(rep.Stats().pending, 1u);
  rep.SetTarget(Holder());
  ASSERT_TRUE(
      Eventually([&] { return store_->Find("core", 2, 0) != nullptr; }));
  ASSERT_TRUE(Eventually([&] { return rep.Stats().pending == 0; }));
  EXPECT_EQ(rep.Stats().failed, 0u) << rep.Stats().last_error;
}

TEST_F(ReplicaFetchTest, PrefetchFromAReplicaRestoresTheExactBytes) {
  StartHolder(1ull << 30);
  const storage::Shard s = ReplicaImage("j", 7, 1, 2);
  ASSERT_TRUE(Put(CopyOf(s), s.image).ok());
  Node& c = OpenNode("c", dir_.path() + "/shared");
  const coord::v1::ShardSource src = ReplicaOnB(server_->port());
  std::vector<daemon::FallbackReport> fallbacks;
  ASSERT_TRUE(daemon::PrefetchRank(
                  *c.engine, {}, "j", 2, 7, 1, "", &src, getuid(),
                  [&](daemon::FallbackReport f) { fallbacks.push_back(f); })
                  .ok());
  EXPECT_TRUE(fallbacks.empty());
  auto restored = Restore(c, "j", 7, 1);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(*restored == s.image);
  // Not stored anywhere yet: the replacement persists it itself.
  EXPECT_TRUE(c.engine->WaitIdle(std::chrono::seconds(20)));
  EXPECT_TRUE(c.local->Stat(storage::ShardKey("j", 7, 1, "c")).ok());
}

// A replacement's fetch records what it fetched (the job, the rank's
// arena, the shard) without waiting for a disk sync, as a save's commit
// records its staged shard: the records describe shared memory, which a
// machine crash loses with them, and a daemon crash keeps the page cache.
// Synced, each waited ~0.1 s on this VM's disk on a node loss's critical
// path. Both copies are stored on the shared root already (the key), so
// nothing is persisted here and no other write syncs meanwhile.
TEST_F(ReplicaFetchTest, AReplacementsFetchWaitsForNoDiskSync) {
  const std::string shared = dir_.path() + "/shared";
  Node& a = OpenNode("a", shared);
  std::unique_ptr<shm::Arena> arena;
  const std::vector<char> want = SaveDurableStep4(*a.engine, &arena);
  const std::string key = storage::ShardKey("core", 4, 0, "a");
  StartHolder(1ull << 30);
  auto held = a.engine->SnapshotStaged("core", 4, 0);
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_TRUE(Put(held->copy, want).ok());
  std::atomic<int> syncs{0};
  auto count = [&](bool sync) { syncs += sync ? 1 : 0; };
  Node& c = OpenNode("c", shared, count);
  Node& d = OpenNode("d", shared, count);
  ASSERT_EQ(syncs.load(), 0);
  const coord::v1::ShardSource src = ReplicaOnB(server_->port());
  std::vector<daemon::FallbackReport> fallbacks;
  auto fallback = [&](daemon::FallbackReport f) { fallbacks.push_back(f); };
  // From the replica holder's memory, and from the shared root.
  ASSERT_TRUE(daemon::PrefetchRank(*c.engine, {}, "core", 1, 4, 0, key, &src,
                                   getuid(), fallback)
                  .ok());
  ASSERT_TRUE(daemon::PrefetchRank(*d.engine, {}, "core", 1, 4, 0, key, nullptr,
                                   getuid(), fallback)
                  .ok());
  EXPECT_TRUE(fallbacks.empty());
  EXPECT_EQ(syncs.load(), 0) << "a fetch waited for a synced catalog write";
  for (Node* n : {&c, &d}) {
    auto restored = Restore(*n, "core", 4, 0);
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_TRUE(*restored == want);
  }
  // The records are there for a restarted daemon all the same.
  for (Node* n : {&c, &d}) {
    auto shards = n->catalog->Shards("core");
    ASSERT_TRUE(shards.ok()) << shards.status();
    ASSERT_EQ(shards->size(), 1u);
    EXPECT_EQ((*shards)[0].path(), key);
    auto jobs = n->catalog->Jobs();
    ASSERT_TRUE(jobs.ok()) << jobs.status();
    ASSERT_EQ(jobs->size(), 1u);
    EXPECT_EQ((*jobs)[0].arena_slot_bytes().count(0), 1u);
  }
}

// A node that comes back after a shrink still holds its own save of a
// step number the shrunk job then saved again (an abandoned timeline:
// world size 4, the committed step's save: world size 2). A PREFETCH of
// the committed save must replace it, not take it for the ordered one
// (ElasticClusterTest.ReturnedNodeGrowsTheJobBackAtItsNextCommit looped
// through 255 plans: "written by a job of world size 4, the saved rank's
// world size is 2"). From the shared root, and from a peer's memory.
TEST_F(ReplicaFetchTest, APrefetchReplacesASaveOfAnAbandonedTimeline) {
  const std::string shared = dir_.path() + "/shared";
  Node& b = OpenNode("b", shared);
  std::unique_ptr<shm::Arena> b_arena;
  // The committed save: rank 1 of 2, step 4, every byte 0x22.
  ASSERT_TRUE(
      SaveOneTensorStep(
          b.engine.get(), kMe,
          {.job = "core", .step = 4, .rank = 1, .world_size = 2, .fill = 0x22},
          &b_arena)
          .ok());
  ASSERT_TRUE(b.engine->WaitIdle(std::chrono::seconds(20)));
  const std::vector<char> want = SlotBytes(*b.engine, "core", 4, 1);
  const std::string key = storage::ShardKey("core", 4, 1, "b");
  StartHolder(1ull << 30);
  auto held = b.engine->SnapshotStaged("core", 4, 1);
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_TRUE(Put(held->copy, want).ok());
  const uint64_t digest = storage::ChecksumsDigest(std::vector<uint64_t>(
      held->copy.checksums().begin(), held->copy.checksums().end()));
  for (bool from_peer : {false, true}) {
    SCOPED_TRACE(from_peer ? "from a peer's memory" : "from the shared root");
    Node& c = OpenNode(from_peer ? "c" : "d", shared);
    std::unique_ptr<shm::Arena> c_arena;
    // Its own save of step 4 rank 1 in the abandoned timeline: 4 ranks.
    ASSERT_TRUE(SaveOneTensorStep(c.engine.get(), kMe,
                                  {.job = "core",
                                   .step = 4,
                                   .rank = 1,
                                   .world_size = 4,
                                   .fill = 0x44},
                                  &c_arena)
                    .ok());
    ASSERT_TRUE(c.engine->WaitIdle(std::chrono::seconds(20)));
    coord::v1::ShardSource src = ReplicaOnB(server_->port());
    src.add_save_digests(digest);
    ASSERT_TRUE(daemon::PrefetchRank(*c.engine, {}, "core", 2, 4, 1,
                                     from_peer ? "" : key,
                                     from_peer ? &src : nullptr, getuid(), {})
                    .ok());
    auto restored = Restore(c, "core", 4, 1);
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_TRUE(*restored == want)
        << "restored another save of step 4 than the one ordered";
  }
}

TEST_F(ReplicaFetchTest, FailedPeerFetchFallsBackToTheSharedRoot) {
  const std::string shared = dir_.path() + "/shared";
  Node& a = OpenNode("a", shared);
  std::unique_ptr<shm::Arena> arena;
  const std::vector<char> want = SaveDurableStep4(*a.engine, &arena);
  Node& c = OpenNode("c", shared);
  // A holder that is gone.
  const coord::v1::ShardSource dead = ReplicaOnB(FreeLoopbackPort());
  std::vector<daemon::FallbackReport> fallbacks;
  ASSERT_TRUE(daemon::PrefetchRank(
                  *c.engine, {}, "core", 1, 4, 0,
                  storage::ShardKey("core", 4, 0, "a"), &dead, getuid(),
                  [&](daemon::FallbackReport f) { fallbacks.push_back(f); })
                  .ok());
  ASSERT_EQ(fallbacks.size(), 1u);
  EXPECT_EQ(fallbacks[0].copy, "memory");
  EXPECT_EQ(fallbacks[0].next_copy, "file");
  EXPECT_NE(fallbacks[0].reason.find("replica on b"), std::string::npos);
  auto restored = Restore(c, "core", 4, 0);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(*restored == want);
}

TEST_F(ReplicaFetchTest, RestoreWaitsForAFetchInFlightInsteadOfFailing) {
  StartHolder(1ull << 30);
  const storage::Shard s = ReplicaImage("j", 9, 0, 1);
  ASSERT_TRUE(Put(CopyOf(s), s.image).ok());
  Node& c = OpenNode("c", dir_.path() + "/shared");
  // The PREFETCH is taken: the trainer starts before its shard arrived
  // (without the wait its restore finds no job 'j' here and fails).
  c.engine->BeginFetches("j", 9, {0});
  absl::StatusOr<std::vector<char>> restored = absl::UnknownError("not run");
  std::thread trainer([&] { restored = Restore(c, "j", 9, 0); });
  const coord::v1::ShardSource src = ReplicaOnB(server_->port());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let it ask
  absl::Status fetched =
      daemon::PrefetchRank(*c.engine, {}, "j", 1, 9, 0, "", &src, getuid(), {});
  c.engine->EndFetch("j", 9, 0);
  trainer.join();
  ASSERT_TRUE(fetched.ok()) << fetched;
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(*restored == s.image);
}

}  // namespace
}  // namespace ckpt::testing
