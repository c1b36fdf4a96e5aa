// NodeState: executing the job table's effects, the reports' outbox, the
// end of a lease and of an idle job, and the gauges. See node_state.h.
#include "daemon/state/node_state.h"

#include "absl/strings/str_cat.h"
#include "daemon/core/engine_util.h"
#include "util/status.h"

namespace ckpt::daemon {

NodeState::NodeState(EngineOptions options_in, storage::Backend* backend_in,
                     Catalog* catalog_in, storage::Backend* object_in)
    : options(std::move(options_in)),
      metrics(options.metrics ? options.metrics
                              : std::make_shared<DaemonMetrics>()),
      backend(backend_in),
      catalog(catalog_in),
      object(object_in),
      started(std::chrono::steady_clock::now()),
      table(JobTable::Rules{
          PersistRetryPolicy{options.max_persist_attempts,
                             options.persist_retry_delay,
                             options.persist_retry_max_delay},
          object_in != nullptr,
          object_in != nullptr &&
              options.commit_tier == EngineOptions::CommitTier::kObject,
          options.node_id}) {}

void NodeState::Wire(PipelineState* state) {
  writer = std::make_unique<CatalogWriter>(catalog);
  arena_drops = std::make_unique<ArenaDrops>(backend);
  pipeline = std::make_unique<PersistPipeline>(
      state, backend, object, options.upload_threads, catalog, writer.get(),
      options.node_id, options.clock);
  persister = &pipeline->persist();
  uploader = pipeline->upload();
  shard_drops = std::make_unique<ShardDrops>(
      &table, catalog, writer.get(), persister, uploader, options.node_id);
  prefaulter =
      std::make_unique<Prefaulter>(&table, backend, options.prefault_read_hold);
}

NodeState::Section::Section(NodeState* node) ABSL_NO_THREAD_SAFETY_ANALYSIS
    : node_(node),
      lock_(&node->table) {}

// The analysis follows lock_ inside, not the capability Section stands for.
NodeState::Section::~Section() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (held_) Unlock();
}

void NodeState::Section::Unlock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const uint64_t upto = node_->queued_reports_;
  lock_.Unlock();
  held_ = false;
  node_->Deliver(upto);
}

void NodeState::Section::Relock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  lock_.Relock();
  held_ = true;
}

void NodeState::Outbox(Report report) {
  const bool wanted = std::holds_alternative<ShardReport>(report)
                          ? static_cast<bool>(options.on_shard)
                          : static_cast<bool>(options.on_fallback);
  if (!wanted) return;
  outbox_.push_back(std::move(report));
  ++queued_reports_;
}

void NodeState::Deliver(uint64_t upto) {
  if (delivered_reports_.load(std::memory_order_acquire) >= upto) return;
  // One deliverer at a time, so that reports reach the node agent in the
  // order of the changes; whoever comes first delivers the others' too.
  absl::MutexLock order(&deliver_mu_);
  if (delivered_reports_.load(std::memory_order_acquire) >= upto) return;
  std::vector<Report> out;
  {
    JobTable::Lock lock(&table);
    out.swap(outbox_);
  }
  for (const Report& r : out) {
    if (const ShardReport* shard = std::get_if<ShardReport>(&r))
      options.on_shard(*shard);
    else
      options.on_fallback(std::get<FallbackReport>(r));
  }
  delivered_reports_.fetch_add(out.size(), std::memory_order_release);
}

uint64_t NodeState::Apply(Effects& fx) {
  uint64_t ticket = 0;
  if (!fx.edit.empty()) ticket = QueueEdit(std::move(fx.edit), fx.sync);
  fx.edit = CatalogEdit();
  for (OwedDelete& d : fx.deletes)
    shard_drops->QueueLocalDelete(d.job, d.step, std::move(d.key), false);
  fx.deletes.clear();
  for (UploadTask& del : fx.object_deletes)
    shard_drops->QueueObjectDelete(std::move(del));
  fx.object_deletes.clear();
  for (ShardReport& r : fx.reports) Outbox(std::move(r));
  fx.reports.clear();
  return ticket;
}

void NodeState::Perform(Effects fx) {
  for (PersistTask& t : fx.persist) persister->Push(std::move(t));
  for (UploadTask& t : fx.upload) uploader->Push(std::move(t));
  if (fx.wake_slots) table.Wake(JobTable::Waiter::kSlot);
  if (fx.wake_durable) table.Wake(JobTable::Waiter::kDurable);
}

void NodeState::MaybeForgetJob(const std::string& name) {
  Job* found = table.Find(name);
  if (found == nullptr || !found->forget_when_idle) return;
  Job& job = *found;
  if (!table.Unused(job)) return;
  std::vector<uint32_t> ranks;
  for (const auto& [r, rank] : job.ranks) ranks.push_back(r);
  for (uint32_t r : ranks) DropArena(job, r, /*unlink=*/true);
  CatalogEdit edit;
  edit.DeleteJob(name);
  QueueEdit(std::move(edit), /*sync=*/true);
  LogInfo(absl::StrCat("job ", name,
                       ": every step deleted; record and arenas removed"));
  table.Erase(name);
  metrics->ForgetJob(name);
  table.Wake(JobTable::Waiter::kSlot);
  table.Wake(JobTable::Waiter::kDurable);
}

void NodeState::ReleaseLease(uint64_t id) {
  std::optional<Lease> lease = table.ReleaseLease(id);
  if (!lease) return;
  if (!lease->prefault_hold.empty()) prefaulter->EndRead(lease->prefault_hold);
  // A FILE restore is over: the deletes it held back go now.
  if (!lease->file_key.empty()) shard_drops->ReleaseDeferred();
  MaybeForgetJob(lease->job);
}

void NodeState::ReportShard(const Shard& shard, bool durable, bool failed) {
  Outbox(table.ReportOf(shard, durable, failed));
}

void NodeState::FailShard(Shard& shard, const std::string& error) {
  Effects fx = table.Fail(shard, error);
  Apply(fx);  // an edit and a report: nothing left to perform
}

MetricsSnapshot NodeState::Gauges() {
  MetricsSnapshot snap;
  MetricsSnapshot::Backlog& local =
      snap.backlog[std::string(metric::kTierLocal)];
  Section lock(this);
  table.ForEachVisible(/*uid=*/0, /*only=*/"", [&](const Job& job) {
    MetricsSnapshot::Job& g = snap.jobs[job.rec.job()];
    for (const auto& [r, rank] : job.ranks) {
      if (!rank.arena) continue;
      ++g.arenas;
      g.shm_bytes += rank.arena->size();
      if (rank.arena->huge_pages()) ++g.huge_page_arenas;
    }
    const JobTable::InFlight in = JobTable::InFlightOf(job);
    local.steps += in.steps;
    local.shards += in.shards;
    local.bytes += in.bytes;
  });
  if (uploader) {
    // The object tier's queue (its own lock; lock order table -> uploader).
    const UploadBacklog b = uploader->Backlog();
    MetricsSnapshot::Backlog& tier =
        snap.backlog[std::string(metric::kTierObject)];
    tier.steps = b.steps;
    tier.shards = b.shards;
    tier.bytes = b.bytes;
  }
  return snap;
}

}  // namespace ckpt::daemon
