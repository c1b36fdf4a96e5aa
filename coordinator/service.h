// CoordinatorServer: the gRPC Coordinator service (coordinator.proto) in
// front of a Coordinator, listening on TCP, the CoordinatorWatch service
// (watch_service.h), and the failure-detector thread that calls
// Coordinator::Tick() every 20 ms (cheap while no node can have timed out),
// so a silent node is declared dead within heartbeat_timeout + ~20 ms. Each
// RPC maps the Coordinator's absl::Status to the gRPC status with the same
// code and message.
//
// Overload (doc/coordinator-scale.md): Heartbeat, ReportShards,
// RegisterNode and RelayBatch (a relay's batch of many nodes' heartbeats
// and reports) run on gRPC's callback API, each kind admitted by its own
// bounded queue and run on the server's own workers (admission.h), so no
// gRPC thread waits for the state lock or a durable write for them and a
// registration storm cannot starve heartbeats. A heartbeat counts for
// liveness as soon as it arrives, even when admission then sheds it. A
// refusal is RESOURCE_EXHAUSTED with a jittered kRetryAfterMetadataKey
// trailer. Other calls run on a bounded synchronous pool
// (ServerLimits::max_threads through a grpc::ResourceQuota; gRPC answers
// RESOURCE_EXHAUSTED beyond it); ReportShard, ReportFallback and
// ReportStacks share a bound of max_inflight_reports. Time the coordinator
// could not hear (a state load, a failure detector that woke late) is held
// against no node (hearing.h).
//
// Security: with TLS files the server requires and verifies client
// certificates and admits calls per coordinator/auth.h (WatchJob and
// ReportShards too: their node_id must be the caller's); without, plaintext.
// HA (--state etcd://): the server starts as a standby (StartStandby) and
// answers every call (WatchJob included) UNAVAILABLE "not leader; leader is
// HOST:PORT" with HOST:PORT also in the "ckpt-leader" trailing metadata
// (kLeaderMetadataKey: the field clients follow, coordinator/client/
// leader_channel.h; the text is for people and older clients) until
// Promote() hands it the Coordinator loaded by the election's winner; it
// also answers so whenever `leadership.leading()` turns false (and ends
// the open watch streams so).
// Thread-safe; Shutdown() is idempotent and runs on destruction.
#ifndef CKPT_COORDINATOR_SERVICE_H_
#define CKPT_COORDINATOR_SERVICE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/auth.h"
#include "coordinator/client/tls.h"
#include "coordinator/coordinator.h"

namespace grpc {
class Server;
class Service;
}  // namespace grpc

namespace ckpt::coordinator {

struct ServerLimits {
  int max_threads = 256;
  int max_inflight_reports = 16;  // and as many registrations
  int max_queued_heartbeats = 4096;
  // ReportShards calls admitted at once (queued + running), applied in
  // groups (call_groups.h): a step's herd of one call per node is taken
  // whole, not refused beyond the workers and retried 100-300 ms later.
  int max_queued_reports = 4096;
  // RelayBatch calls admitted at once, each counted until it is answered
  // (its group-commit wait included); beyond, a batch is refused
  // RESOURCE_EXHAUSTED with a retry-after (its heartbeats still heard).
  // See the "Relays" section of doc/coordinator-scale.md.
  int max_queued_relay_batches = 1024;
};

// A refusal for load (RESOURCE_EXHAUSTED) carries this trailer: when to
// try again, in milliseconds, jittered so the refused do not return
// together. The node agent honours it.
inline constexpr char kRetryAfterMetadataKey[] = "ckpt-retry-after-ms";

// The largest request the server takes: a node's ReportShards batch
// carries each rank's layout index; its agent keeps a batch's reports
// under kMaxReportBatchBytes.
inline constexpr int kMaxRequestBytes = 64 << 20;
inline constexpr int kMaxReportBatchBytes = 32 << 20;

struct ServerSecurity {
  TlsFiles tls;  // no files: plaintext
  std::vector<std::string> admin_identities{"ckpt-admin"};
  // Under mTLS, who may call RelayBatch (auth.h); none by default.
  std::vector<std::string> relay_identities;
};

struct Leadership {
  std::function<bool()> leading;        // false: answer "not leader"
  std::function<std::string()> leader;  // the leader's address, "" if unknown
};

class WatchService;

class CoordinatorServer {
 public:
  // listen: "HOST:PORT"; port 0 picks a free port (see port()). Plaintext.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(
      std::unique_ptr<Coordinator> coordinator, const std::string& listen,
      ServerLimits limits = {});
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(
      std::unique_ptr<Coordinator> coordinator, const std::string& listen,
      const ServerSecurity& security, ServerLimits limits = ServerLimits());
  // Serves "not leader" until Promote().
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CoordinatorServer>>
  StartStandby(const std::string& listen, const ServerSecurity& security,
               Leadership leadership, ServerLimits limits = ServerLimits());
  // Starts serving `coordinator` (once, after StartStandby).
  void Promote(std::unique_ptr<Coordinator> coordinator);
  // Whether a Coordinator is served (Start, or Promote ran). Lock-free.
  bool promoted() const { return promoted_.load(std::memory_order_acquire); }
  // Changes the report admission limit at run time (0 refuses every report
  // call with RESOURCE_EXHAUSTED: an operator shedding load, or a test).
  void SetMaxInflightReports(int n);
  // Heartbeats admitted at once (queued or running); beyond, they are
  // refused (still heard: their nodes are not judged on it). 0 sheds all.
  void SetMaxQueuedHeartbeats(int n);
  // RelayBatch calls admitted at once; 0 sheds every batch (its
  // heartbeats still heard).
  void SetMaxQueuedRelayBatches(int n);
  // The served Coordinator (nullptr before Promote).
  Coordinator* coordinator() { return coordinator_.get(); }
  ~CoordinatorServer();

  int port() const { return port_; }
  // Lock-free, for the service watchdog: Tick() calls finished so far, and
  // how often the failure detector ticks.
  uint64_t ticks() const { return ticks_.load(std::memory_order_relaxed); }
  std::chrono::milliseconds tick_period() const;
  void Wait();  // until Shutdown()
  void Shutdown();

 private:
  CoordinatorServer() = default;
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CoordinatorServer>>
  Listen(const std::string& listen, const ServerSecurity& security,
         Leadership leadership, ServerLimits limits);
  void TickLoop();
  // Coordinator::AuditManifests every few seconds (it reads the shared
  // root: never on the failure detector's thread).
  void AuditLoop();
  // Measures how long this server takes to read a heartbeat; too long,
  // and no node is judged on that time (hearing.h).
  void EarLoop();

  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<grpc::Service> service_;
  std::unique_ptr<WatchService> watch_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::atomic<int> max_inflight_reports_{16};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::atomic<uint64_t> ticks_{0};
  std::atomic<bool> promoted_{false};
  std::thread ticker_;
  std::thread auditor_;
  std::thread ear_;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_SERVICE_H_
