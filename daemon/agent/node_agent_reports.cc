// NodeAgent (node_agent.h): shard reports — queued under the epoch they
// were committed in, sent in batches with backoff, kept as soft state and
// sent again to a restarted coordinator.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckpt.pb.h"
#include "coordinator.grpc.pb.h"
#include "coordinator/client/channel.h"
#include "daemon/agent/node_agent.h"
#include "daemon/agent/node_agent_rpc.h"
#include "daemon/core/engine_util.h"
#include "daemon/core/peer_creds.h"
#include "storage/layout_merge.h"
#include "util/log.h"
#include "util/retry.h"

namespace ckpt::daemon {

namespace cv1 = ::ckpt::coord::v1;

void ToReportProto(const ShardReport& report, cv1::ShardReport* out) {
  out->set_job(report.job);
  out->set_step(report.step);
  out->set_rank(report.rank);
  out->set_state(report.replicated ? cv1::REPLICATED
                 : report.durable  ? cv1::DURABLE
                                   : cv1::STAGED);
  if (report.replicated) out->set_source_node(report.source_node);
  out->set_bytes(report.bytes);
  out->set_checksum_digest(report.digest);
  out->set_staged_digest(report.staged_digest);
  out->set_owner_uid(report.owner_uid);
  out->set_key(report.key);
  if (report.generation) out->set_generation(*report.generation);
  // An age, taken as it is sent (a queued report ages while it waits).
  if (report.trainer_started_ms > 0)
    out->set_trainer_age_ms(static_cast<uint64_t>(
        std::max<int64_t>(BootClockMs() - report.trainer_started_ms, 0)));
  if (report.failed) out->set_failed(true);
  if (report.durable && !report.layout_index.empty())
    out->set_layout_index(report.layout_index);
}

void NodeAgent::Report(const ShardReport& shard) {
  // The rank's layout index, built here without the engine's lock or
  // ours; the metas go (the report is kept until its step commits).
  ShardReport report = shard;
  report.metas.reset();
  if (shard.durable && shard.metas && shard.world_size != 0) {
    absl::StatusOr<std::string> index =
        storage::RankLayoutIndex(shard.world_size, shard.rank, *shard.metas);
    if (index.ok())
      report.layout_index = std::move(*index);
    else
      LogWarning(absl::StrCat(
          "layout index of job ", shard.job, " step ", shard.step, " rank ",
          shard.rank, ": ", index.status().message(), "; reported without it"));
  }
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

void NodeAgent::NoteIncarnationLocked(uint64_t incarnation) {
  if (incarnation == 0 || incarnation == incarnation_) return;
  bool restarted = incarnation_ != 0;
  incarnation_ = incarnation;
  if (!restarted || (soft_.empty() && soft_replicas_.empty())) return;
  // The new coordinator lost every per-rank report: send ours again, ahead
  // of anything queued (a queued DURABLE needs its STAGED first).
  std::deque<Queued> again;
  for (const auto& [key, sent] : soft_) {
    if (sent.staged.epoch != epoch_.load()) continue;
    again.push_back(sent.staged);
    if (sent.durable) again.push_back(*sent.durable);
  }
  for (auto& [key, held] : soft_replicas_) {
    held.epoch = epoch_.load();  // a replica is not tied to an epoch
    again.push_back(held);
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
  constexpr size_t kMaxBatchIndexBytes = 32 << 20;
  const auto kGather =
      std::chrono::milliseconds(20);  // the other ranks' reports of a step
  auto backoff = std::chrono::milliseconds(0);
  auto told = std::chrono::milliseconds(0);  // a refusal's retry-after
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    // Fallbacks are rare and small: each goes out before the next batch.
    SendFallbacksLocked(lock);
    if (reports_.empty()) {
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      continue;
    }
    if (told.count() > 0) {
      cv_.wait_for(lock, told, [&] { return stopping_; });
    } else if (backoff.count() == 0) {
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
    size_t index_bytes = 0;
    for (const Queued& q : reports_) {
      if (q.epoch != epoch || batch.size() == kMaxBatch) break;
      // The coordinator takes requests up to 64 MiB: the ranks' layout
      // indexes go in batches of at most kMaxBatchIndexBytes.
      index_bytes += q.report.layout_index.size();
      if (!batch.empty() && index_bytes > kMaxBatchIndexBytes) break;
      batch.push_back(q);
    }
    // The coordinator this batch is built for: a restart noticed by the
    // heartbeat thread while the call is out is still this batch's to fix.
    const uint64_t sent_to = incarnation_;
    lock.unlock();
    cv1::ReportShardsRequest req;
    req.set_node_id(options_.node_id);
    req.set_epoch(epoch);
    for (const Queued& q : batch) {
      ToReportProto(q.report, req.add_reports());
    }
    cv1::ReportShardsResponse resp;
    grpc::Status s =
        rpc_->InvokeRelayed(&cv1::Coordinator::Stub::ReportShards, req, &resp,
                            options_.rpc_timeout, options_.rpc_timeout);
    lock.lock();
    if (IsTransient(s)) {
      ++report_retries_;
      backoff = std::min(std::max(backoff * 2, std::chrono::milliseconds(50)),
                         std::chrono::milliseconds(2000));
      // The coordinator's own jittered wait, when it says one.
      told = std::chrono::milliseconds(std::max(RetryAfterMs(s), 0));
      continue;  // the same reports again, order kept: never dropped
    }
    backoff = told = std::chrono::milliseconds(0);
    if (!s.ok())
      LogWarning(absl::StrCat("report of ", batch.size(), " shards (epoch ",
                              epoch, "): ", s.error_message()));
    if (s.ok() && resp.results_size() != static_cast<int>(batch.size()))
      LogWarning(absl::StrCat("report: ", resp.results_size(), " results for ",
                              batch.size(), " reports"));
    if (s.ok() && sent_to != 0 && resp.incarnation() != 0 &&
        resp.incarnation() != sent_to) {
      // A restarted coordinator answered a batch built before we knew of
      // it (no heartbeat had told us, or one did while the call was out):
      // its refusals ("never staged") are ours to fix. The soft state goes
      // first (NoteIncarnationLocked puts it at the front, once per
      // incarnation), then this batch again: it is still in reports_.
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
               o.report.durable == q.report.durable &&
               o.report.replicated == q.report.replicated &&
               o.report.failed == q.report.failed;
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
      if (q.report.replicated && q.report.failed) {
        // A withdrawn copy is not announced again to a new coordinator.
        auto held = soft_replicas_.find({q.report.job, q.report.rank});
        if (held != soft_replicas_.end() &&
            held->second.report.step == q.report.step)
          soft_replicas_.erase(held);
      }
      if (code != absl::StatusCode::kOk) {
        ++reports_refused_;
        {
          absl::MutexLock refusal(&refusal_mu_);
          last_refusal_ = r.message();
        }
        LogWarning(absl::StrCat("report ",
                                q.report.replicated ? "replicated"
                                : q.report.durable  ? "durable"
                                                    : "staged",
                                " job ", q.report.job, " step ", q.report.step,
                                " rank ", q.report.rank, " (epoch ", q.epoch,
                                "): ", r.message()));
        continue;
      }
      if (q.report.replicated && q.report.failed) continue;
      if (q.report.replicated) {
        // The holder keeps the newest copy of a rank: it replaces the older.
        soft_replicas_[{q.report.job, q.report.rank}] = q;
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
