// Coordinator: opening, reloading and committing the state, the event log,
// and the checks every report goes through.
#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "daemon/coordinator/coordinator.h"
#include "storage/manifest.h"
#include "util/status.h"

namespace ckpt::coordinator {

Coordinator::Coordinator(CoordinatorOptions options, std::unique_ptr<CoordStore> store,
                         std::unique_ptr<storage::Backend> shared)
    : options_(std::move(options)), store_(std::move(store)), shared_(std::move(shared)) {}

Coordinator::~Coordinator() = default;

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Open(CoordinatorOptions options) {
  if (options.state_dir.empty()) return absl::InvalidArgumentError("state_dir: empty");
  if (options.shared_root.empty()) return absl::InvalidArgumentError("shared_root: empty");
  if (options.heartbeat_timeout.count() <= 0)
    return absl::InvalidArgumentError("heartbeat_timeout: must be positive");
  if (options.max_events == 0) return absl::InvalidArgumentError("max_events: must be positive");
  if (!options.now_ms) {
    options.now_ms = [] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::steady_clock::now().time_since_epoch())
          .count();
    };
  }
  std::error_code ec;
  std::filesystem::create_directories(options.state_dir, ec);
  if (ec) return absl::InternalError("state_dir: cannot create " + options.state_dir + ": " + ec.message());
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<CoordStore> store, CoordStore::Open(options.state_dir + "/db"));
  storage::LocalBackendOptions bo;
  bo.root = options.shared_root;
  bo.use_io_uring = false;  // a few small objects
  bo.direct_io = false;
  bo.remove_tmp_files = false;  // node daemons write shards here concurrently
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<storage::Backend> shared, storage::NewLocalBackend(bo));
  std::unique_ptr<Coordinator> c(
      new Coordinator(std::move(options), std::move(store), std::move(shared)));
  std::lock_guard<std::mutex> lock(c->mu_);
  CKPT_RETURN_IF_ERROR(c->ReloadLocked());
  CKPT_RETURN_IF_ERROR(c->VerifyManifestsLocked());
  return c;
}

absl::Status Coordinator::ReloadLocked() {
  CKPT_ASSIGN_OR_RETURN(CoordStore::Snapshot snap, store_->Load());
  nodes_.clear();
  jobs_.clear();
  orders_.clear();
  events_.clear();
  const int64_t now = options_.now_ms();
  next_epoch_ = 1;
  for (auto& n : snap.nodes) {
    next_epoch_ = std::max(next_epoch_, n.epoch() + 1);
    NodeState& ns = nodes_[n.node_id()];
    ns.rec = std::move(n);
    ns.last_heartbeat_ms = now;  // a restarted coordinator gives every node a full timeout
  }
  for (auto& j : snap.jobs) jobs_[j.job()].rec = std::move(j);
  for (auto& s : snap.shards) {
    auto job = jobs_.find(s.job());
    if (job == jobs_.end())
      return absl::DataLossError(absl::StrCat("coordinator state: shard of unknown job ", s.job()));
    job->second.steps[s.step()][s.rank()] = std::move(s);
  }
  for (auto& o : snap.orders) orders_[o.id()] = std::move(o);
  next_event_seq_ = 1;
  for (auto& e : snap.events) {
    next_event_seq_ = std::max(next_event_seq_, e.seq() + 1);
    events_.push_back(std::move(e));
  }
  counters_ = snap.counters;
  if (counters_.next_order_id() == 0) counters_.set_next_order_id(1);
  return absl::OkStatus();
}

absl::Status Coordinator::VerifyManifestsLocked() {
  Batch batch;
  for (auto& [name, job] : jobs_) {
    while (job.rec.has_last_good()) {
      uint64_t step = job.rec.last_good_step();
      absl::StatusOr<storage::v1::GlobalManifest> m = storage::ReadGlobalManifest(*shared_, name, step);
      if (m.ok()) break;
      LogLocked(&batch, v1::MANIFEST_INVALID, name, "",
                absl::StrCat("step ", step, ": ", m.status().message()));
      auto* steps = job.rec.mutable_manifest_steps();
      steps->erase(std::remove(steps->begin(), steps->end(), step), steps->end());
      job.rec.set_has_last_good(!steps->empty());
      job.rec.set_last_good_step(steps->empty() ? 0 : *std::max_element(steps->begin(), steps->end()));
      batch.PutJob(job.rec);
    }
  }
  return CommitLocked(&batch);
}

absl::Status Coordinator::CommitLocked(Batch* batch) {
  absl::Status s = store_->Commit(batch);
  if (s.ok()) return s;
  // Memory ran ahead of the committed state: go back to it.
  absl::Status reload = ReloadLocked();
  if (!reload.ok()) return Annotate(s, absl::StrCat("and reloading failed: ", reload.message()));
  return s;
}

void Coordinator::LogLocked(Batch* batch, v1::EventKind kind, const std::string& job,
                            const std::string& node, const std::string& detail) {
  v1::Event e;
  e.set_seq(next_event_seq_++);
  e.set_time_ms(options_.now_ms());
  e.set_job(job);
  e.set_node_id(node);
  e.set_kind(kind);
  e.set_detail(detail);
  batch->PutEvent(e);
  events_.push_back(std::move(e));
  while (events_.size() > options_.max_events) {
    batch->DeleteEvent(events_.front().seq());
    events_.pop_front();
  }
}

absl::Status Coordinator::CheckEpochLocked(const std::string& node_id, uint64_t epoch) {
  auto it = nodes_.find(node_id);
  if (it == nodes_.end())
    return absl::NotFoundError(absl::StrCat("node_id: \"", node_id, "\" is not registered"));
  const v1::NodeRecord& n = it->second.rec;
  if (epoch != n.epoch() || n.health() != v1::ALIVE)
    return absl::FailedPreconditionError(absl::StrCat(
        "epoch: ", epoch, " of node ", node_id, " is fenced (current epoch ", n.epoch(), ", ",
        n.health() == v1::ALIVE ? "alive" : "dead: " + n.dead_reason(), "); re-register"));
  return absl::OkStatus();
}

absl::StatusOr<Coordinator::JobState*> Coordinator::HostedRankLocked(const std::string& node_id,
                                                                     const std::string& job,
                                                                     uint32_t rank) {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job: \"", job, "\" is not registered"));
  if (rank >= it->second.rec.world_size())
    return absl::InvalidArgumentError(
        absl::StrCat("rank: ", rank, " >= world_size ", it->second.rec.world_size(), " of job ", job));
  const std::string& host = it->second.rec.rank_node(rank);
  if (host != node_id)
    return absl::FailedPreconditionError(absl::StrCat("rank: ", rank, " of job ", job,
                                                      " is hosted by node ", host, ", not ", node_id));
  return &it->second;
}

uint32_t Coordinator::HostedRanksLocked(const std::string& node_id) const {
  uint32_t n = 0;
  for (const auto& [name, job] : jobs_)
    n += static_cast<uint32_t>(std::count(job.rec.rank_node().begin(), job.rec.rank_node().end(), node_id));
  return n;
}

void Coordinator::QueueOrderLocked(Batch* batch, v1::Order order) {
  order.set_id(counters_.next_order_id());
  counters_.set_next_order_id(order.id() + 1);
  batch->PutCounters(counters_);
  batch->PutOrder(order);
  orders_[order.id()] = std::move(order);
}

v1::GetClusterResponse Coordinator::GetCluster() {
  std::lock_guard<std::mutex> lock(mu_);
  v1::GetClusterResponse resp;
  const int64_t now = options_.now_ms();
  for (const auto& [id, n] : nodes_) {
    v1::NodeRecord* r = resp.add_nodes();
    *r = n.rec;
    r->set_ms_since_heartbeat(now - n.last_heartbeat_ms);
  }
  for (const auto& [name, job] : jobs_) *resp.add_jobs() = job.rec;
  size_t first = events_.size() > 50 ? events_.size() - 50 : 0;
  for (size_t i = first; i < events_.size(); ++i) *resp.add_recent_events() = events_[i];
  return resp;
}

v1::EventsResponse Coordinator::Events(const v1::EventsRequest& req) {
  std::lock_guard<std::mutex> lock(mu_);
  v1::EventsResponse resp;
  for (const auto& e : events_)
    if (e.seq() > req.after_seq() && (req.job().empty() || e.job() == req.job() || e.job().empty()))
      *resp.add_events() = e;
  return resp;
}

absl::Status Coordinator::Tick() {
  std::lock_guard<std::mutex> lock(mu_);
  Batch batch;
  DetectTimeoutsLocked(&batch);
  return CommitLocked(&batch);
}

}  // namespace ckpt::coordinator
