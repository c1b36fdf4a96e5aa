// PrefetchRank (peer_fetch.h): one rank of a PREFETCH and its fallbacks.
#include "daemon/peer_fetch.h"

#include "absl/strings/str_cat.h"
#include "daemon/engine_util.h"
#include "daemon/replica_client.h"
#include "daemon/replica_service.h"

namespace ckpt::daemon {

namespace cv1 = ::ckpt::coord::v1;
namespace rv1 = ::ckpt::replica::v1;

// A peer that stops answering (SIGSTOPped, a dead link) fails the fetch
// after this long; the shared root is then read instead.
constexpr std::chrono::seconds kPeerFetchDeadline(120);

absl::Status PrefetchRank(Engine& engine, const coordinator::TlsFiles& tls,
                          const std::string& job, uint32_t world_size,
                          uint64_t step, uint32_t rank, const std::string& key,
                          const cv1::ShardSource* source,
                          std::optional<uint32_t> owner_uid,
                          const std::function<void(FallbackReport)>& fallback) {
  if (source != nullptr && !source->host().empty()) {
    absl::Status st;
    if (source->port() == 0 || source->port() > 65535) {
      st = absl::InvalidArgumentError(
          absl::StrCat("sources.port: ", source->port(), " is not a port"));
    } else {
      absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = ReplicaChannel(
          tls, source->node_id(), source->host(), source->port());
      st = channel.status();
      if (st.ok())
        st = engine.FetchFromPeer(
            job, world_size, step, rank, key, owner_uid,
            [&](const auto& dst_for) {
              rv1::GetRequest req;
              req.set_job(job);
              req.set_step(step);
              req.set_rank(rank);
              req.set_replica(source->replica());
              return GetReplica(
                  **channel, req, dst_for,
                  std::chrono::system_clock::now() + kPeerFetchDeadline);
            });
    }
    if (st.ok()) return st;
    const std::string copy = source->replica() ? "replica" : "peer";
    LogWarning(absl::StrCat("prefetch job ", job, " step ", step, " rank ",
                            rank, " from ", copy, " on ", source->node_id(),
                            ": ", st.message(),
                            key.empty() ? "" : "; reading the shared root"));
    FallbackReport f;
    f.job = job;
    f.step = step;
    f.rank = rank;
    // The coordinator knows the copies "memory", "file" and "object": a
    // peer's is memory, and the reason names whose.
    f.copy = "memory";
    f.reason =
        absl::StrCat(copy, " on ", source->node_id(), ": ", st.message());
    f.next_copy = key.empty() ? "" : "file";
    if (fallback) fallback(std::move(f));
    if (key.empty()) return st;
  }
  return engine.Prefetch(job, world_size, step, rank, key, owner_uid);
}

}  // namespace ckpt::daemon
