// The caller's side of the replica transport, by the cluster's choice
// (--replica-transport, doc/replicas.md "Transport"):
//   bulk  the offer (OfferPut / OfferGet) over the authenticated gRPC
//         channel, then the image's bytes over a plain TCP connection to
//         the holder's bulk port that presents the offer's one-time token
//         (replica_bulk.h), sent from and read straight into the slot in
//         large calls; the holder's verification (put) or the source's
//         check (get) comes back on that connection;
//   grpc  the streams Put / Get (replica_client.h): every byte inside the
//         channel's mutual TLS, so encrypted, at 2-7x the time.
// A holder from before the bulk path (a rolling upgrade: its gRPC answers
// UNIMPLEMENTED to the offer) is sent to and fetched from over grpc.
// Both verify the same way: a put is kept only once the holder verified it
// against the checksums the offer named; a get is verified by the caller
// (VerifyReplicaImage). Functions; thread-safe.
#ifndef CKPT_DAEMON_REPLICA_REPLICA_BULK_CLIENT_H_
#define CKPT_DAEMON_REPLICA_REPLICA_BULK_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "daemon/replica/replica_client.h"
#include "daemon/replica/replica_transport.h"
#include "replica.pb.h"

namespace ckpt::daemon {

// As PutReplica, over `transport`; `host` is the holder's (the channel's).
[[nodiscard]] absl::StatusOr<uint64_t> SendReplica(
    ReplicaTransport transport, grpc::Channel& channel, const std::string& host,
    const replica::v1::ShardCopy& copy, const char* image,
    const PutOptions& options);

// As GetReplica, over `transport`.
[[nodiscard]] absl::StatusOr<replica::v1::ShardCopy> FetchReplica(
    ReplicaTransport transport, grpc::Channel& channel, const std::string& host,
    const replica::v1::GetRequest& req,
    const std::function<absl::StatusOr<char*>(const replica::v1::ShardCopy&)>&
        dst_for,
    std::chrono::system_clock::time_point deadline);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_REPLICA_REPLICA_BULK_CLIENT_H_
