// PrefetchRank: one rank of a coordinator's PREFETCH order, from a peer's
// memory when the order names a source (doc/replicas.md), else from the
// shared root. The fallback ladder: a peer copy that cannot be fetched or
// does not verify is reported through `fallback` (the node agent's
// FALLBACK report; copy "memory", the reason naming the peer) and the
// shard is taken from the second holder the source names, if any, then
// read from the shared root when the step is stored there; when
// that fails too, the trainer's restore fails and its exit makes the
// coordinator plan an older step. A source that is this node's own replica
// store (the replacement holds the lost rank's copy itself) is copied from
// memory, not fetched over the network from itself. A source naming the
// save the plan chose (save_digests) refuses a copy of another save of the
// step as it refuses a damaged one. Blocking; thread-safe
// as the Engine.
#ifndef CKPT_DAEMON_AGENT_PEER_FETCH_H_
#define CKPT_DAEMON_AGENT_PEER_FETCH_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "coordinator.pb.h"
#include "coordinator/client/tls.h"
#include "daemon/engine/engine.h"
#include "daemon/replica/replica_bulk_client.h"
#include "daemon/replica/replica_store.h"

namespace ckpt::daemon {

struct PeerFetchOptions {
  coordinator::TlsFiles tls;  // this node's certificate, key and CA
  std::string node_id;        // this node: a source naming it is local
  ReplicaTransport transport = ReplicaTransport::kBulk;
  // This node's held replica of (job, step, rank), or null (no store).
  std::function<std::shared_ptr<const HeldReplica>(const std::string&, uint64_t,
                                                   uint32_t)>
      held;
};

// `source` may be null or name no host: the shared root (`key`) only.
[[nodiscard]] absl::Status PrefetchRank(
    Engine& engine, const PeerFetchOptions& peer, const std::string& job,
    uint32_t world_size, uint64_t step, uint32_t rank, const std::string& key,
    const coord::v1::ShardSource* source, std::optional<uint32_t> owner_uid,
    const std::function<void(FallbackReport)>& fallback);

// One saved rank of a step into this node's memory from the peers
// `source` names (the source, then its second; peer_fetch's checks: the
// copy verified, the save's digests), nothing else: no shared root, no
// fallback report. OK, NotFound when `source` names no peer, else the
// error of the last one tried, naming every peer tried and why it failed
// ("owner's slot on a (127.0.0.1:7001): ...; replica on b (...): ...").
[[nodiscard]] absl::Status FetchFromPeers(
    Engine& engine, const PeerFetchOptions& peer, const std::string& job,
    uint32_t world_size, uint64_t step, uint32_t rank, const std::string& key,
    const coord::v1::ShardSource& source, std::optional<uint32_t> owner_uid);

// The chunks of one saved rank that `ranges` of its image touch, from the
// peers `source` names (the source, then its second), verified against the
// save's digests the source names (doc/resharding.md, "Byte ranges from a
// peer"), into a slot held for one read. A source that is this node is
// skipped (its copy is read whole from memory). The error names every
// peer tried and why, as FetchFromPeers'.
[[nodiscard]] absl::StatusOr<RangedSlot> FetchRangesFromPeers(
    Engine& engine, const PeerFetchOptions& peer, const std::string& job,
    uint32_t world_size, uint64_t step, uint32_t rank,
    std::span<const ImageRange> ranges, const coord::v1::ShardSource& source,
    std::optional<uint32_t> owner_uid);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_AGENT_PEER_FETCH_H_
