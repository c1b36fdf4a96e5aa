// The network probe on loopback (net_probe.h): a real listener and a real
// TCP connection. Only a token the listener was told to expect opens a
// probe, once; what was sent is what the listener acknowledges; a
// deadline cuts a probe short with the figure of what went through.
#include "daemon/agent/net_probe.h"

#include <gtest/gtest.h>

#include <string>

namespace ckpt::daemon {
namespace {

using std::chrono::milliseconds;
using std::chrono::minutes;
using std::chrono::steady_clock;

const std::string kToken(kNetProbeTokenChars, 'a');
const std::string kOther(kNetProbeTokenChars, 'b');

std::unique_ptr<NetProbeServer> Listen(bool slow = false) {
  NetProbeServerOptions o;
  o.host = "127.0.0.1";
  o.slow = slow;
  auto s = NetProbeServer::Listen(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

TEST(NetProbeTest, AnExpectedTokenOpensOneProbeAndEveryByteIsAcknowledged) {
  auto server = Listen();
  ASSERT_NE(server, nullptr);
  server->Expect(kToken, steady_clock::now() + minutes(1));
  auto r = RunNetProbe("127.0.0.1", server->port(), kToken, 8 << 20,
                       milliseconds(10000));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->bytes, 8u << 20);
  EXPECT_FALSE(r->cut_off);
  EXPECT_GT(r->mb_per_s, 0);
  EXPECT_EQ(server->probes_served(), 1u);
  // The same token again (a replay): refused before any payload.
  auto again = RunNetProbe("127.0.0.1", server->port(), kToken, 1 << 20,
                           milliseconds(10000));
  EXPECT_FALSE(again.ok());
  EXPECT_EQ(server->probes_refused(), 1u);
}

TEST(NetProbeTest, UnknownAndExpiredTokensAreRefused) {
  auto server = Listen();
  ASSERT_NE(server, nullptr);
  server->Expect(kToken, steady_clock::now() + minutes(1));
  auto stranger = RunNetProbe("127.0.0.1", server->port(), kOther, 1 << 20,
                              milliseconds(10000));
  ASSERT_FALSE(stranger.ok());
  EXPECT_NE(std::string(stranger.status().message()).find("without an answer"),
            std::string::npos)
      << stranger.status();
  server->Expect(kOther, steady_clock::now() - milliseconds(1));
  EXPECT_FALSE(RunNetProbe("127.0.0.1", server->port(), kOther, 1 << 20,
                           milliseconds(10000))
                   .ok());
  EXPECT_EQ(server->probes_refused(), 2u);
  EXPECT_EQ(server->probes_served(), 0u);
  // The expected one still works: a refusal used up no other token.
  EXPECT_TRUE(RunNetProbe("127.0.0.1", server->port(), kToken, 1 << 20,
                          milliseconds(10000))
                  .ok());
}

TEST(NetProbeTest, ADeadlineCutsASlowProbeShortWithTheFigureOfWhatWentThrough) {
  // The slow listener reads at most 64 KiB every 10 ms: 64 MiB cannot go
  // through in half a second.
  auto server = Listen(/*slow=*/true);
  ASSERT_NE(server, nullptr);
  server->Expect(kToken, steady_clock::now() + minutes(1));
  auto r = RunNetProbe("127.0.0.1", server->port(), kToken, 64 << 20,
                       milliseconds(500));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->cut_off);
  EXPECT_LT(r->bytes, 64u << 20);
  EXPECT_GT(r->bytes, 0u);
}

TEST(NetProbeTest, BadArgumentsAreRefusedNamingThem) {
  auto short_token = RunNetProbe("127.0.0.1", 1, "abc", 1, milliseconds(100));
  ASSERT_FALSE(short_token.ok());
  EXPECT_NE(std::string(short_token.status().message()).find("token"),
            std::string::npos);
  auto big = RunNetProbe("127.0.0.1", 1, kToken, kMaxNetProbeBytes + 1,
                         milliseconds(100));
  ASSERT_FALSE(big.ok());
  EXPECT_NE(std::string(big.status().message()).find("bytes, at most"),
            std::string::npos);
  auto port = RunNetProbe("127.0.0.1", 0, kToken, 1, milliseconds(100));
  ASSERT_FALSE(port.ok());
  EXPECT_NE(std::string(port.status().message()).find("port"),
            std::string::npos);
  NetProbeServerOptions o;
  o.host = "not-an-address";
  auto s = NetProbeServer::Listen(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(std::string(s.status().message()).find("health net address"),
            std::string::npos);
}

}  // namespace
}  // namespace ckpt::daemon
