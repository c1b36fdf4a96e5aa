// NodeAgent (node_agent.h): carrying out the coordinator's orders —
// PREFETCH on threads of its own, the others acknowledged at once, each
// order run once however often it is sent — and handing the placement to
// the engine off the heartbeat thread.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator.grpc.pb.h"
#include "coordinator/client/channel.h"
#include "daemon/agent/node_agent.h"
#include "daemon/agent/node_agent_rpc.h"
#include "daemon/agent/peer_fetch.h"
#include "daemon/core/engine_util.h"
#include "storage/keys.h"
#include "util/retry.h"
#include "util/status.h"

namespace ckpt::daemon {

namespace cv1 = ::ckpt::coord::v1;

size_t NodeAgent::orders_remembered() {
  std::lock_guard<std::mutex> lock(mu_);
  return handled_.size();
}

size_t NodeAgent::prefetch_threads() {
  std::lock_guard<std::mutex> lock(mu_);
  return prefetchers_.size();
}

void NodeAgent::ReapOrders() {
  std::vector<std::thread> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint64_t id : prefetched_) {
      auto t = prefetchers_.find(id);
      if (t == prefetchers_.end()) continue;
      done.push_back(std::move(t->second));
      prefetchers_.erase(t);
    }
    prefetched_.clear();
    // Ids grow: the smallest are the oldest. One still running stays.
    for (auto it = handled_.begin();
         handled_.size() > options_.remembered_orders && it != handled_.end();)
      it = it->second ? handled_.erase(it) : std::next(it);
  }
  for (std::thread& t : done) t.join();  // each has returned or is returning
}

void NodeAgent::TakeOrders(const cv1::HeartbeatResponse& resp) {
  for (const cv1::Order& o : resp.orders()) {
    std::unique_lock<std::mutex> lock(mu_);
    auto [taken, fresh] = handled_.try_emplace(o.id(), false);
    if (!fresh) {
      // Carried out and acknowledged, yet sent again: the coordinator lost
      // the acknowledgement. Acknowledge again (a PREFETCH still running
      // acknowledges when done).
      if (taken->second &&
          std::find(acked_.begin(), acked_.end(), o.id()) == acked_.end()) {
        LogInfo(absl::StrCat("order ", o.id(),
                             " sent again: acknowledging it again"));
        acked_.push_back(o.id());
        kick_ = true;  // the plan waits for it: the next heartbeat now
      }
      continue;
    }
    LogInfo(absl::StrCat("order ", o.id(), " ", cv1::OrderKind_Name(o.kind()),
                         " job ", o.job(), " generation ", o.generation(),
                         " ranks ", absl::StrJoin(o.ranks(), ","),
                         o.has_step() ? absl::StrCat(" step ", o.step()) : ""));
    // Sources (peer replicas): one per rank; a rank with a peer source may
    // have no stored copy (its key "").
    const bool keyed =
        o.ranks_size() == o.shard_keys_size() ||
        (o.shard_keys_size() == 0 && o.sources_size() == o.ranks_size());
    if (o.kind() == cv1::PREFETCH && o.has_step() && keyed &&
        (o.sources_size() == 0 || o.sources_size() == o.ranks_size()) &&
        engine_) {
      std::vector<std::string> keys(o.shard_keys().begin(),
                                    o.shard_keys().end());
      keys.resize(o.ranks_size());
      if (auto running = prefetchers_.find(o.id());
          running != prefetchers_.end() && running->second.joinable())
        continue;  // forgotten, yet still running: it acknowledges when done
      if (o.sources_size() != 0) {
        // Registered before this heartbeat's answer is acknowledged (the
        // plan's RESTART with it, which lets the trainers start): their
        // OpenRestore of these shards waits for the fetch from then on,
        // instead of failing. A brief hold of the job table's lock (memory
        // only), with mu_ released.
        lock.unlock();
        engine_->BeginFetches(o.job(), o.step(),
                              {o.ranks().begin(), o.ranks().end()});
        lock.lock();
      }
      std::thread& t = prefetchers_[o.id()];
      t = std::thread(
          &NodeAgent::RunPrefetch, this, o.id(), o.job(), o.world_size(),
          o.step(), std::vector<uint32_t>(o.ranks().begin(), o.ranks().end()),
          std::move(keys),
          std::vector<cv1::ShardSource>(o.sources().begin(), o.sources().end()),
          o.has_owner_uid() ? std::optional<uint32_t>(o.owner_uid())
                            : std::nullopt);
    } else {
      if (o.kind() == cv1::PREFETCH)
        LogWarning(
            absl::StrCat("order ", o.id(), ": malformed PREFETCH ignored"));
      taken->second = true;
      acked_.push_back(o.id());
      // The plan (and the trainers, for a RESTART) waits for it: the next
      // heartbeat now, not an interval later.
      kick_ = true;
    }
  }
}

void NodeAgent::RunPrefetch(uint64_t order_id, std::string job,
                            uint32_t world_size, uint64_t step,
                            std::vector<uint32_t> ranks,
                            std::vector<std::string> keys,
                            std::vector<cv1::ShardSource> sources,
                            std::optional<uint32_t> owner_uid) {
  auto t0 = std::chrono::steady_clock::now();
  if (options_.hang_prefetch) {
    LogWarning(absl::StrCat("order ", order_id,
                            ": TEST-ONLY FAULT: the prefetch hangs"));
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return stopping_; });
    return;
  }
  // (TakeOrders registered the fetches: BeginFetches.)
  // Ranks load in parallel: each read is one stream of large direct I/Os.
  std::vector<std::thread> loaders;
  std::vector<absl::Status> results(ranks.size());
  const PeerFetchOptions peer_fetch = PeerFetch();
  for (size_t i = 0; i < ranks.size(); ++i)
    loaders.emplace_back([&, i] {
      // From a peer's memory when the order names one (peer_fetch.h).
      results[i] = PrefetchRank(
          *engine_, peer_fetch, job, world_size, step, ranks[i], keys[i],
          i < sources.size() ? &sources[i] : nullptr, owner_uid,
          [this](FallbackReport f) { ReportFallback(std::move(f)); });
      if (!sources.empty()) engine_->EndFetch(job, step, ranks[i]);
    });
  for (auto& t : loaders) t.join();
  for (size_t i = 0; i < ranks.size(); ++i)
    if (!results[i].ok())
      // The trainer's restore then reads the shared root itself or fails,
      // and its exit makes a new plan.
      LogWarning(absl::StrCat("prefetch job ", job, " step ", step, " rank ",
                              ranks[i], ": ", results[i].message()));
    else if (options_.replicas != nullptr)
      options_.replicas->Prefetched(job, step, ranks[i]);  // replicated on
  LogInfo(absl::StrCat(
      "order ", order_id, ": prefetched ", ranks.size(), " shards of job ", job,
      " step ", step, " in ",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count(),
      " s"));
  std::lock_guard<std::mutex> lock(mu_);
  // Gone when the node registered again meanwhile: the order died with the
  // old epoch, and the coordinator ignores its acknowledgement.
  if (auto taken = handled_.find(order_id); taken != handled_.end())
    taken->second = true;
  acked_.push_back(order_id);
  prefetched_.push_back(order_id);  // the heartbeat thread joins this one
  kick_ = true;                     // the plan waits for this acknowledgement
  cv_.notify_all();
}

PeerFetchOptions NodeAgent::PeerFetch() const {
  PeerFetchOptions o;
  o.tls = options_.tls;
  o.node_id = options_.node_id;
  o.transport = options_.replica_transport;
  if (NodeReplicas* r = options_.replicas)
    o.held = [r](const std::string& job, uint64_t step, uint32_t rank) {
      return r->Held(job, step, rank);
    };
  return o;
}

absl::StatusOr<cv1::ShardSourcesResponse> NodeAgent::SavedRankSource(
    const std::string& job, uint64_t step, uint32_t rank) {
  if (engine_ == nullptr)
    return absl::FailedPreconditionError("the node agent has not started");
  const uint64_t epoch = epoch_.load();
  if (epoch == 0)
    return absl::UnavailableError(
        "coordinator: this node is not registered (yet)");
  cv1::ShardSourcesRequest req;
  req.set_node_id(options_.node_id);
  req.set_epoch(epoch);
  req.set_job(job);
  req.set_step(step);
  req.add_ranks(rank);
  cv1::ShardSourcesResponse resp;
  grpc::Status s = rpc_->Invoke(&cv1::Coordinator::Stub::ShardSources, req,
                                &resp, options_.rpc_timeout);
  if (!s.ok())
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("coordinator: ", s.error_message()));
  // The answer is checked as any input: one entry, for the rank asked.
  if (resp.ranks_size() != 1 || resp.ranks(0).rank() != rank)
    return absl::DataLossError(
        absl::StrCat("coordinator: ShardSources answered ", resp.ranks_size(),
                     " ranks, not rank ", rank));
  if (resp.world_size() == 0 || rank >= resp.world_size())
    return absl::DataLossError(
        absl::StrCat("coordinator: world_size ", resp.world_size(), " of step ",
                     step, " does not hold rank ", rank));
  return resp;
}

absl::Status NodeAgent::FetchSavedRankFromPeers(const std::string& job,
                                                uint64_t step, uint32_t rank) {
  CKPT_ASSIGN_OR_RETURN(cv1::ShardSourcesResponse resp,
                        SavedRankSource(job, step, rank));
  const cv1::RankShardSource& src = resp.ranks(0);
  // The shard is kept as a PREFETCH's copy of a stored shard (this node
  // neither persists nor reports it): under its key in the shared root,
  // else under its owner's key.
  std::string key = src.key();
  if (key.empty() && !src.source().node_id().empty())
    key = storage::ShardKey(job, step, rank, src.source().node_id());
  const PeerFetchOptions peer_fetch = PeerFetch();
  return FetchFromPeers(*engine_, peer_fetch, job, resp.world_size(), step,
                        rank, key, src.source(),
                        resp.has_owner_uid()
                            ? std::optional<uint32_t>(resp.owner_uid())
                            : std::nullopt);
}

absl::StatusOr<RangedSlot> NodeAgent::FetchSavedRangesFromPeers(
    const std::string& job, uint64_t step, uint32_t rank,
    std::span<const ImageRange> ranges) {
  CKPT_ASSIGN_OR_RETURN(cv1::ShardSourcesResponse resp,
                        SavedRankSource(job, step, rank));
  const PeerFetchOptions peer_fetch = PeerFetch();
  return FetchRangesFromPeers(*engine_, peer_fetch, job, resp.world_size(),
                              step, rank, ranges, resp.ranks(0).source(),
                              resp.has_owner_uid()
                                  ? std::optional<uint32_t>(resp.owner_uid())
                                  : std::nullopt);
}

absl::StatusOr<std::string> NodeAgent::StepIndex(const std::string& job,
                                                 uint64_t step) {
  const uint64_t epoch = epoch_.load();
  if (epoch == 0)
    return absl::UnavailableError(
        "coordinator: this node is not registered (yet)");
  absl::MutexLock lock(&step_index_mu_);
  KeptStepIndex& kept = step_index_;
  const bool have = kept.job == job && kept.step == step;
  cv1::StepIndexRequest req;
  req.set_node_id(options_.node_id);
  req.set_epoch(epoch);
  req.set_job(job);
  req.set_step(step);
  if (have) req.set_known_content_digest(kept.content_digest);
  cv1::StepIndexResponse resp;
  grpc::Status s = rpc_->Invoke(&cv1::Coordinator::Stub::StepIndex, req, &resp,
                                kStepIndexTimeout);
  if (!s.ok())
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("coordinator: ", s.error_message()));
  if (resp.unchanged()) {
    if (!have || resp.content_digest() != kept.content_digest)
      return absl::DataLossError(
          "coordinator: StepIndex answered unchanged for an index this node "
          "does not hold");
    return kept.index;
  }
  kept = KeptStepIndex{job, step, resp.content_digest(), resp.index()};
  return std::move(*resp.mutable_index());
}

void NodeAgent::ApplyLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (!hosting_changed_) {
      cv_.wait_for(lock, std::chrono::milliseconds(200));
      continue;
    }
    hosting_changed_ = false;
    std::map<std::string, Hosting> now = hosting_;
    lock.unlock();
    if (engine_)
      for (auto& [job, h] : now)
        engine_->SetHostedRanks(job, h.ranks, h.keep_from);
    lock.lock();
  }
}

}  // namespace ckpt::daemon
