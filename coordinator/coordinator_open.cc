// Coordinator: opening the state (RocksDB or etcd) and the shared root,
// loading it back into memory, going back to it after a failed write, and
// the start of serving (a fresh heartbeat window for every node).
#include <algorithm>
#include <filesystem>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "coordinator/rocks_kv.h"
#include "storage/open_backend.h"
#include "util/log.h"
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
      health_rechecks_(static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::microseconds>(
              std::chrono::system_clock::now().time_since_epoch())
              .count())),
      incarnation_(NewIncarnation()),
      progress_(ProgressWatch::ScanMsFor(options_.hang)),
      net_check_(NetCheckOptions{.min_ratio = options_.health_min_ratio}) {}

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
    absl::ReleasableMutexLock lock(&c->mu_);
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
    lock.Release();
    if (!said)
      LogWarning(absl::StrCat(verified.message(), "; retrying for up to ",
                              std::chrono::duration_cast<std::chrono::seconds>(
                                  c->options_.shared_root_wait)
                                  .count(),
                              " s"));
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
  ++net_nodes_version_;
  health_medians_ = ClusterMedians();  // taken again at the next judgement
  jobs_.clear();
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
    ns.health_checked_ms = now;  // the node re-checks on its own meanwhile
    ns.health_requested = 0;
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
  // The committed writes of recent good steps' manifests (what Open puts
  // back over a deposed leader's late write).
  for (auto& m : snap.manifests) {
    std::string job = m.job();
    const uint64_t step = m.step();
    manifests_[job][step] = std::move(m);
  }
  dirty_jobs_.clear();
  pending_recs_.clear();
  // Shard reports are soft state: records of an older version are ignored
  // (nodes send their reports again to the new incarnation).
  orders_.Load(std::move(snap.orders));
  next_event_seq_ = 1;
  for (auto& e : snap.events) {
    next_event_seq_ = std::max(next_event_seq_, e.seq() + 1);
    events_.push_back(std::move(e));
  }
  counters_ = snap.counters;
  if (counters_.next_order_id() == 0) counters_.set_next_order_id(1);
  return absl::OkStatus();
}

void Coordinator::OnCommitFailed(const absl::Status& s) {
  // Memory ran ahead of the committed state: fail what was built on it and
  // go back to the store.
  absl::MutexLock lock(&mu_);
  committer_->FailQueued(s);
  absl::Status reload = ReloadLocked();
  // The reload dropped every per-rank report (soft state). Nodes send
  // theirs again only to a new incarnation: without one, every step in
  // flight would have its DURABLE reports refused as never staged.
  incarnation_ = NewIncarnation();
  if (!reload.ok())
    LogWarning(
        absl::StrCat("reloading after a failed write: ", reload.message()));
}

void Coordinator::StartServing() {
  absl::MutexLock lock(&mu_);
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
  hearing_.RestartWindows("the state was loading (start or failover)");
}

}  // namespace ckpt::coordinator
