// Peer replicas between real processes (doc/replicas.md): two ckptd's
// joined to the real ckpt-coordinator binary on loopback, one sending its
// rank's staged shards (--replica-target) to the other's replica listener
// (--replica-port), which holds the newest verified copy: the bytes it
// serves are the shard's, the same the sender persisted; a sender whose
// copies are damaged on the wire (CKPTD_TEST_FAULT=corrupt-replica-sends,
// over the default bulk transport) has every one refused, none held.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <thread>

#include "ckpt/client.h"
#include "daemon/replica/replica_client.h"
#include "daemon/replica/replica_service.h"
#include "storage/keys.h"
#include "tests/coordinator_process.h"
#include "tests/eventually.h"
#include "tests/harness.h"
#include "tests/metrics_scrape.h"
#include "tests/metrics_text.h"
#include "tests/test_util.h"

namespace ckpt::testing {
namespace {

namespace rv1 = ::ckpt::replica::v1;

absl::StatusOr<std::vector<char>> GetCopy(int port, const std::string& job,
                                          uint64_t step) {
  auto channel = daemon::ReplicaChannel({}, "b", "127.0.0.1", port);
  if (!channel.ok()) return channel.status();
  rv1::GetRequest req;
  req.set_job(job);
  req.set_step(step);
  req.set_rank(0);
  req.set_replica(true);
  std::vector<char> out;
  auto got = daemon::GetReplica(
      **channel, req,
      [&](const rv1::ShardCopy& c) -> absl::StatusOr<char*> {
        out.resize(c.image_bytes());
        return out.data();
      },
      std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!got.ok()) return got.status();
  return out;
}

// The ports these tests hand to daemons: distinct, free on every address,
// and below the kernel's ephemeral range, where no other test's outgoing
// connection can take one before the daemon binds it (a run of the quick
// suite failed with "--replica-port: cannot listen on 0.0.0.0:46469":
// address already in use).
TEST(FreeLoopbackPortsTest, AreDistinctFreeAndOutsideTheEphemeralRange) {
  const int ephemeral = EphemeralPortsStart();
  ASSERT_GT(ephemeral, 11000) << "this machine's ephemeral range starts low";
  const std::vector<int> ports = FreeLoopbackPorts(8);
  ASSERT_EQ(ports.size(), 8u);
  for (int port : ports) {
    EXPECT_GE(port, 10000);
    EXPECT_LT(port, ephemeral);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(port));
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0)
        << "port " << port;
    close(fd);
  }
  EXPECT_EQ(std::set<int>(ports.begin(), ports.end()).size(), ports.size());
}

TEST(ReplicaClusterTest, TwoCkptdsReplicateAVerifiedCopyOverLoopback) {
  TempDir dir;
  ArenaPrefixes arenas;  // outlives the daemons below
  const std::string shared = dir.path() + "/shared";
  std::filesystem::create_directories(shared);
  CoordinatorProcess coordinator(dir.path() + "/coord", shared, 3000);
  ASSERT_GT(coordinator.port(), 0);
  const std::vector<int> ports = FreeLoopbackPorts(3);
  const int replica_port = ports[0];
  const std::string metrics_a = "127.0.0.1:" + std::to_string(ports[1]);
  const std::string metrics_b = "127.0.0.1:" + std::to_string(ports[2]);
  auto node = [&](const std::string& id, std::vector<std::string> extra) {
    std::vector<std::string> args = {"--coordinator",
                                     coordinator.address(),
                                     "--insecure",
                                     "--node-id",
                                     id,
                                     "--advertise-addr",
                                     "127.0.0.1",
                                     "--shared-root",
                                     shared};
    args.insert(args.end(), extra.begin(), extra.end());
    std::filesystem::create_directories(dir.path() + "/" + id);
    return DaemonProcess::Start(dir.path() + "/" + id + "/root",
                                dir.path() + "/" + id, arenas.New(), args);
  };
  auto b = node("b", {"--replica-port", std::to_string(replica_port),
                      "--metrics-listen", metrics_b});
  ASSERT_TRUE(b.ok()) << b.status();
  auto a = node(
      "a", {"--replica-target", "b@127.0.0.1:" + std::to_string(replica_port),
            "--metrics-listen", metrics_a});
  ASSERT_TRUE(a.ok()) << a.status();

  auto client = Client::Connect(OptionsFor(**a, "job", 0, 1));
  ASSERT_TRUE(client.ok()) << client.status();
  HostState state = MakeState(6 << 20, 5, 7);
  for (int64_t step = 1; step <= 3; ++step)
    ASSERT_TRUE((*client)->Save(step, state.tensors).ok());
  absl::StatusOr<std::vector<char>> held = absl::NotFoundError("not yet");
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!(held = GetCopy(replica_port, "job", 3)).ok() &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(held.ok()) << held.status();
  // The sender's own persisted file of the step holds the same bytes.
  ASSERT_TRUE((*client)->WaitDurable(3, std::chrono::seconds(30)).ok());
  std::ifstream file(shared + "/" + storage::ShardKey("job", 3, 0, "a"),
                     std::ios::binary);
  std::vector<char> stored((std::istreambuf_iterator<char>(file)),
                           std::istreambuf_iterator<char>());
  EXPECT_EQ(stored.size(), held->size());
  EXPECT_TRUE(stored == *held);
  // Only the two newest copies are kept: step 3 and at most one of the
  // older steps (a sender sends each rank's newest, so it may skip one).
  int older = 0;
  for (int64_t step : {1, 2}) older += GetCopy(replica_port, "job", step).ok();
  EXPECT_LE(older, 1);
  // What the operators see.
  const std::string holder =
      HttpGet("http://" + metrics_b + "/metrics").value_or("");
  EXPECT_EQ(SampleValue(holder, "ckptd_replica_held"), 1.0 + older) << holder;
  EXPECT_GE(SampleValue(holder, "ckptd_replicas_verified_total").value_or(0),
            1.0);
  // A copy read while a save reused its slot is refused there (and
  // abandoned by the sender); rejected_total may count it. The sender
  // counts a copy once the holder's answer is back, which may be after
  // the holder serves it: waited for as an event.
  std::string sent;
  EXPECT_TRUE(Eventually([&] {
    sent = HttpGet("http://" + metrics_a + "/metrics").value_or("");
    return SampleValue(sent, "ckptd_replicas_sent_total").value_or(0) >= 1.0;
  })) << sent;
}

TEST(ReplicaClusterTest, CopiesDamagedOnTheWireAreRefusedByARealHolder) {
  TempDir dir;
  ArenaPrefixes arenas;  // outlives the daemons below
  const std::string shared = dir.path() + "/shared";
  std::filesystem::create_directories(shared);
  CoordinatorProcess coordinator(dir.path() + "/coord", shared, 3000);
  ASSERT_GT(coordinator.port(), 0);
  const std::vector<int> ports = FreeLoopbackPorts(2);
  const int replica_port = ports[0];
  const std::string metrics_b = "127.0.0.1:" + std::to_string(ports[1]);
  auto node = [&](const std::string& id, std::vector<std::string> extra) {
    std::vector<std::string> args = {"--coordinator",
                                     coordinator.address(),
                                     "--insecure",
                                     "--node-id",
                                     id,
                                     "--advertise-addr",
                                     "127.0.0.1",
                                     "--shared-root",
                                     shared};
    args.insert(args.end(), extra.begin(), extra.end());
    std::filesystem::create_directories(dir.path() + "/" + id);
    return DaemonProcess::Start(dir.path() + "/" + id + "/root",
                                dir.path() + "/" + id, arenas.New(), args);
  };
  auto b = node("b", {"--replica-port", std::to_string(replica_port),
                      "--metrics-listen", metrics_b});
  ASSERT_TRUE(b.ok()) << b.status();
  setenv("CKPTD_TEST_FAULT", "corrupt-replica-sends", 1);
  auto a = node(
      "a", {"--replica-target", "b@127.0.0.1:" + std::to_string(replica_port),
            "--replica-transport", "bulk"});
  unsetenv("CKPTD_TEST_FAULT");
  ASSERT_TRUE(a.ok()) << a.status();
  auto client = Client::Connect(OptionsFor(**a, "job", 0, 1));
  ASSERT_TRUE(client.ok()) << client.status();
  HostState state = MakeState(6 << 20, 5, 7);
  ASSERT_TRUE((*client)->Save(1, state.tensors).ok());
  auto scrape = [&] {
    return HttpGet("http://" + metrics_b + "/metrics").value_or("");
  };
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (SampleValue(scrape(), "ckptd_replicas_rejected_total").value_or(0) <
             2 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const std::string holder = scrape();
  // Sent, refused on verification, sent again (the sender retries): never
  // held, never counted as verified.
  EXPECT_GE(SampleValue(holder, "ckptd_replicas_rejected_total").value_or(0),
            2.0)
      << holder;
  EXPECT_EQ(SampleValue(holder, "ckptd_replica_held"), 0.0) << holder;
  EXPECT_EQ(SampleValue(holder, "ckptd_replicas_verified_total"), 0.0)
      << holder;
  EXPECT_EQ(GetCopy(replica_port, "job", 1).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(ReplicaClusterTest, BadReplicaFlagsAndKeysAreRefusedNamingThem) {
  TempDir dir;
  const std::string base = std::string(CKPTD_BINARY) + " --socket " +
                           dir.path() + "/s.sock --root " + dir.path() + "/r";
  const std::string cluster =
      " --coordinator 127.0.0.1:1 --shared-root " + dir.path() + "/shared";
  {
    std::ofstream toml(dir.path() + "/c.toml");
    toml << "replica_port = 70000\n";
  }
  struct Case {
    std::string flags;
    std::string names;
  };
  const Case cases[] = {
      {" --replica-port 5000", "--replica-port: needs --coordinator"},
      {cluster + " --replica-port 70000", "--replica-port"},
      {cluster + " --replica-target b", "--replica-target"},
      {cluster + " --replica-target b@h:0", "--replica-target"},
      {cluster + " --replica-target a/b@h:1", "--replica-target"},
      {cluster + " --domain $'\\x01'", "--domain"},
      {cluster + " --replica-transport udp", "--replica-transport"},
      {cluster + " --config " + dir.path() + "/c.toml", "replica_port"},
  };
  for (const Case& c : cases) {
    CommandResult r =
        RunCommand("bash -c \"" + base + c.flags + "\"", true, 20);
    EXPECT_NE(r.exit_code, 0) << c.flags;
    EXPECT_NE(r.out.find(c.names), std::string::npos)
        << c.flags << ": " << r.out;
  }
}

}  // namespace
}  // namespace ckpt::testing
