// PrefetchRank: one rank of a coordinator's PREFETCH order, from a peer's
// memory when the order names a source (doc/replicas.md), else from the
// shared root. The fallback ladder: a peer copy that cannot be fetched or
// does not verify is reported through `fallback` (the node agent's
// FALLBACK report; copy "memory", the reason naming the peer) and the
// shard is read from the shared root when the step is stored there; when
// that fails too, the trainer's restore fails and its exit makes the
// coordinator plan an older step. Blocking; thread-safe as the Engine.
#ifndef CKPT_DAEMON_PEER_FETCH_H_
#define CKPT_DAEMON_PEER_FETCH_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "coordinator.pb.h"
#include "coordinator/client/tls.h"
#include "daemon/engine.h"

namespace ckpt::daemon {

// `source` may be null or name no host: the shared root (`key`) only.
// `tls`: this node's certificate, key and CA (or plaintext).
[[nodiscard]] absl::Status PrefetchRank(
    Engine& engine, const coordinator::TlsFiles& tls, const std::string& job,
    uint32_t world_size, uint64_t step, uint32_t rank, const std::string& key,
    const coord::v1::ShardSource* source, std::optional<uint32_t> owner_uid,
    const std::function<void(FallbackReport)>& fallback);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PEER_FETCH_H_
