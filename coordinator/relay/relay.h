// ckpt-relay (doc/coordinator-scale.md "Relays: the process and the agent",
// doc/operations.md "Relays"): one per rack, or per few hundred nodes. It
// serves the Coordinator service's Heartbeat and ReportShards to its nodes
// on gRPC's callback API (no thread per call; every other method answers
// UNIMPLEMENTED), gathers the calls for up to `gather` or `max_batch`
// items, and forwards them to the leading coordinator in one RelayBatch
// call (coordinator.proto), a few batches in flight at once. Each node's
// call is answered with exactly what the coordinator answered for its item
// (status, message, and the ckpt-retry-after-ms / ckpt-leader trailers),
// or with the whole batch's refusal. A failure of the relay's own (the
// coordinator unreachable, the batch's deadline passed, RelayBatch
// UNIMPLEMENTED by an older coordinator, the relay's identity refused, a
// malformed answer, the node's own deadline passed before its item went
// out) carries the trailer `ckpt-relay-failed: 1`, so that the node agent
// goes to the coordinator directly at once.
//
// Security: with TLS files the relay requires and verifies client
// certificates and authorizes each node call as the coordinator does
// (coordinator/auth.h Authorize: a node speaks only for itself) before it
// is gathered; the same certificate is the relay's client certificate to
// the coordinator, whose --relay-identities must list it. Thread-safe.
#ifndef CKPT_COORDINATOR_RELAY_RELAY_H_
#define CKPT_COORDINATOR_RELAY_RELAY_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/registry.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/client/tls.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace ckpt::coordinator {

class CoordinatorClient;

// The trailer a relay's own failure carries (value "1").
inline constexpr char kRelayFailedMetadataKey[] = "ckpt-relay-failed";

struct RelayOptions {
  std::string listen;       // HOST:PORT for the nodes (port 0: any free one)
  std::string coordinator;  // HOST:PORT[,HOST:PORT...]: the leader is followed
  TlsFiles tls;             // both sides; no files: plaintext (--insecure)
  std::string relay_id;     // printable; default: the host name
  std::chrono::milliseconds gather{5};
  size_t max_batch = 512;      // items (heartbeats + report calls) per batch
  int max_in_flight = 4;       // batches in flight at once
  std::string metrics_listen;  // Prometheus; empty: off
};

// ckpt-relay's command line. InvalidArgument naming the flag on a bad
// value; --help output goes to *help with code Cancelled.
[[nodiscard]] absl::StatusOr<RelayOptions> ParseRelayOptions(int argc,
                                                             char** argv,
                                                             std::string* help);

// The relay's Prometheus metrics (doc/metrics.md).
class RelayMetrics {
 public:
  RelayMetrics();
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }
  // A node call gathered; kind "heartbeat" or "report".
  void Item(const char* kind) { items_.Add({{"kind", kind}}).Increment(); }
  void Batch() { batches_.Increment(); }
  // Node calls answered with the relay's own failure, by reason:
  // unreachable, deadline, unimplemented, refused, malformed, expired.
  void Failed(const char* reason, size_t calls) {
    failures_.Add({{"reason", reason}}).Increment(static_cast<double>(calls));
  }
  // Node calls refused by the relay's authorization.
  void Denied() { denied_.Increment(); }

 private:
  std::shared_ptr<prometheus::Registry> registry_ =
      std::make_shared<prometheus::Registry>();
  prometheus::Family<prometheus::Counter>& items_;
  prometheus::Counter& batches_;
  prometheus::Family<prometheus::Counter>& failures_;
  prometheus::Counter& denied_;
};

class Relay {
 public:
  // Listens and starts the senders; the options were parsed
  // (ParseRelayOptions). `metrics` may be null.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Relay>> Start(
      const RelayOptions& options, std::shared_ptr<RelayMetrics> metrics);
  ~Relay();  // Shutdown()
  int port() const { return port_; }
  // Stops taking calls, answers every gathered one (sent, or failed
  // "relay stopping"), joins the senders. Idempotent.
  void Shutdown();
  void Wait();  // until Shutdown()

  // For the service watchdog (main.cc): node calls gathered and answered
  // (their batch came back, or they expired) so far, each counted before
  // its node's answer goes out; calls wait while they differ.
  struct Progress {
    uint64_t gathered = 0;
    uint64_t answered = 0;
  };
  Progress progress() const;
  // The longest a sender may take over a batch while nothing is wrong: the
  // gathering, then every replica tried with the longest batch timeout.
  std::chrono::milliseconds longest_send() const { return longest_send_; }
  // Whether the last batch was answered by the coordinator.
  bool coordinator_answers() const { return coordinator_ok_.load(); }

  struct Item;  // one node call, gathered (relay.cc)

 private:
  class Service;
  Relay() = default;
  // Gathered by the service; takes ownership.
  void Push(std::unique_ptr<Item> item);
  void SenderLoop();
  void Send(std::vector<std::unique_ptr<Item>> batch);

  RelayOptions options_;
  std::shared_ptr<RelayMetrics> metrics_;
  std::unique_ptr<CoordinatorClient> client_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::mutex mu_;  // guards pending_ and stopping_; never held across I/O
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Item>> pending_;
  bool stopping_ = false;
  std::vector<std::thread> senders_;
  // The last batch was answered (a change is logged once each way).
  std::atomic<bool> coordinator_ok_{true};
  std::atomic<uint64_t> gathered_{0};
  std::atomic<uint64_t> answered_{0};
  std::chrono::milliseconds longest_send_{0};
  std::mutex shutdown_mu_;
  bool shut_down_ = false;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_RELAY_RELAY_H_
