#include "daemon/node_agent.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator.grpc.pb.h"
#include "coordinator/client/channel.h"
#include "coordinator/client/leader_channel.h"
#include "daemon/engine_util.h"
#include "util/retry.h"

namespace ckpt::daemon {

namespace cv1 = ::ckpt::coord::v1;

void ToReportProto(const ShardReport& report, cv1::ShardReport* out) {
  out->set_job(report.job);
  out->set_step(report.step);
  out->set_rank(report.rank);
  out->set_state(report.durable ? cv1::DURABLE : cv1::STAGED);
  out->set_bytes(report.bytes);
  out->set_checksum_digest(report.digest);
  out->set_staged_digest(report.staged_digest);
  out->set_owner_uid(report.owner_uid);
  out->set_key(report.key);
  if (report.generation) out->set_generation(*report.generation);
  if (report.failed) out->set_failed(true);
}

class NodeAgent::Rpc {
 public:
  // The options were validated (daemon/options.cc loads the TLS files once).
  Rpc(const std::string& targets, const coordinator::TlsFiles& tls)
      : client_(coordinator::CoordinatorClient::Create(targets, tls).value()) {}
  template <typename Req, typename Resp, typename Call>
  grpc::Status Invoke(Call call, const Req& req, Resp* resp,
                      std::chrono::milliseconds timeout) {
    return client_->Call(call, req, resp, timeout);
  }

 private:
  std::unique_ptr<coordinator::CoordinatorClient> client_;
};

namespace {

// The coordinator refuses this incarnation of the node: declared dead
// (fenced) or unknown after losing its state.
bool Fenced(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
         s.error_code() == grpc::StatusCode::NOT_FOUND;
}

}  // namespace

NodeAgent::NodeAgent(NodeAgentOptions options)
    : options_(std::move(options)),
      rpc_(std::make_unique<Rpc>(options_.coordinator, options_.tls)) {}

NodeAgent::~NodeAgent() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  if (reporter_.joinable()) reporter_.join();
  if (applier_.joinable()) applier_.join();
  for (auto& [id, t] : prefetchers_) t.join();
}

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

void NodeAgent::Start(Engine* engine) {
  engine_ = engine;
  if (!options_.shm_prefix.empty()) {
    BeaconMonitorOptions bo;
    bo.shm_prefix = options_.shm_prefix;
    beacons_ = std::make_unique<BeaconMonitor>(bo);
    beacons_->Start();
  }
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  reporter_ = std::thread([this] { ReportLoop(); });
  applier_ = std::thread([this] { ApplyLoop(); });
}

void NodeAgent::Report(const ShardReport& report) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t epoch = epoch_.load();
  if (epoch == 0) {
    // Committed while this node has no epoch: fenced (declared dead, its
    // ranks' generation given up) or not registered yet. Tagging it with
    // the next epoch would count the abandoned generation's shard.
    if (reports_dropped_.fetch_add(1) == dropped_logged_)
      LogWarning(absl::StrCat(
          "node ", options_.node_id,
          " has no epoch (fenced or not registered): ", "not reporting job ",
          report.job, " step ", report.step, " rank ", report.rank,
          " (nor later ones until it registers)"));
    return;
  }
  reports_.push_back(Queued{report, epoch});
  cv_.notify_all();
}

void NodeAgent::ReportFallback(FallbackReport report) {
  // The coordinator refuses an unprintable or long reason: keep what it
  // can show rather than lose the report.
  constexpr size_t kMaxReasonBytes = 512;
  if (report.reason.size() > kMaxReasonBytes)
    report.reason.resize(kMaxReasonBytes);
  for (char& c : report.reason)
    if (c < 0x20 || c > 0x7e) c = '?';
  std::lock_guard<std::mutex> lock(mu_);
  if (fallbacks_.size() >= std::max<size_t>(options_.max_queued_fallbacks, 1)) {
    const FallbackReport& old = fallbacks_.front().report;
    LogWarning(absl::StrCat("dropping the fallback report of job ", old.job,
                            " step ", old.step, " rank ", old.rank,
                            ": more than ", options_.max_queued_fallbacks,
                            " waiting"));
    fallbacks_.pop_front();
    ++fallbacks_dropped_;
  }
  fallbacks_.push_back(QueuedFallback{
      std::move(report), std::chrono::steady_clock::now(), ++fallback_ids_});
  cv_.notify_all();
}

void NodeAgent::SendFallbacksLocked(std::unique_lock<std::mutex>& lock) {
  while (!fallbacks_.empty() && !stopping_) {
    const auto now = std::chrono::steady_clock::now();
    const FallbackReport& f = fallbacks_.front().report;
    if (now - fallbacks_.front().queued > options_.fallback_ttl) {
      LogWarning(absl::StrCat("dropping the fallback report of job ", f.job,
                              " step ", f.step, " rank ", f.rank,
                              ": not accepted by the coordinator within ",
                              options_.fallback_ttl.count(), " ms"));
      fallbacks_.pop_front();
      ++fallbacks_dropped_;
      continue;
    }
    const uint64_t epoch = epoch_.load();
    if (now < next_fallback_try_ || epoch == 0)
      return;  // backing off, or (re-)registering
    const uint64_t id = fallbacks_.front().id;
    cv1::ReportFallbackRequest req;
    req.set_node_id(options_.node_id);
    req.set_epoch(epoch);
    req.set_job(f.job);
    req.set_step(f.step);
    req.set_rank(f.rank);
    req.set_copy(f.copy);
    req.set_reason(f.reason);
    if (f.next_step) req.set_next_step(*f.next_step);
    req.set_next_copy(f.next_copy);
    lock.unlock();
    cv1::ReportFallbackResponse resp;
    grpc::Status s = rpc_->Invoke(&cv1::Coordinator::Stub::ReportFallback, req,
                                  &resp, options_.rpc_timeout);
    lock.lock();
    // ReportFallback may have dropped it meanwhile (past the bound).
    const bool still_front = !fallbacks_.empty() && fallbacks_.front().id == id;
    if (s.ok() || !(IsTransient(s) || Fenced(s))) {
      if (s.ok()) {
        ++fallbacks_sent_;
      } else {
        LogWarning(absl::StrCat("fallback report of job ", req.job(), " step ",
                                req.step(), " rank ", req.rank(),
                                " refused: ", s.error_message()));
        ++fallbacks_dropped_;
      }
      if (still_front) fallbacks_.pop_front();
      fallback_backoff_ = std::chrono::milliseconds(0);
      continue;
    }
    // Unreachable, shedding load, or this epoch or placement refused (the
    // heartbeat thread registers again; a plan moves ranks): later.
    fallback_backoff_ = std::min(
        std::max(fallback_backoff_ * 2, std::chrono::milliseconds(100)),
        std::chrono::milliseconds(5000));
    next_fallback_try_ = std::chrono::steady_clock::now() + fallback_backoff_;
    return;
  }
}

bool NodeAgent::WaitFor(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, d, [&] { return stopping_ || kick_; });
  kick_ = false;
  return !stopping_;
}

void NodeAgent::HeartbeatLoop() {
  std::chrono::milliseconds interval(250);
  bool reachable = true;
  auto note = [&](const grpc::Status& s) {
    if (s.ok() && !reachable)
      LogInfo("coordinator " + options_.coordinator + " reachable again");
    if (!s.ok() && IsUnreachable(s) && reachable)
      LogWarning("coordinator " + options_.coordinator +
                 " unreachable: " + s.error_message() + "; retrying");
    if (s.ok() || IsUnreachable(s)) reachable = s.ok();
  };
  do {
    if (epoch_.load() == 0) {
      cv1::RegisterNodeRequest req;
      req.set_node_id(options_.node_id);
      req.set_address(options_.address);
      req.set_capacity(options_.capacity);
      req.set_spare(options_.spare);
      *req.mutable_health_report() = options_.health_report;
      cv1::RegisterNodeResponse resp;
      grpc::Status s = rpc_->Invoke(&cv1::Coordinator::Stub::RegisterNode, req,
                                    &resp, options_.rpc_timeout);
      note(s);
      if (!s.ok()) {
        // ALREADY_EXISTS: our previous incarnation has not timed out yet.
        if (!IsUnreachable(s))
          LogWarning(absl::StrCat("register node ", options_.node_id, ": ",
                                  s.error_message()));
        continue;
      }
      interval = std::chrono::milliseconds(
          std::max<uint32_t>(resp.heartbeat_timeout_ms() / 5, 20));
      {
        std::lock_guard<std::mutex> lock(mu_);
        acked_.clear();
        handled_.clear();
        dropped_logged_ =
            reports_dropped_.load();  // the next drop is worth a line again
        epoch_ = resp.epoch();
        NoteIncarnationLocked(resp.incarnation());
      }
      LogInfo(absl::StrCat("node ", options_.node_id, " registered with ",
                           options_.coordinator, " at epoch ", resp.epoch(),
                           options_.spare ? " (spare)" : ""));
    }
    cv1::HeartbeatRequest req;
    req.set_node_id(options_.node_id);
    req.set_epoch(epoch_.load());
    {
      std::lock_guard<std::mutex> lock(mu_);
      *req.mutable_acked_order_ids() = {acked_.begin(), acked_.end()};
    }
    if (beacons_)
      for (auto& p : beacons_->Snapshot(BeaconMonitor::Clock::now()))
        *req.add_progress() = std::move(p);
    cv1::HeartbeatResponse resp;
    grpc::Status s =
        rpc_->Invoke(&cv1::Coordinator::Stub::Heartbeat, req, &resp,
                     std::min(options_.rpc_timeout, interval * 4));
    note(s);
    if (!s.ok()) {
      if (Fenced(s)) {
        LogWarning(absl::StrCat("node ", options_.node_id, " fenced at epoch ",
                                req.epoch(), ": ", s.error_message(),
                                "; registering again"));
        std::lock_guard<std::mutex> lock(mu_);
        epoch_ = 0;
        // Nothing committed under the fenced epoch may count.
        std::erase_if(reports_,
                      [&](const Queued& q) { return q.epoch == req.epoch(); });
        std::erase_if(soft_, [&](const auto& kv) {
          return kv.second.staged.epoch == req.epoch();
        });
      }
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Acknowledged ones are gone from the coordinator's queue now.
      std::erase_if(acked_, [&](uint64_t id) {
        for (uint64_t a : req.acked_order_ids())
          if (a == id) return true;
        return false;
      });
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      NoteIncarnationLocked(resp.incarnation());
      for (const cv1::Assignment& a : resp.assignments()) {
        // Committed steps need no re-sending after a coordinator restart.
        if (a.has_last_good())
          std::erase_if(soft_, [&](const auto& kv) {
            return std::get<0>(kv.first) == a.job() &&
                   std::get<1>(kv.first) <= a.last_good_step();
          });
        // The oldest step the job may still restore; 0 keeps everything.
        uint64_t keep = a.has_last_good() ? a.last_good_step() : 0;
        if (a.has_restore_step()) keep = std::min(keep, a.restore_step());
        Hosting h{{a.ranks().begin(), a.ranks().end()}, keep};
        Hosting& cur = hosting_[a.job()];
        if (cur.ranks != h.ranks || cur.keep_from != h.keep_from) {
          cur = std::move(h);
          hosting_changed_ = true;
          cv_.notify_all();
        }
      }
    }
    if (beacons_) {
      std::map<std::string, std::vector<uint32_t>> hosted;
      for (const cv1::Assignment& a : resp.assignments())
        hosted[a.job()].assign(a.ranks().begin(), a.ranks().end());
      beacons_->SetHosted(hosted);
    }
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
        }
        continue;
      }
      LogInfo(
          absl::StrCat("order ", o.id(), " ", cv1::OrderKind_Name(o.kind()),
                       " job ", o.job(), " generation ", o.generation(),
                       " ranks ", absl::StrJoin(o.ranks(), ","),
                       o.has_step() ? absl::StrCat(" step ", o.step()) : ""));
      if (o.kind() == cv1::PREFETCH && o.has_step() &&
          o.ranks_size() == o.shard_keys_size() && engine_) {
        std::thread& t = prefetchers_[o.id()];
        if (t.joinable())
          continue;  // forgotten, yet still running: it acknowledges when done
        t = std::thread(
            &NodeAgent::RunPrefetch, this, o.id(), o.job(), o.world_size(),
            o.step(), std::vector<uint32_t>(o.ranks().begin(), o.ranks().end()),
            std::vector<std::string>(o.shard_keys().begin(),
                                     o.shard_keys().end()),
            o.has_owner_uid() ? std::optional<uint32_t>(o.owner_uid())
                              : std::nullopt);
      } else {
        if (o.kind() == cv1::PREFETCH)
          LogWarning(
              absl::StrCat("order ", o.id(), ": malformed PREFETCH ignored"));
        taken->second = true;
        acked_.push_back(o.id());
      }
    }
    ReapOrders();
  } while (WaitFor(interval));
}

void NodeAgent::RunPrefetch(uint64_t order_id, std::string job,
                            uint32_t world_size, uint64_t step,
                            std::vector<uint32_t> ranks,
                            std::vector<std::string> keys,
                            std::optional<uint32_t> owner_uid) {
  auto t0 = std::chrono::steady_clock::now();
  // Ranks load in parallel: each read is one stream of large direct I/Os.
  std::vector<std::thread> loaders;
  std::vector<absl::Status> results(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i)
    loaders.emplace_back([&, i] {
      results[i] = engine_->Prefetch(job, world_size, step, ranks[i], keys[i],
                                     owner_uid);
    });
  for (auto& t : loaders) t.join();
  for (size_t i = 0; i < ranks.size(); ++i)
    if (!results[i].ok())
      // The trainer's restore then reads the shared root itself or fails,
      // and its exit makes a new plan.
      LogWarning(absl::StrCat("prefetch job ", job, " step ", step, " rank ",
                              ranks[i], ": ", results[i].message()));
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

void NodeAgent::NoteIncarnationLocked(uint64_t incarnation) {
  if (incarnation == 0 || incarnation == incarnation_) return;
  bool restarted = incarnation_ != 0;
  incarnation_ = incarnation;
  if (!restarted || soft_.empty()) return;
  // The new coordinator lost every per-rank report: send ours again, ahead
  // of anything queued (a queued DURABLE needs its STAGED first).
  std::deque<Queued> again;
  for (const auto& [key, sent] : soft_) {
    if (sent.staged.epoch != epoch_.load()) continue;
    again.push_back(sent.staged);
    if (sent.durable) again.push_back(*sent.durable);
  }
  reports_resent_ += again.size();
  LogInfo(absl::StrCat("coordinator restarted (incarnation ", incarnation,
                       "): sending ", again.size(),
                       " reports of uncommitted steps again"));
  reports_.insert(reports_.begin(), again.begin(), again.end());
  cv_.notify_all();
}

void NodeAgent::ReportLoop() {
  constexpr size_t kMaxBatch = 4096;
  const auto kGather =
      std::chrono::milliseconds(20);  // the other ranks' reports of a step
  auto backoff = std::chrono::milliseconds(0);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    // Fallbacks are rare and small: each goes out before the next batch.
    SendFallbacksLocked(lock);
    if (reports_.empty()) {
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      continue;
    }
    if (backoff.count() == 0) {
      cv_.wait_for(lock, kGather, [&] { return stopping_; });
    } else {
      // Exponential backoff with jitter, so that shed nodes do not return
      // together.
      auto jitter =
          std::chrono::milliseconds(std::rand() % (backoff.count() / 2 + 1));
      cv_.wait_for(lock, backoff / 2 + jitter, [&] { return stopping_; });
    }
    if (stopping_ || reports_.empty()) continue;
    // One call: the queued reports of the front's epoch, in order.
    const uint64_t epoch = reports_.front().epoch;
    std::vector<Queued> batch;
    for (const Queued& q : reports_) {
      if (q.epoch != epoch || batch.size() == kMaxBatch) break;
      batch.push_back(q);
    }
    lock.unlock();
    cv1::ReportShardsRequest req;
    req.set_node_id(options_.node_id);
    req.set_epoch(epoch);
    for (const Queued& q : batch) {
      ToReportProto(q.report, req.add_reports());
    }
    cv1::ReportShardsResponse resp;
    grpc::Status s = rpc_->Invoke(&cv1::Coordinator::Stub::ReportShards, req,
                                  &resp, options_.rpc_timeout);
    lock.lock();
    if (IsTransient(s)) {
      ++report_retries_;
      backoff = std::min(std::max(backoff * 2, std::chrono::milliseconds(50)),
                         std::chrono::milliseconds(2000));
      continue;  // the same reports again, order kept: never dropped
    }
    backoff = std::chrono::milliseconds(0);
    if (!s.ok())
      LogWarning(absl::StrCat("report of ", batch.size(), " shards (epoch ",
                              epoch, "): ", s.error_message()));
    if (s.ok() && resp.results_size() != static_cast<int>(batch.size()))
      LogWarning(absl::StrCat("report: ", resp.results_size(), " results for ",
                              batch.size(), " reports"));
    if (s.ok() && incarnation_ != 0 && resp.incarnation() != incarnation_) {
      // A restarted coordinator answered before any heartbeat told us: its
      // refusals ("never staged") are ours to fix. Send the soft state
      // first, then this batch again.
      NoteIncarnationLocked(resp.incarnation());
      continue;
    }
    // The fence (or a re-send) may have changed the queue meanwhile: take
    // out exactly the reports sent, keep those to retry.
    std::deque<Queued> retry;
    for (size_t i = 0; i < batch.size(); ++i) {
      const Queued& q = batch[i];
      auto same = [&](const Queued& o) {
        return o.epoch == q.epoch && o.report.job == q.report.job &&
               o.report.step == q.report.step &&
               o.report.rank == q.report.rank &&
               o.report.durable == q.report.durable;
      };
      auto it = std::find_if(reports_.begin(), reports_.end(), same);
      if (it == reports_.end()) continue;
      reports_.erase(it);
      if (!s.ok() || i >= static_cast<size_t>(resp.results_size())) continue;
      const cv1::ReportResult& r = resp.results(static_cast<int>(i));
      const auto code = static_cast<absl::StatusCode>(r.code());
      if (IsTransient(code)) {
        retry.push_back(q);
        continue;
      }
      if (code != absl::StatusCode::kOk) {
        LogWarning(absl::StrCat(
            "report ", q.report.durable ? "durable" : "staged", " job ",
            q.report.job, " step ", q.report.step, " rank ", q.report.rank,
            " (epoch ", q.epoch, "): ", r.message()));
        continue;
      }
      Sent& sent = soft_[{q.report.job, q.report.step, q.report.rank}];
      if (q.report.durable)
        sent.durable = q;
      else
        sent = Sent{q, std::nullopt};
      if (r.durable_everywhere()) {
        std::erase_if(soft_, [&](const auto& kv) {
          return std::get<0>(kv.first) == q.report.job &&
                 std::get<1>(kv.first) <= q.report.step;
        });
      }
    }
    if (!retry.empty()) {
      ++report_retries_;
      backoff = std::chrono::milliseconds(100);
      reports_.insert(reports_.begin(), retry.begin(), retry.end());
    }
    if (s.ok()) NoteIncarnationLocked(resp.incarnation());
  }
}

}  // namespace ckpt::daemon
