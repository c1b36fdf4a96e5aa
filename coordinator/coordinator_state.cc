// Coordinator: opening, reloading and committing the state (group commit),
// liveness, the event log, and the checks every report goes through.
#include <algorithm>
#include <filesystem>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "coordinator/rocks_kv.h"
#include "storage/keys.h"
#include "storage/manifest.h"
#include "storage/open_backend.h"
#include "util/status.h"

namespace ckpt::coordinator {
namespace {

uint64_t NewIncarnation() {
  std::random_device rd;
  uint64_t v = (uint64_t{rd()} << 32) ^ rd() ^
               static_cast<uint64_t>(
                   std::chrono::system_clock::now().time_since_epoch().count());
  return v == 0 ? 1 : v;
}

}  // namespace

Coordinator::Coordinator(CoordinatorOptions options,
                         std::unique_ptr<CoordStore> store,
                         std::unique_ptr<storage::Backend> shared)
    : options_(std::move(options)),
      store_(std::move(store)),
      shared_(std::move(shared)),
      incarnation_(NewIncarnation()) {}

Coordinator::~Coordinator() {
  options_.metrics->SetClusterSource(
      nullptr);  // waits for a scrape in progress
  committer_.reset();
}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Open(
    CoordinatorOptions options) {
  if (options.state_dir.empty())
    return absl::InvalidArgumentError("state_dir: empty");
  std::error_code ec;
  std::filesystem::create_directories(options.state_dir, ec);
  if (ec)
    return absl::InternalError("state_dir: cannot create " + options.state_dir +
                               ": " + ec.message());
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<KvBackend> kv,
                        OpenRocksKv(options.state_dir + "/db"));
  return Open(std::move(options), std::move(kv));
}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Open(
    CoordinatorOptions options, std::unique_ptr<KvBackend> kv) {
  if (options.shared_root.empty())
    return absl::InvalidArgumentError("shared_root: empty");
  if (options.heartbeat_timeout.count() <= 0)
    return absl::InvalidArgumentError("heartbeat_timeout: must be positive");
  if (options.max_events == 0)
    return absl::InvalidArgumentError("max_events: must be positive");
  if (!options.now_ms) {
    options.now_ms = [] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::steady_clock::now().time_since_epoch())
          .count();
    };
  }
  if (!options.metrics)
    options.metrics = std::make_shared<CoordinatorMetrics>();
  auto store = std::make_unique<CoordStore>(std::move(kv));
  storage::OpenBackendOptions bo;
  bo.field = "shared_root";
  bo.object = options.object_config;  // no shared directory: an object store
  bo.relative_ok = true;              // the default is <state_dir>/shared
  bo.local.use_io_uring = false;      // a few small objects
  bo.local.direct_io = false;
  bo.local.remove_tmp_files = false;  // node daemons write shards here
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<storage::Backend> shared,
                        storage::OpenBackend(options.shared_root, bo));
  if (options.wrap_shared_root)
    shared = options.wrap_shared_root(std::move(shared));
  std::unique_ptr<Coordinator> c(
      new Coordinator(std::move(options), std::move(store), std::move(shared)));
  // A shared root that cannot be read (not mounted yet, an object store
  // outage) says nothing about the steps: wait for it, then refuse to start.
  const auto give_up =
      std::chrono::steady_clock::now() + c->options_.shared_root_wait;
  for (bool said = false;; said = true) {
    std::unique_lock<std::mutex> lock(c->mu_);
    CKPT_RETURN_IF_ERROR(c->ReloadLocked());
    absl::Status verified = c->VerifyManifestsLocked();
    if (verified.ok()) {
      for (auto& [name, job] : c->jobs_) {
        job.durable_rec = job.rec;
        job.durable_ranks_by_node = job.ranks_by_node;
      }
      c->dirty_jobs_.clear();
      break;
    }
    const auto now = std::chrono::steady_clock::now();
    if (verified.code() != absl::StatusCode::kUnavailable || now >= give_up)
      return verified;
    lock.unlock();
    if (!said)
      std::fprintf(stderr, "ckpt-coordinator: %s; retrying for up to %lld s\n",
                   std::string(verified.message()).c_str(),
                   static_cast<long long>(
                       std::chrono::duration_cast<std::chrono::seconds>(
                           c->options_.shared_root_wait)
                           .count()));
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
        give_up - now, std::chrono::milliseconds(250)));
  }
  Coordinator* raw = c.get();
  c->committer_ = std::make_unique<GroupCommitter>(
      raw->store_.get(),
      [raw](const absl::Status& s) { raw->OnCommitFailed(s); },
      [raw](uint64_t seq) { raw->OnDurable(seq); });
  c->options_.metrics->SetClusterSource(
      [p = c.get()] { return p->GetCluster(); });
  return c;
}

absl::Status Coordinator::ReloadLocked() {
  CKPT_ASSIGN_OR_RETURN(CoordStore::Snapshot snap, store_->Load());
  nodes_.clear();
  jobs_.clear();
  orders_.clear();
  orders_by_node_.clear();
  events_.clear();
  const int64_t now = options_.now_ms();
  next_epoch_ = 1;
  {
    std::unique_lock<std::shared_mutex> live(live_mu_);
    for (auto& [id, l] : live_) l->alive = false;
  }
  for (auto& n : snap.nodes) {
    next_epoch_ = std::max(next_epoch_, n.epoch() + 1);
    NodeState& ns = nodes_[n.node_id()];
    ns.rec = std::move(n);
    SetLiveLocked(ns);
    ns.live->last_seen_ms =
        now;  // a restarted coordinator gives every node a full timeout
  }
  next_expiry_ms_ = INT64_MIN;
  for (auto& j : snap.jobs) {
    JobState& js = jobs_[j.job()];
    js.rec = std::move(j);
    js.plan_ordered_ms = now;  // a plan's acknowledgement window starts again
    IndexJobLocked(js);
    js.durable_rec = js.rec;
    js.durable_ranks_by_node = js.ranks_by_node;
  }
  dirty_jobs_.clear();
  new_orders_.clear();
  pending_recs_.clear();
  order_seq_.clear();
  // Shard reports are soft state: records of an older version are ignored
  // (nodes send their reports again to the new incarnation).
  for (auto& o : snap.orders) {
    orders_by_node_[o.node_id()].insert(o.id());
    orders_[o.id()] = std::move(o);
  }
  next_event_seq_ = 1;
  for (auto& e : snap.events) {
    next_event_seq_ = std::max(next_event_seq_, e.seq() + 1);
    events_.push_back(std::move(e));
  }
  counters_ = snap.counters;
  if (counters_.next_order_id() == 0) counters_.set_next_order_id(1);
  return absl::OkStatus();
}

absl::Status Coordinator::ManifestInvalidLocked(const std::string& job,
                                                uint64_t step,
                                                const absl::Status& read) {
  const std::string where =
      absl::StrCat("shared_root ", options_.shared_root, ": global manifest ",
                   storage::GlobalManifestKey(job, step), " of job ", job);
  const std::string rule =
      "not starting: only a manifest that is there and corrupt makes a step "
      "invalid";
  if (read.code() == absl::StatusCode::kDataLoss) return absl::OkStatus();
  if (read.code() == absl::StatusCode::kNotFound) {
    // Removed, when the job's other keys are there; with none of them the
    // shared root is not what it was (a mount not there yet).
    absl::StatusOr<std::vector<std::string>> keys =
        shared_->List(storage::JobPrefix(job));
    if (keys.ok() && !keys->empty()) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat(
        where, " is missing, and so is every other key under ",
        storage::JobPrefix(job),
        keys.ok()
            ? ""
            : absl::StrCat(" (listing it: ", keys.status().message(), ")"),
        " (is the shared root mounted?); ", rule));
  }
  return absl::UnavailableError(
      absl::StrCat(where, " cannot be read: ", read.message(), "; ", rule));
}

absl::Status Coordinator::VerifyManifestsLocked() {
  Batch batch;
  for (auto& [name, job] : jobs_) {
    while (job.rec.has_last_good()) {
      uint64_t step = job.rec.last_good_step();
      absl::StatusOr<storage::v1::GlobalManifest> m =
          storage::ReadGlobalManifest(*shared_, name, step);
      if (m.ok())
        m = [&]() -> absl::StatusOr<storage::v1::GlobalManifest> {
          absl::Status stamped = CheckStampLocked(job.rec, *m);
          if (stamped.ok()) return std::move(*m);
          // Not the committed write (a deposed leader's, landed late). This
          // process kept the committed one (a reload after a failed write):
          // it goes back to the shared root. Otherwise the step is invalid.
          const storage::v1::GlobalManifest* kept =
              KnownManifestLocked(name, step);
          if (kept && CheckStampLocked(job.rec, *kept).ok() &&
              storage::WriteGlobalManifest(*shared_, *kept).ok())
            return *kept;
          return stamped;
        }();
      if (m.ok()) {
        RememberManifestLocked(*m);
        break;
      }
      CKPT_RETURN_IF_ERROR(ManifestInvalidLocked(name, step, m.status()));
      LogLocked(&batch, v1::MANIFEST_INVALID, name, "",
                absl::StrCat("step ", step, ": ", m.status().message()));
      auto* steps = job.rec.mutable_manifest_steps();
      steps->erase(std::remove(steps->begin(), steps->end(), step),
                   steps->end());
      job.rec.mutable_manifest_stamps()->erase(step);
      job.rec.set_has_last_good(!steps->empty());
      job.rec.set_last_good_step(
          steps->empty() ? 0 : *std::max_element(steps->begin(), steps->end()));
      batch.PutJob(job.rec);
    }
  }
  return CommitLocked(&batch);
}

absl::Status Coordinator::CommitLocked(Batch* batch) {
  absl::Status s = store_->Commit(batch);
  if (s.ok()) return s;
  absl::Status reload = ReloadLocked();
  if (!reload.ok())
    return Annotate(s,
                    absl::StrCat("and reloading failed: ", reload.message()));
  return s;
}

void Coordinator::PutJobLocked(Batch* batch, JobState& job) {
  batch->PutJob(job.rec);
  dirty_jobs_.insert(job.rec.job());
}

void Coordinator::EnqueueLocked(std::unique_ptr<Batch> batch) {
  if (batch->empty()) return;
  uint64_t seq = committer_->Enqueue(std::move(batch));
  for (const std::string& name : dirty_jobs_) {
    auto it = jobs_.find(name);
    if (it != jobs_.end()) pending_recs_.emplace_back(seq, it->second.rec);
  }
  dirty_jobs_.clear();
  for (uint64_t id : new_orders_) order_seq_[id] = seq;
  new_orders_.clear();
}

absl::Status Coordinator::Commit(Lock& lock, std::unique_ptr<Batch> batch) {
  if (batch->empty())
    return absl::OkStatus();  // nothing of this call to wait for
  EnqueueLocked(std::move(batch));
  uint64_t seq = committer_->last_enqueued();
  lock.unlock();
  return committer_->Wait(seq);
}

void Coordinator::OnCommitFailed(const absl::Status& s) {
  // Memory ran ahead of the committed state: fail what was built on it and
  // go back to the store.
  std::lock_guard<std::mutex> lock(mu_);
  committer_->FailQueued(s);
  absl::Status reload = ReloadLocked();
  // The reload dropped every per-rank report (soft state). Nodes send
  // theirs again only to a new incarnation: without one, every step in
  // flight would have its DURABLE reports refused as never staged.
  incarnation_ = NewIncarnation();
  if (!reload.ok())
    std::fprintf(stderr,
                 "ckpt-coordinator: reloading after a failed write: %s\n",
                 std::string(reload.message()).c_str());
}

void Coordinator::OnDurable(uint64_t seq) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!pending_recs_.empty() && pending_recs_.front().first <= seq) {
      auto it = jobs_.find(pending_recs_.front().second.job());
      if (it != jobs_.end()) {
        JobState& job = it->second;
        job.durable_rec = std::move(pending_recs_.front().second);
        job.durable_ranks_by_node.clear();
        for (uint32_t r = 0;
             r < static_cast<uint32_t>(job.durable_rec.rank_node_size()); ++r)
          job.durable_ranks_by_node[job.durable_rec.rank_node(r)].push_back(r);
      }
      pending_recs_.pop_front();
    }
    std::erase_if(order_seq_, [&](const auto& kv) { return kv.second <= seq; });
  }
  {
    std::lock_guard<std::mutex> lock(change_mu_);
    ++changes_;
  }
  change_cv_.notify_all();
}

uint64_t Coordinator::WaitForChange(
    uint64_t seen, std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(change_mu_);
  change_cv_.wait_until(lock, deadline, [&] { return changes_ > seen; });
  return changes_;
}

void Coordinator::SetLiveLocked(NodeState& node) {
  std::unique_lock<std::shared_mutex> live(live_mu_);
  std::unique_ptr<Liveness>& l = live_[node.rec.node_id()];
  if (!l) l = std::make_unique<Liveness>();
  l->epoch = node.rec.epoch();
  l->alive = node.rec.health() == v1::ALIVE;
  node.live = l.get();
}

void Coordinator::IndexJobLocked(JobState& job) {
  job.ranks_by_node.clear();
  for (uint32_t r = 0; r < static_cast<uint32_t>(job.rec.rank_node_size()); ++r)
    job.ranks_by_node[job.rec.rank_node(r)].push_back(r);
}

void Coordinator::PutShardLocked(JobState& job, v1::ShardRecord rec) {
  const uint64_t step = rec.step();
  auto& shards = job.steps[step];
  auto it = shards.find(rec.rank());
  bool was = it != shards.end() && it->second.state() == v1::DURABLE;
  bool now = rec.state() == v1::DURABLE;
  if (was != now) job.durable_ranks[step] += now ? 1 : -1;
  shards[rec.rank()] = std::move(rec);
}

void Coordinator::EraseStepLocked(JobState& job, uint64_t step) {
  job.steps.erase(step);
  job.durable_ranks.erase(step);
}

std::map<uint64_t, v1::Order>::iterator Coordinator::EraseOrderLocked(
    Batch* batch, std::map<uint64_t, v1::Order>::iterator it) {
  batch->DeleteOrder(it->first);
  auto by = orders_by_node_.find(it->second.node_id());
  if (by != orders_by_node_.end()) {
    by->second.erase(it->first);
    if (by->second.empty()) orders_by_node_.erase(by);
  }
  return orders_.erase(it);
}

void Coordinator::RememberManifestLocked(const storage::v1::GlobalManifest& m) {
  auto& kept = manifests_[m.job()];
  kept[m.step()] = m;
  while (kept.size() > 2) kept.erase(kept.begin());
}

const storage::v1::GlobalManifest* Coordinator::KnownManifestLocked(
    const std::string& job, uint64_t step) const {
  auto j = manifests_.find(job);
  if (j == manifests_.end()) return nullptr;
  auto m = j->second.find(step);
  return m == j->second.end() ? nullptr : &m->second;
}

void Coordinator::LogLocked(Batch* batch, v1::EventKind kind,
                            const std::string& job, const std::string& node,
                            const std::string& detail) {
  v1::Event e;
  e.set_job(job);
  e.set_node_id(node);
  e.set_kind(kind);
  e.set_detail(detail);
  LogLocked(batch, std::move(e));
}

void Coordinator::LogLocked(Batch* batch, v1::Event e) {
  e.set_seq(next_event_seq_++);
  e.set_time_ms(options_.now_ms());
  batch->PutEvent(e);
  events_.push_back(std::move(e));
  while (events_.size() > options_.max_events) {
    batch->DeleteEvent(events_.front().seq());
    events_.pop_front();
  }
}

absl::Status Coordinator::CheckEpochLocked(const std::string& node_id,
                                           uint64_t epoch) {
  auto it = nodes_.find(node_id);
  if (it == nodes_.end())
    return absl::NotFoundError(
        absl::StrCat("node_id: \"", node_id, "\" is not registered"));
  const v1::NodeRecord& n = it->second.rec;
  if (epoch != n.epoch() || n.health() != v1::ALIVE)
    return absl::FailedPreconditionError(absl::StrCat(
        "epoch: ", epoch, " of node ", node_id, " is fenced (current epoch ",
        n.epoch(), ", ",
        n.health() == v1::ALIVE ? "alive" : "dead: " + n.dead_reason(),
        "); re-register"));
  return absl::OkStatus();
}

absl::StatusOr<Coordinator::JobState*> Coordinator::HostedRankLocked(
    const std::string& node_id, const std::string& job, uint32_t rank) {
  auto it = jobs_.find(job);
  if (it == jobs_.end())
    return absl::NotFoundError(
        absl::StrCat("job: \"", job, "\" is not registered"));
  if (rank >= it->second.rec.world_size())
    return absl::InvalidArgumentError(
        absl::StrCat("rank: ", rank, " >= world_size ",
                     it->second.rec.world_size(), " of job ", job));
  const std::string& host = it->second.rec.rank_node(rank);
  if (host != node_id)
    return absl::FailedPreconditionError(
        absl::StrCat("rank: ", rank, " of job ", job, " is hosted by node ",
                     host, ", not ", node_id));
  return &it->second;
}

uint32_t Coordinator::HostedRanksLocked(const std::string& node_id) const {
  uint32_t n = 0;
  for (const auto& [name, job] : jobs_) {
    auto it = job.ranks_by_node.find(node_id);
    if (it != job.ranks_by_node.end())
      n += static_cast<uint32_t>(it->second.size());
  }
  return n;
}

void Coordinator::QueueOrderLocked(Batch* batch, v1::Order order) {
  order.set_id(counters_.next_order_id());
  counters_.set_next_order_id(order.id() + 1);
  batch->PutCounters(counters_);
  batch->PutOrder(order);
  orders_by_node_[order.node_id()].insert(order.id());
  new_orders_.push_back(order.id());
  orders_[order.id()] = std::move(order);
}

v1::GetClusterResponse Coordinator::GetCluster() {
  std::lock_guard<std::mutex> lock(mu_);
  v1::GetClusterResponse resp;
  const int64_t now = options_.now_ms();
  for (const auto& [id, n] : nodes_) {
    v1::NodeRecord* r = resp.add_nodes();
    *r = n.rec;
    r->set_ms_since_heartbeat(now - LastSeen(n));
  }
  for (const auto& [name, job] : jobs_) *resp.add_jobs() = job.rec;
  size_t first = events_.size() > 50 ? events_.size() - 50 : 0;
  for (size_t i = first; i < events_.size(); ++i)
    *resp.add_recent_events() = events_[i];
  return resp;
}

v1::EventsResponse Coordinator::Events(const v1::EventsRequest& req) {
  std::lock_guard<std::mutex> lock(mu_);
  v1::EventsResponse resp;
  for (const auto& e : events_)
    if (e.seq() > req.after_seq() &&
        (req.job().empty() || e.job() == req.job() || e.job().empty()))
      *resp.add_events() = e;
  return resp;
}

v1::JobView Coordinator::View(const std::string& job_name,
                              const std::string& node_id) {
  std::lock_guard<std::mutex> lock(mu_);
  v1::JobView v;
  v.set_job(job_name);
  auto node = nodes_.find(node_id);
  if (node != nodes_.end()) {
    v.set_node_health(node->second.rec.health());
    v.set_node_epoch(node->second.rec.epoch());
  }
  auto it = jobs_.find(job_name);
  if (it == jobs_.end()) return v;
  const v1::JobRecord& j = it->second.durable_rec;
  if (j.job().empty()) return v;  // registered, not yet durable
  v.set_registered(true);
  v.set_world_size(j.world_size());
  v.set_generation(j.generation());
  v.set_plan_state(j.plan_state());
  v.set_has_last_good(j.has_last_good());
  v.set_last_good_step(j.last_good_step());
  v.set_has_restore_step(j.has_restore_step());
  v.set_restore_step(j.restore_step());
  auto mine = it->second.durable_ranks_by_node.find(node_id);
  if (mine != it->second.durable_ranks_by_node.end())
    *v.mutable_ranks() = {mine->second.begin(), mine->second.end()};
  if (j.has_stack_request())
    for (const std::string& n : j.stack_request().nodes())
      if (n == node_id)
        v.set_capture_stacks_generation(j.stack_request().generation());
  if (j.rank_node_size() > 0) {
    auto r0 = nodes_.find(j.rank_node(0));
    if (r0 != nodes_.end()) v.set_rank0_address(r0->second.rec.address());
  }
  return v;
}

absl::Status Coordinator::CheckStampLocked(
    const v1::JobRecord& rec, const storage::v1::GlobalManifest& m) const {
  auto stamp = rec.manifest_stamps().find(m.step());
  if (stamp == rec.manifest_stamps().end())
    return absl::OkStatus();  // committed before stamps
  if (stamp->second.generation() == m.generation() &&
      stamp->second.fence() == m.fence())
    return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      "global manifest ", storage::GlobalManifestKey(m.job(), m.step()),
      " was written in generation ", m.generation(), " under fence ", m.fence(),
      ", but the commit of step ", m.step(), " refers to generation ",
      stamp->second.generation(), " fence ", stamp->second.fence(),
      " (a deposed leader's write); not trusted"));
}

absl::Status Coordinator::AuditManifests() {
  struct Expect {
    std::string job;
    storage::v1::GlobalManifest manifest;  // the committed write
  };
  std::vector<Expect> expect;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [name, job] : jobs_) {
      if (!job.rec.has_last_good()) continue;
      const storage::v1::GlobalManifest* kept =
          KnownManifestLocked(name, job.rec.last_good_step());
      if (kept && job.rec.manifest_stamps().count(kept->step()) &&
          CheckStampLocked(job.rec, *kept).ok())
        expect.push_back({name, *kept});
    }
  }
  absl::Status first;
  for (Expect& e : expect) {
    const uint64_t step = e.manifest.step();
    absl::StatusOr<storage::v1::GlobalManifest> found =
        storage::ReadGlobalManifest(*shared_, e.job, step);
    if (found.ok() && found->generation() == e.manifest.generation() &&
        found->fence() == e.manifest.fence())
      continue;
    if (!found.ok() && found.status().code() != absl::StatusCode::kDataLoss &&
        found.status().code() != absl::StatusCode::kNotFound) {
      if (first.ok()) first = found.status();  // unreadable now: nothing proven
      continue;
    }
    if (options_.leading && !options_.leading())
      return absl::UnavailableError("not leader");
    {
      // Still the committed write (no rollback or new commit meanwhile)?
      std::lock_guard<std::mutex> lock(mu_);
      auto job = jobs_.find(e.job);
      if (job == jobs_.end() || !job->second.rec.has_last_good() ||
          job->second.rec.last_good_step() != step ||
          !CheckStampLocked(job->second.rec, e.manifest).ok())
        continue;
    }
    absl::Status written = storage::WriteGlobalManifest(*shared_, e.manifest);
    Lock lock(mu_);
    auto batch = std::make_unique<Batch>();
    LogLocked(
        batch.get(), v1::MANIFEST_INVALID, e.job, "",
        absl::StrCat(
            "step ", step, ": ",
            found.ok()
                ? absl::StrCat("MANIFEST.global was written in generation ",
                               found->generation(), " under fence ",
                               found->fence())
                : std::string(found.status().message()),
            ", not the committed write (generation ", e.manifest.generation(),
            ", fence ", e.manifest.fence(), "); ",
            written.ok() ? "written again"
                         : absl::StrCat("writing it again failed: ",
                                        written.message())));
    absl::Status committed = Commit(lock, std::move(batch));
    if (first.ok() && !written.ok()) first = written;
    if (first.ok() && !committed.ok()) first = committed;
  }
  return first;
}

void Coordinator::StartServing() {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = options_.now_ms();
  for (auto& [name, job] : jobs_)
    job.plan_ordered_ms = now;  // as for heartbeats below
  std::unique_lock<std::shared_mutex> live(live_mu_);
  for (auto& [id, node] : nodes_) {
    if (node.rec.health() != v1::ALIVE) continue;
    int64_t last = node.live->last_seen_ms.load();
    if (last < now) node.live->last_seen_ms = now;
  }
  next_expiry_ms_ = now + options_.heartbeat_timeout.count() + 1;
}

absl::Status Coordinator::Tick() {
  // Cheap without the state mutex while no node can have timed out.
  if (options_.now_ms() < next_expiry_ms_.load()) return absl::OkStatus();
  Lock lock(mu_);
  auto batch = std::make_unique<Batch>();
  DetectTimeoutsLocked(batch.get());
  return Commit(lock, std::move(batch));
}

}  // namespace ckpt::coordinator
