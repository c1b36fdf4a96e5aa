// Who may call what on the coordinator under mutual TLS. The TLS handshake
// (coordinator/client/tls.h) already refused a client without a certificate
// or with one of another CA; here the verified certificate's identities (its
// subject CN and every subjectAltName entry) decide:
// - a request that names a node (a `node_id` field: RegisterNode, Heartbeat,
//   ReportShard, ReportShards, ReportTrainerExit, WatchJob, WatchNode, and
//   any later one)
//   is admitted only when
//   that node id is one of the caller's identities: a node cannot report for
//   another node;
// - job-changing commands (Rollback, Resume, Cordon, Uncordon) and
//   CheckHealth
//   (it makes nodes run checks) need an admin
//   identity: one listed in
//   AuthPolicy::admin_identities (--admin-identities, default "ckpt-admin");
// - RelayBatch (a relay carrying many nodes' heartbeats and reports) needs
//   a relay identity: one listed in AuthPolicy::relay_identities
//   (--relay-identities, default none: no relay is admitted under mTLS).
//   The relay vouches for each item's node (it authorized the node's own
//   call as this file does); items' node_ids are not matched against it;
// - the rest (GetCluster, Events, RegisterJob) need any valid certificate.
// Refusals are PERMISSION_DENIED naming the method, the identity and the
// rule. Without TLS (--insecure) every call is admitted. Functions only;
// thread-safe.
#ifndef CKPT_COORDINATOR_AUTH_H_
#define CKPT_COORDINATOR_AUTH_H_

#include <google/protobuf/message.h>
#include <grpcpp/server_context.h>

#include <string>
#include <vector>

namespace ckpt::coordinator {

struct AuthPolicy {
  bool mtls = false;
  std::vector<std::string> admin_identities{"ckpt-admin"};
  std::vector<std::string> relay_identities;
};

// The peer certificate's CN and subjectAltName values (empty without TLS).
std::vector<std::string> PeerIdentities(const grpc::ServerContextBase& ctx);

grpc::Status Authorize(const grpc::ServerContextBase& ctx,
                       const std::string& method,
                       const google::protobuf::Message& request,
                       const AuthPolicy& policy);

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_AUTH_H_
