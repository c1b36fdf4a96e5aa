// Recovery of a restarted daemon from its catalog and shared memory.
// See recovery.h.
#include "daemon/engine/recovery.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/core/engine_util.h"
#include "storage/manifest.h"
#include "storage/shard_format.h"
#include "storage/shard_image.h"
#include "storage/shard_reader.h"
#include "util/status.h"

namespace ckpt::daemon {
namespace {

// The image in a re-attached slot, if it is the save `rec` records (its
// index `want`): the same shard, tensors at the same offsets and, where
// the client computed them, the same checksums. Returns the image's index.
absl::StatusOr<storage::ShardInfo> SlotImageOf(const char* slot,
                                               uint64_t slot_bytes,
                                               const catv1::ShardRecord& rec,
                                               const storage::ShardInfo& want) {
  if (rec.image_bytes() > slot_bytes)
    return absl::DataLossError("the record's image exceeds the slot");
  CKPT_ASSIGN_OR_RETURN(
      storage::ShardInfo got,
      storage::ValidateImage({slot, rec.image_bytes()},
                             {rec.job(), rec.step(), rec.rank()}, "slot"));
  CKPT_RETURN_IF_ERROR(
      storage::SameIndex(got, want, KnownChecksums(rec.tensors()), "slot"));
  return got;
}

// The index of the shard file at `key` if the file is the save `rec`
// records (its index `want`): the same shard, tensors and client checksums
// and, where the record has it, the same commit time. A re-save of a step
// (after a rollback) leaves the older save's file at the key until its own
// persist replaces it, and device tensors have no client checksum to tell
// the two apart. The file's index has the device tensors' checksums too.
absl::StatusOr<storage::ShardInfo> ShardFileOf(storage::Backend& backend,
                                               const catv1::ShardRecord& rec,
                                               const storage::ShardInfo& want,
                                               const std::string& key) {
  CKPT_ASSIGN_OR_RETURN(storage::ShardInfo info,
                        storage::ReadShardInfo(backend, key));
  auto other = [&](const std::string& why) {
    return absl::DataLossError(
        absl::StrCat(key, ": ", why, "; not the save the catalog records"));
  };
  if (info.job != rec.job() || info.step != rec.step() ||
      info.rank != rec.rank())
    return other("holds another shard");
  if (rec.created_unix_ns() != 0 &&
      info.created_unix_ns != rec.created_unix_ns())
    return other(absl::StrCat("committed at ", info.created_unix_ns,
                              " ns, not ", rec.created_unix_ns()));
  if (info.layout.image_bytes != rec.image_bytes())
    return other("another tensor index");
  absl::Status same =
      storage::SameIndex(info, want, KnownChecksums(rec.tensors()), key);
  if (!same.ok()) return Annotate(same, "not the save the catalog records");
  return info;
}

// One job of the catalog: its arenas re-attached, its shards found in
// them or in their files, and what is not yet durable queued again.
void RecoverJob(NodeState& node, Job& job,
                std::vector<catv1::ShardRecord> shards)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const std::string& name = job.rec.job();
  for (const auto& [r, slot_bytes] : job.rec.arena_slot_bytes()) {
    shm::ArenaOptions expect;
    expect.name = node.ArenaName(name, r);
    expect.job = name;
    expect.rank = r;
    // A saved rank of a larger world size (a resized job) keeps its arena.
    expect.world_size = std::max(job.rec.world_size(), r + 1);
    expect.slot_bytes = slot_bytes;
    expect.num_slots = job.rec.num_slots();
    expect.user_uid = job.rec.uid();
    expect.huge_dir = node.options.huge_dir;
    auto arena = shm::Arena::Reattach(expect);
    if (!arena.ok()) {
      LogWarning(
          absl::StrCat("job ", name, " rank ", r,
                       ": cannot re-attach arena: ", arena.status().message()));
      continue;
    }
    RankSlots& rank = job.ranks[r];
    rank.Reattach(std::move(*arena));
    rank.registered = node.backend
                          ->RegisterMemory(rank.arena->slot_data(0),
                                           uint64_t{rank.arena->num_slots()} *
                                               rank.arena->slot_bytes())
                          .ok();
  }
  size_t requeued = 0, in_memory = 0, lost = 0;
  for (catv1::ShardRecord& recorded : shards) {
    Shard sh;
    sh.gen = node.table.NextGen();
    sh.rec = std::move(recorded);
    catv1::ShardRecord& rec = sh.rec;
    sh.Start(PhaseOfRecord(rec.state()));
    sh.info = ToShardInfo(name, rec.step(), rec.rank(), rec.world_size(),
                          rec.tensors());
    if (!storage::ValidateShardInfo(&sh.info).ok()) {
      LogWarning(absl::StrCat(
          "job ", name, " step ", rec.step(), " rank ", rec.rank(),
          ": the catalog's tensor index does not validate; dropped"));
      (void)node.catalog->DeleteShard(name, rec.step(), rec.rank());
      ++lost;
      continue;
    }
    // The digest its STAGED report named, which every later report of the
    // save repeats (the catalog keeps it; an older record has none, and a
    // staged one's is then that of the index as committed, as the commit
    // computed it).
    if (rec.has_staged_digest())
      sh.staged_digest = rec.staged_digest();
    else if (sh.phase == ShardPhase::kStaged)
      sh.staged_digest = storage::ChecksumsDigest(sh.info);
    sh.uploaded = rec.uploaded() && node.object != nullptr;
    sh.local_gone = rec.local_gone();
    auto rank = job.ranks.find(rec.rank());
    absl::StatusOr<storage::ShardInfo> image = absl::NotFoundError("no slot");
    if (rank != job.ranks.end() && rec.slot() < rank->second.slots.size() &&
        rank->second.slots[rec.slot()].state == shm::SlotState::kFree)
      image = SlotImageOf(rank->second.arena->slot_data(rec.slot()),
                          rank->second.arena->slot_bytes(), rec, sh.info);
    if (image.ok()) {
      sh.slot = static_cast<int>(rec.slot());
      // The image's header has the commit time the index does not carry.
      sh.info.created_unix_ns = image->created_unix_ns;
      rank->second.Hold(rec.slot(), SlotStateOf(sh.phase), rec.step(), sh.gen,
                        rec.image_bytes());
      ++in_memory;
    }
    const std::string key = node.NodeShardKey(name, rec.step(), rec.rank());
    if (sh.slot < 0 && sh.phase != ShardPhase::kDurable) {
      // Not in memory any more; the file may have made it before the crash.
      absl::StatusOr<storage::ShardInfo> file =
          ShardFileOf(*node.backend, rec, sh.info, key);
      if (file.ok()) {
        sh.info = std::move(*file);
        ToTensorMetas(sh.info, rec.mutable_tensors());
        rec.set_path(key);
        sh.MoveTo(ShardPhase::kDurable);  // adopted
        (void)node.catalog->PutShard(rec, /*sync=*/true);
      } else {
        LogWarning(absl::StrCat(
            "job ", name, " step ", rec.step(), " rank ", rec.rank(),
            ": staged in memory before the restart and lost with it (",
            file.status().message(), ")"));
        (void)node.catalog->DeleteShard(name, rec.step(), rec.rank());
        ++lost;
        continue;
      }
    }
    if (sh.phase == ShardPhase::kStaged) {
      node.persister->Push(PersistTask{
          PersistTask::kShard, name, rec.step(), rec.rank(), sh.gen, {}});
      ++requeued;
    }
    if (node.object != nullptr && sh.phase == ShardPhase::kDurable &&
        !sh.uploaded)
      node.QueueUpload(job, sh);
    node.recovered.push_back({name, sh.rec.step(), sh.rec.rank(), sh.gen});
    job.steps[sh.rec.step()].shards[sh.rec.rank()] = std::move(sh);
  }
  for (auto& [n, step] : job.steps) {
    bool durable = false;
    if (!node.table.StepComplete(job, step, &durable) || !durable) continue;
    bool local_gone = false, uploaded = true;
    for (const auto& [r, shard] : step.shards) {
      local_gone = local_gone || shard.local_gone;
      uploaded = uploaded && shard.uploaded;
    }
    // A step whose local copy retention deleted gets no local manifest again.
    if (!local_gone) {
      if (node.backend->Stat(node.NodeManifestKey(name, n)).ok())
        step.manifest = true;
      else
        node.persister->Push(
            PersistTask{PersistTask::kManifest, name, n, 0, 0, {}});
    }
    if (node.object == nullptr || !uploaded) continue;
    if (node.object->Stat(node.NodeManifestKey(name, n)).ok())
      step.object_manifest = true;
    else
      node.uploader->Push(UploadTask{UploadTask::kManifest,
                                     name,
                                     n,
                                     0,
                                     0,
                                     0,
                                     {node.NodeManifestKey(name, n)}});
  }
  LogInfo(absl::StrCat("recovered job ", name, ": ", shards.size(), " shards, ",
                       in_memory, " in memory, ", requeued, " to persist, ",
                       lost, " lost"));
}

}  // namespace

absl::Status RecoverFromCatalog(NodeState& node) {
  CKPT_RETURN_IF_ERROR(
      node.shard_drops->Recover());  // before any write of those keys
  CKPT_ASSIGN_OR_RETURN(std::vector<catv1::JobRecord> jobs,
                        node.catalog->Jobs());
  for (catv1::JobRecord& rec : jobs) {
    CKPT_ASSIGN_OR_RETURN(std::vector<catv1::ShardRecord> shards,
                          node.catalog->Shards(rec.job()));
    Job job;
    job.rec = std::move(rec);
    RecoverJob(node, job, std::move(shards));
    node.table.Add(std::move(job));
  }
  return absl::OkStatus();
}

void ReportRecovered(NodeState& node) {
  NodeState::Section lock(&node);
  std::vector<NodeState::RecoveredShard> recovered;
  recovered.swap(node.recovered);
  size_t reported = 0;
  for (const NodeState::RecoveredShard& r : recovered) {
    const Shard* shard = node.table.FindShard(r.job, r.step, r.rank);
    // Replaced by a newer save (reported by its commit), dropped, or failed.
    if (shard == nullptr || shard->gen != r.gen ||
        shard->phase == ShardPhase::kFailed)
      continue;
    // STAGED first: the coordinator takes a DURABLE report only of a save
    // this node staged under the same epoch. A persist that ends later
    // reports DURABLE itself.
    node.ReportShard(*shard, /*durable=*/false);
    if (node.CommitDurable(*shard)) node.ReportShard(*shard, /*durable=*/true);
    ++reported;
  }
  if (reported > 0)
    LogInfo(absl::StrCat("reported ", reported,
                         " shards recovered at start to the coordinator"));
}

}  // namespace ckpt::daemon
