// ReplicaServer: this node's replica listener (ckptd --replica-port,
// proto/replica.proto, doc/replicas.md). It serves
//   Put: another node's copy of one of its ranks' staged shards, streamed
//        in chunks into a ReplicaStore reservation, verified there, and
//        announced through on_replicated (the node agent's REPLICATED
//        report) only once it verified;
//   Get: a replica this node holds, or one of its own staged shards (a
//        StagedShards snapshot: read from the slot without any lock, and
//        refused afterwards if a save overwrote the slot meanwhile);
//   OfferPut, OfferGet: the same two for the bulk path (replica_bulk.h):
//        checked and reserved or pinned the same way, answered with a
//        one-time token for the bulk listener, whose connection carries
//        the bytes and the outcome.
// Every request is validated, refusals name the field; a refusal ends that
// call only. Transport security: mutual TLS with the node's own certificate,
// key and CA (the ones it talks to the coordinator with), so only holders
// of a certificate of the cluster's CA can call; under TLS a Put's
// copy.source_node must be one of the caller's certificate identities.
// Plaintext only with --insecure (tests, a trusted network).
//
// Thread-safety: gRPC's threads call the handlers; everything they share
// is the store's (thread-safe) and the StagedShards' (thread-safe).
#ifndef CKPT_DAEMON_REPLICA_REPLICA_SERVICE_H_
#define CKPT_DAEMON_REPLICA_REPLICA_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/client/tls.h"
#include "daemon/replica/replica_bulk.h"
#include "daemon/replica/replica_store.h"
#include "daemon/replica/staged_shards.h"

namespace ckpt::daemon {

// Chunks a sender writes, and the largest one a receiver accepts.
inline constexpr uint64_t kReplicaChunkBytes = 2ull << 20;
inline constexpr uint64_t kMaxReplicaChunkBytes = 4ull << 20;

struct ReplicaServerOptions {
  std::string host = "0.0.0.0";
  int port = 0;  // 0: any free port (tests)
  coordinator::TlsFiles tls;
  // Called once a Put's copy verified and was kept (it must only queue).
  std::function<void(const HeldReplica&)> on_replicated;
  // The bulk listener (--replica-bulk-port; 0: any free port, named in
  // each offer) on `host`, and how long an offer's token lives.
  int bulk_port = 0;
  std::chrono::milliseconds bulk_token_ttl{std::chrono::seconds(60)};
  std::chrono::milliseconds bulk_stall_timeout{std::chrono::seconds(30)};
};

class ReplicaServer {
 public:
  // store and staged (may be null: Get serves replicas only) must outlive
  // the server.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ReplicaServer>> Start(
      ReplicaServerOptions options, ReplicaStore* store, StagedShards* staged);
  ~ReplicaServer();  // Shutdown
  int port() const { return port_; }
  int bulk_port() const { return bulk_->port(); }
  BulkListenerStats bulk_stats() const { return bulk_->Stats(); }
  void Shutdown();

 private:
  class Service;
  ReplicaServer() = default;
  std::unique_ptr<BulkTokens> tokens_;
  std::unique_ptr<BulkListener> bulk_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

// A channel to a peer's replica listener: mutual TLS naming the peer's
// node id as the certificate it must present (node certificates name their
// node), or plaintext with tls.insecure / no TLS files.
[[nodiscard]] absl::StatusOr<std::shared_ptr<grpc::Channel>> ReplicaChannel(
    const coordinator::TlsFiles& tls, const std::string& node_id,
    const std::string& host, uint32_t port);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_REPLICA_REPLICA_SERVICE_H_
