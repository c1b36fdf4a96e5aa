// PrefetchRank (peer_fetch.h): one rank of a PREFETCH and its fallbacks.
#include "daemon/agent/peer_fetch.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/core/engine_util.h"
#include "daemon/replica/replica_client.h"
#include "daemon/replica/replica_service.h"
#include "replica.grpc.pb.h"
#include "util/status.h"

namespace ckpt::daemon {

namespace cv1 = ::ckpt::coord::v1;
namespace rv1 = ::ckpt::replica::v1;

// A peer that stops answering (SIGSTOPped, a dead link) fails the fetch
// after this long; the shared root is then read instead.
constexpr std::chrono::seconds kPeerFetchDeadline(120);

namespace {

// The copy from this node's own replica store into the slot.
absl::StatusOr<rv1::ShardCopy> CopyHeld(
    const HeldReplica& held,
    const std::function<absl::StatusOr<char*>(const rv1::ShardCopy&)>&
        dst_for) {
  CKPT_ASSIGN_OR_RETURN(char* dst, dst_for(held.copy));
  std::memcpy(dst, held.data(), held.copy.image_bytes());
  return held.copy;
}

// The peers `source` names (the first, then its second), in that order;
// NotFound when it names none.
absl::StatusOr<std::vector<const cv1::ShardSource*>> PeersOf(
    const cv1::ShardSource& source, const std::string& job, uint64_t step,
    uint32_t rank) {
  std::vector<const cv1::ShardSource*> peers;
  if (!source.host().empty()) {
    peers.push_back(&source);
    if (source.has_second() && !source.second().host().empty())
      peers.push_back(&source.second());
  }
  if (peers.empty())
    return absl::NotFoundError(absl::StrCat("no live node holds job '", job,
                                            "' step ", step, " rank ", rank,
                                            " in memory"));
  return peers;
}

// One peer source's copy into the rank's slot: OK, or why not.
absl::Status FetchFrom(Engine& engine, const PeerFetchOptions& peer,
                       const std::string& job, uint32_t world_size,
                       uint64_t step, uint32_t rank, const std::string& key,
                       const cv1::ShardSource& source,
                       std::optional<uint32_t> owner_uid) {
  const std::vector<uint64_t> save_digests(source.save_digests().begin(),
                                           source.save_digests().end());
  if (source.port() == 0 || source.port() > 65535)
    return absl::InvalidArgumentError(
        absl::StrCat("sources.port: ", source.port(), " is not a port"));
  if (std::shared_ptr<const HeldReplica> mine =
          source.replica() && source.node_id() == peer.node_id && peer.held
              ? peer.held(job, step, rank)
              : nullptr) {
    // This node holds the copy itself: from its memory, verified again
    // in the slot as any fetched copy.
    absl::Status st = engine.FetchFromPeer(
        job, world_size, step, rank, key, owner_uid,
        [&](const auto& dst_for) { return CopyHeld(*mine, dst_for); },
        save_digests);
    if (st.ok())
      LogInfo(absl::StrCat("job ", job, " step ", step, " rank ", rank,
                           ": taken from this node's own replica"));
    return st;
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      ReplicaChannel(peer.tls, source.node_id(), source.host(), source.port());
  CKPT_RETURN_IF_ERROR(channel.status());
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status st = engine.FetchFromPeer(
      job, world_size, step, rank, key, owner_uid,
      [&](const auto& dst_for) {
        rv1::GetRequest req;
        req.set_job(job);
        req.set_step(step);
        req.set_rank(rank);
        req.set_replica(source.replica());
        return FetchReplica(
            peer.transport, **channel, source.host(), req, dst_for,
            std::chrono::system_clock::now() + kPeerFetchDeadline);
      },
      save_digests);
  if (st.ok())
    LogInfo(absl::StrCat(
        "job ", job, " step ", step, " rank ", rank, " fetched from ",
        source.node_id(), " over ", ReplicaTransportName(peer.transport),
        " in ",
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count(),
        " s (slot, transfer, verification)"));
  return st;
}

}  // namespace

absl::Status FetchFromPeers(Engine& engine, const PeerFetchOptions& peer,
                            const std::string& job, uint32_t world_size,
                            uint64_t step, uint32_t rank,
                            const std::string& key,
                            const cv1::ShardSource& source,
                            std::optional<uint32_t> owner_uid) {
  CKPT_ASSIGN_OR_RETURN(std::vector<const cv1::ShardSource*> peers,
                        PeersOf(source, job, step, rank));
  std::vector<std::string> tried;
  absl::Status st;
  for (const cv1::ShardSource* from : peers) {
    st = FetchFrom(engine, peer, job, world_size, step, rank, key, *from,
                   owner_uid);
    if (st.ok()) {
      LogInfo(absl::StrCat("job ", job, " step ", step, " saved rank ", rank,
                           ": from the ",
                           from->replica() ? "replica" : "owner's slot", " on ",
                           from->node_id(), " for a restore"));
      return st;
    }
    tried.push_back(absl::StrCat(from->replica() ? "replica" : "owner's slot",
                                 " on ", from->node_id(), " (", from->host(),
                                 ":", from->port(), "): ", st.message()));
  }
  return absl::Status(st.code(), absl::StrJoin(tried, "; "));
}

absl::StatusOr<RangedSlot> FetchRangesFromPeers(
    Engine& engine, const PeerFetchOptions& peer, const std::string& job,
    uint32_t world_size, uint64_t step, uint32_t rank,
    std::span<const ImageRange> ranges, const cv1::ShardSource& source,
    std::optional<uint32_t> owner_uid) {
  CKPT_ASSIGN_OR_RETURN(std::vector<const cv1::ShardSource*> peers,
                        PeersOf(source, job, step, rank));
  std::vector<std::string> tried;
  absl::Status st;
  for (const cv1::ShardSource* from : peers) {
    const std::string name = absl::StrCat(
        from->replica() ? "replica" : "owner's slot", " on ", from->node_id(),
        " (", from->host(), ":", from->port(), ")");
    absl::StatusOr<RangedSlot> got = [&]() -> absl::StatusOr<RangedSlot> {
      if (from->port() == 0 || from->port() > 65535)
        return absl::InvalidArgumentError(
            absl::StrCat("sources.port: ", from->port(), " is not a port"));
      if (from->node_id() == peer.node_id)
        return absl::FailedPreconditionError(
            "this node's own copy: read whole from its memory");
      CKPT_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                            ReplicaChannel(peer.tls, from->node_id(),
                                           from->host(), from->port()));
      const std::vector<uint64_t> digests(from->save_digests().begin(),
                                          from->save_digests().end());
      auto fetch =
          [&](const std::function<absl::Status(rv1::RangeChunk&)>& on_message)
          -> absl::Status {
        auto stub = rv1::Replica::NewStub(channel);
        rv1::RangeRequest req;
        req.set_job(job);
        req.set_step(step);
        req.set_rank(rank);
        req.set_replica(from->replica());
        for (const ImageRange& r : ranges) {
          req.add_offsets(r.offset);
          req.add_lengths(r.length);
        }
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + kPeerFetchDeadline);
        std::unique_ptr<grpc::ClientReader<rv1::RangeChunk>> reader =
            stub->GetRanges(&ctx, req);
        rv1::RangeChunk m;
        absl::Status bad;
        while (reader->Read(&m)) {
          bad = on_message(m);
          if (!bad.ok()) {
            ctx.TryCancel();
            while (reader->Read(&m)) {
            }
            break;
          }
        }
        const grpc::Status gs = reader->Finish();
        if (!bad.ok()) return bad;
        if (!gs.ok())
          return absl::Status(static_cast<absl::StatusCode>(gs.error_code()),
                              gs.error_message());
        return absl::OkStatus();
      };
      return engine.FetchRangesFromPeer(job, world_size, step, rank, owner_uid,
                                        ranges, fetch, digests);
    }();
    if (got.ok()) {
      LogInfo(absl::StrCat("job ", job, " step ", step, " saved rank ", rank,
                           ": from the ", name, " for a restore, ",
                           got->wire_bytes, " of ", got->image_bytes,
                           " bytes (ranges)"));
      return got;
    }
    st = got.status();
    tried.push_back(absl::StrCat(name, ": ", st.message()));
    LogWarning(absl::StrCat("job ", job, " step ", step, " saved rank ", rank,
                            ": ranges from the ", tried.back()));
  }
  return absl::Status(st.code(), absl::StrJoin(tried, "; "));
}

absl::Status PrefetchRank(Engine& engine, const PeerFetchOptions& peer,
                          const std::string& job, uint32_t world_size,
                          uint64_t step, uint32_t rank, const std::string& key,
                          const cv1::ShardSource* source,
                          std::optional<uint32_t> owner_uid,
                          const std::function<void(FallbackReport)>& fallback) {
  // The peers to try in order: the source, then the second holder it
  // names (one level: a second's own second is not read).
  std::vector<const cv1::ShardSource*> peers;
  if (source != nullptr && !source->host().empty()) {
    peers.push_back(source);
    if (source->has_second() && !source->second().host().empty())
      peers.push_back(&source->second());
  }
  absl::Status st;
  for (size_t i = 0; i < peers.size(); ++i) {
    const cv1::ShardSource& from = *peers[i];
    st = FetchFrom(engine, peer, job, world_size, step, rank, key, from,
                   owner_uid);
    if (st.ok()) return st;
    const bool next_peer = i + 1 < peers.size();
    const std::string copy = from.replica() ? "replica" : "peer";
    LogWarning(absl::StrCat(
        "prefetch job ", job, " step ", step, " rank ", rank, " from ", copy,
        " on ", from.node_id(), ": ", st.message(),
        next_peer
            ? absl::StrCat("; trying the copy on ", peers[i + 1]->node_id())
        : key.empty() ? ""
                      : "; reading the shared root"));
    FallbackReport f;
    f.job = job;
    f.step = step;
    f.rank = rank;
    // The coordinator knows the copies "memory", "file" and "object": a
    // peer's is memory, and the reason names whose.
    f.copy = "memory";
    f.reason = absl::StrCat(copy, " on ", from.node_id(), ": ", st.message());
    f.next_copy = next_peer ? "memory" : key.empty() ? "" : "file";
    if (fallback) fallback(std::move(f));
  }
  if (!peers.empty() && key.empty()) return st;
  return engine.Prefetch(job, world_size, step, rank, key, owner_uid);
}

}  // namespace ckpt::daemon
