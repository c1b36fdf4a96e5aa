// Coordinator: elastic continuation. A job that lost a node whose ranks
// no healthy spare takes goes on with fewer ranks (renumbered densely,
// each restoring a saved rank of the last good step), and grows back at a
// commit once nodes or spares have room (doc/operations.md#elastic-
// continuation).
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/coordinator.h"

namespace ckpt::coordinator {
namespace {

// The largest multiple of `multiple` (>= 1) not above `n`.
uint32_t AllowedBelow(uint32_t n, uint32_t multiple) {
  return n / multiple * multiple;
}

// Whether the job may run at other world sizes than its registered one.
bool Elastic(const v1::JobRecord& j, uint32_t full) {
  return j.min_world_size() != 0 && j.min_world_size() < full;
}

}  // namespace

uint32_t Coordinator::SavedWorldSizeLocked(const JobState& job,
                                           uint64_t step) const {
  if (job.rec.has_last_good() && step == job.rec.last_good_step() &&
      job.rec.last_good_world_size() != 0)
    return job.rec.last_good_world_size();
  return job.rec.world_size();
}

bool Coordinator::ShrinkLocked(Batch* batch, JobState& job, std::string* what) {
  v1::JobRecord& rec = job.rec;
  const uint32_t full = FullWorldSize(rec);
  if (!Elastic(rec, full)) return false;
  const int64_t now = options_.now_ms();
  if (job.no_host_since_ms == 0) job.no_host_since_ms = now;
  if (options_.spare_wait_ms > 0) {
    // A spare may still join (or pass its check) within the wait.
    const int64_t due = job.no_host_since_ms + options_.spare_wait_ms;
    if (!job.spare_wait_over && now < due) {
      LowerNextExpiryLocked(due);
      return false;
    }
  } else {
    // At once when no spare exists; one with room that is being checked
    // is waited for (its answer plans again, coordinator_health.cc).
    std::map<std::string, uint32_t> group;
    uint32_t largest = 0;
    for (uint32_t r : rec.lost_ranks())
      largest = std::max(largest, ++group[rec.rank_node(r)]);
    for (auto& [id, n] : nodes_)
      if (n.rec.spare() && Placeable(n.rec) &&
          n.rec.capacity() >= HostedRanksLocked(id) + largest &&
          StaleSpareLocked(n))
        return false;
  }
  const uint32_t world = rec.world_size();
  const std::set<uint32_t> lost(rec.lost_ranks().begin(),
                                rec.lost_ranks().end());
  std::vector<uint32_t> kept;
  for (uint32_t r = 0; r < world; ++r)
    if (!lost.count(r)) kept.push_back(r);
  const uint32_t multiple = std::max(rec.world_size_multiple(), 1u);
  const uint32_t size =
      AllowedBelow(static_cast<uint32_t>(kept.size()), multiple);
  if (size == 0 || size < rec.min_world_size()) return false;
  // The lost ranks' hosts stop them, as for a move to a spare (a
  // returning node learns which ranks it lost).
  std::map<std::string, std::vector<uint32_t>> gone;
  for (uint32_t r : lost) gone[rec.rank_node(r)].push_back(r);
  for (auto& [host, ranks] : gone) {
    v1::Order stop;
    stop.set_node_id(host);
    stop.set_kind(v1::STOP);
    stop.set_job(rec.job());
    stop.mutable_ranks()->Add(ranks.begin(), ranks.end());
    stop.set_generation(rec.generation());
    stop.set_world_size(world);
    QueueOrderLocked(batch, std::move(stop));
  }
  // Densely renumbered in the old order: new rank i is kept[i], on the
  // same host. Ranks past the allowed size (not a multiple) are dropped.
  std::vector<std::string> hosts;
  for (uint32_t i = 0; i < size; ++i) hosts.push_back(rec.rank_node(kept[i]));
  std::vector<uint32_t> dropped(kept.begin() + size, kept.end());
  rec.clear_rank_node();
  for (std::string& h : hosts) rec.add_rank_node(std::move(h));
  rec.set_world_size(size);
  rec.clear_lost_ranks();
  // Steps after the last good one were saved in the old layout: the
  // shrunk job restores the last good step (each rank a saved rank).
  DropStepsAfterLocked(batch, job,
                       rec.has_last_good()
                           ? std::optional<uint64_t>(rec.last_good_step())
                           : std::nullopt);
  job.no_host_since_ms = 0;
  job.spare_wait_over = false;
  *what = absl::StrCat(
      "shrunk from world size ", world, " to ", size, " (of ", full,
      "): ranks ", absl::StrJoin(lost, ","), " lost without a spare",
      dropped.empty()
          ? std::string()
          : absl::StrCat(", ranks ", absl::StrJoin(dropped, ","),
                         " dropped (world size a multiple of ", multiple, ")"));
  return true;
}

void Coordinator::GrowLocked(Batch* batch, JobState& job) {
  v1::JobRecord& rec = job.rec;
  const uint32_t full = FullWorldSize(rec);
  const uint32_t world = rec.world_size();
  if (world >= full || rec.plan_state() == v1::PLAN_WAITING_FOR_NODE) return;
  const uint32_t multiple = std::max(rec.world_size_multiple(), 1u);
  // Room: active nodes first (a returned node), then spares; each node at
  // most nproc_per_node of the job's ranks.
  std::map<std::string, uint32_t> mine;
  for (const std::string& h : rec.rank_node()) ++mine[h];
  std::vector<std::pair<NodeState*, uint32_t>> room;
  uint32_t total = 0;
  for (bool spares : {false, true})
    for (auto& [id, n] : nodes_) {
      if (n.rec.spare() != spares || !Placeable(n.rec) ||
          n.low_figure_recheck != 0 || (spares && StaleSpareLocked(n)))
        continue;
      const uint32_t used = HostedRanksLocked(id);
      uint32_t free = n.rec.capacity() > used ? n.rec.capacity() - used : 0;
      if (rec.nproc_per_node() > 0)
        free = std::min(free, rec.nproc_per_node() > mine[id]
                                  ? rec.nproc_per_node() - mine[id]
                                  : 0u);
      if (free == 0) continue;
      room.emplace_back(&n, free);
      total += free;
    }
  const uint32_t size = std::min(full, AllowedBelow(world + total, multiple));
  if (size <= world) return;
  std::vector<std::string> took;
  for (auto& [n, free] : room) {
    if (static_cast<uint32_t>(rec.rank_node_size()) == size) break;
    const uint32_t first = static_cast<uint32_t>(rec.rank_node_size());
    for (; free > 0 && static_cast<uint32_t>(rec.rank_node_size()) < size;
         --free)
      rec.add_rank_node(n->rec.node_id());
    took.push_back(absl::StrCat("ranks ", first, "-", rec.rank_node_size() - 1,
                                " on ", n->rec.node_id()));
    if (n->rec.spare()) {
      n->rec.set_spare(false);
      batch->PutNode(n->rec);
    }
  }
  rec.set_world_size(size);
  MakePlanLocked(batch, job,
                 absl::StrCat("grown from world size ", world, " to ", size,
                              " (of ", full, ") at step ", rec.last_good_step(),
                              ": ", absl::StrJoin(took, ", ")));
}

std::string Coordinator::RemapRestoreLocked(JobState& job,
                                            std::optional<uint64_t> step,
                                            uint32_t saved) {
  v1::JobRecord& rec = job.rec;
  rec.clear_restore_ranks();
  rec.set_restore_world_size(0);
  const uint32_t world = rec.world_size();
  if (!step || saved == 0 || saved == world) return "";
  rec.set_restore_world_size(saved);
  constexpr uint32_t kNone = UINT32_MAX;
  std::vector<uint32_t> from(world, kNone);
  std::vector<uint32_t> uses(saved, 0);
  // First a saved rank in the new rank's own host's memory, one each.
  std::map<std::string, std::vector<uint32_t>> in_memory;  // host -> ranks
  std::vector<uint32_t> restorable;  // from memory, a peer or storage
  auto st = job.steps.find(*step);
  if (st != job.steps.end())
    for (const auto& [r, shard] : st->second) {
      if (r >= saved) continue;
      if (InHostMemoryLocked(job, *step, r, &shard.node_id()))
        in_memory[shard.node_id()].push_back(r);
      else if (SourceOfLocked(job, *step, r, &shard.node_id()).kind ==
               CopySource::kNone)
        continue;
      restorable.push_back(r);
    }
  for (auto& [host, ranks] : in_memory)
    std::reverse(ranks.begin(), ranks.end());
  for (uint32_t i = 0; i < world; ++i) {
    auto m = in_memory.find(rec.rank_node(i));
    if (m == in_memory.end() || m->second.empty()) continue;
    from[i] = m->second.back();
    m->second.pop_back();
    ++uses[from[i]];
  }
  // Then the saved ranks nobody restores yet, then any (a grown job
  // restores some twice); the manifest names every shard (storage).
  std::vector<uint32_t> order = std::move(restorable);  // ascending ranks
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return uses[a] < uses[b]; });
  size_t next = 0;
  for (uint32_t i = 0; i < world; ++i) {
    if (from[i] != kNone) continue;
    from[i] = order.empty() ? i % saved : order[next++ % order.size()];
    ++uses[from[i]];
  }
  std::vector<std::string> pairs;
  for (uint32_t i = 0; i < world; ++i) {
    rec.add_restore_ranks(from[i]);
    if (pairs.size() < 64) pairs.push_back(absl::StrCat(i, "<-", from[i]));
  }
  if (world > pairs.size()) pairs.push_back("...");
  return absl::StrJoin(pairs, ",");
}

void Coordinator::DetectSpareWaitsLocked(Batch* batch, int64_t now) {
  if (options_.spare_wait_ms <= 0) return;
  for (auto& [name, job] : jobs_) {
    if (job.rec.plan_state() != v1::PLAN_WAITING_FOR_NODE ||
        job.spare_wait_over || !Elastic(job.rec, FullWorldSize(job.rec)))
      continue;
    // Waiting since before this process loaded the state: from now.
    if (job.no_host_since_ms == 0) job.no_host_since_ms = now;
    const int64_t due = job.no_host_since_ms + options_.spare_wait_ms;
    if (now < due) {
      LowerNextExpiryLocked(due);
      continue;
    }
    job.spare_wait_over = true;  // shrinks now, or waits for a node
    MakePlanLocked(batch, job,
                   absl::StrCat("no spare took ranks ",
                                absl::StrJoin(job.rec.lost_ranks(), ","),
                                " within ", options_.spare_wait_ms, " ms"));
  }
}

}  // namespace ckpt::coordinator
