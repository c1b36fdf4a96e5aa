// EtcdClient: calls to an etcd v3 cluster (KV Range/Txn, Lease grant/
// keepalive/revoke) through the gRPC API generated from etcd's own protos.
// It holds one channel per member endpoint and talks to one at a time; a call
// that finds its member unreachable (UNAVAILABLE, DEADLINE_EXCEEDED) is tried
// on the next member, and the client stays with the member that answered, so
// a dead member costs one failed attempt. Retrying a Txn on another member is
// safe for our writes: they are idempotent puts/deletes fenced by a compare,
// and the one leader that issues them waits for the answer.
// (`--state etcd://...` is parsed by etcd_state.h.)
// Thread-safe.
#ifndef CKPT_COORDINATOR_ETCD_ETCD_CLIENT_H_
#define CKPT_COORDINATOR_ETCD_ETCD_CLIENT_H_

#include <grpcpp/security/credentials.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/etcd/etcd_state.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"

namespace ckpt::coordinator::etcd {

class EtcdClient {
 public:
  // `endpoints` already validated; `timeout` bounds each attempt;
  // `credentials` (TLS to etcd, coordinator/client/tls.h) default to
  // plaintext.
  EtcdClient(std::vector<std::string> endpoints,
             std::chrono::milliseconds timeout,
             std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

  [[nodiscard]] absl::StatusOr<etcdserverpb::RangeResponse> Range(
      const etcdserverpb::RangeRequest& req);
  [[nodiscard]] absl::StatusOr<etcdserverpb::TxnResponse> Txn(
      const etcdserverpb::TxnRequest& req);
  [[nodiscard]] absl::StatusOr<etcdserverpb::LeaseGrantResponse> LeaseGrant(
      int64_t ttl_s);
  // One keepalive of `lease` (a short LeaseKeepAlive stream); the answer's
  // TTL is 0 when the lease has expired.
  [[nodiscard]] absl::StatusOr<etcdserverpb::LeaseKeepAliveResponse> KeepAlive(
      int64_t lease);
  [[nodiscard]] absl::Status LeaseRevoke(int64_t lease);
  // Watches `key` from `from_revision` on the current member: true once it
  // is deleted, false after `max_wait` (or if the history was compacted, or
  // `cancel` was set), an error if the member cannot be reached (the next
  // call then goes to the next member). While it waits, *active holds its
  // context so another thread may TryCancel it (under *mu).
  [[nodiscard]] absl::StatusOr<bool> WatchForDelete(
      const std::string& key, int64_t from_revision,
      std::chrono::milliseconds max_wait, std::mutex* mu,
      grpc::ClientContext** active);

  // The member the client talks to now.
  std::string endpoint() const;

 private:
  template <typename Call>
  absl::Status WithFailover(const char* what, Call call);
  // WithFailover for a call that fills a response: `call(i, ctx, &resp)`
  // on a response cleared before each member is tried.
  template <typename Response, typename Call>
  absl::StatusOr<Response> Unary(const char* what, Call call);

  const std::vector<std::string> endpoints_;
  const std::chrono::milliseconds timeout_;
  std::vector<std::unique_ptr<etcdserverpb::KV::Stub>> kv_;
  std::vector<std::unique_ptr<etcdserverpb::Lease::Stub>> lease_;
  std::vector<std::unique_ptr<etcdserverpb::Watch::Stub>> watch_;
  std::atomic<size_t> current_{0};
};

// The key right after every key that starts with `prefix` (etcd's
// range_end for a prefix scan).
std::string PrefixEnd(const std::string& prefix);

}  // namespace ckpt::coordinator::etcd

#endif  // CKPT_COORDINATOR_ETCD_ETCD_CLIENT_H_
