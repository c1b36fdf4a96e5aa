// Loads into a rank's arena: a durable shard into a free slot for a
// restore (LoadShard, the bytes read from the local tier or the object
// tier, verified as they arrive) and a coordinator's PREFETCH. See
// restorer.h.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/core/engine_util.h"
#include "daemon/engine/chunk_tap.h"
#include "daemon/engine/restorer.h"
#include "storage/keys.h"
#include "storage/manifest.h"
#include "storage/shard_format.h"
#include "storage/shard_image.h"
#include "storage/shard_reader.h"
#include "util/checksum.h"
#include "util/status.h"
#include "util/validate.h"

namespace ckpt::daemon {
namespace {

// Reads the object of `bytes` bytes into dst and checks every tensor's
// checksum, each as soon as its last byte is in, on the thread that
// brought that byte, while the other requests are still on the wire: a
// pass over the image after the reads would add its whole time to the
// restore. The chunks' hashes are taken as the bytes come in (ChunkTap),
// so the check reads the slot only for chunks a transfer did not show
// whole. The error of a mismatch is VerifyTensorChecksum's on the slot's
// bytes (the lowest mismatching tensor's when several mismatch).
// `file`: dst maps that file (ObjectReader::ReadAtNotifyToFile).
// `progress` (may be null) is told of each tensor that verified.
// *seen_whole: how many checksum chunks were hashed as they came in, of how
// many.
absl::Status ReadVerified(storage::ObjectReader& reader,
                          const storage::ShardInfo& info,
                          const std::string& key, char* dst, uint64_t bytes,
                          const storage::ObjectReader::DestFile& file,
                          Restorer::LoadProgress* progress,
                          std::pair<size_t, size_t>* seen_whole) {
  const size_t n = info.tensors.size();
  std::vector<std::atomic<uint64_t>> left(n);
  for (size_t i = 0; i < n; ++i) left[i].store(info.tensors[i].bytes);
  ChunkTap tap(info);
  std::mutex mu;
  size_t bad_index = n;
  absl::Status bad;
  auto verify = [&](size_t i) {
    absl::Status s;
    if (tap.Checksum(i, dst) != info.tensors[i].checksum)
      s = storage::VerifyTensorChecksum(dst, info, key, i);  // the message
    if (s.ok()) {
      if (progress != nullptr) progress->Verified(static_cast<uint32_t>(i));
      return;
    }
    std::lock_guard<std::mutex> lock(mu);
    if (i < bad_index) bad_index = i, bad = std::move(s);
  };
  auto arrived = [&](uint64_t off, uint64_t len) {
    for (size_t i = 0; i < n; ++i) {
      const uint64_t a = info.tensors[i].offset;
      const uint64_t b = a + info.tensors[i].bytes;
      const uint64_t lo = std::max(a, off), hi = std::min(b, off + len);
      if (lo >= hi) continue;
      if (left[i].fetch_sub(hi - lo) == hi - lo) verify(i);  // the last piece
    }
  };
  auto seen = [&](uint64_t piece, uint64_t at, const char* data, size_t len) {
    tap.Seen(piece, at, data, len);
  };
  CKPT_RETURN_IF_ERROR(
      reader.ReadAtNotifyToFile(0, dst, bytes, file, arrived, seen));
  // Tensors no piece completed (empty ones; any the image does not hold,
  // which the image's validation refuses) are checked here.
  for (size_t i = 0; i < n; ++i)
    if (left[i].load() != 0 || info.tensors[i].bytes == 0) verify(i);
  *seen_whole = tap.SeenWhole();
  return bad;
}

}  // namespace

absl::StatusOr<Shard*> Restorer::LoadShard(const std::string& job_name,
                                           uint64_t step_no, uint32_t rank_no,
                                           double* load_s, bool* from_object,
                                           LoadProgress* progress,
                                           Prefaulter::ReadHold* read) {
  Shard* shard = node_.table.FindShard(job_name, step_no, rank_no);
  const uint64_t gen = shard->gen;
  const uint64_t bytes = shard->rec.image_bytes();
  const std::string key = shard->rec.path();
  const bool local = !shard->local_gone;
  const bool object = node_.object != nullptr && shard->uploaded;
  const storage::ShardInfo info = shard->info;
  bool read_object = false;
  auto changed = [] {
    return absl::AbortedError("load: the step changed meanwhile; retry");
  };
  // The time until the read starts (an arena to create, a slot to wait
  // for) is logged beside the read's.
  const auto start = std::chrono::steady_clock::now();
  // Load the shard file into a slot: one read, then the client copies.
  // The prefaulter waits meanwhile (prefaulter.h): the arena created for
  // the load queues its other slots, whose zeroing would compete with the
  // read for the CPU. Not while this waits for a slot it may ready.
  Prefaulter::Hold hold_prefaulter(node_.prefaulter.get());
  auto deadline =
      std::chrono::steady_clock::now() + node_.options.default_busy_timeout;
  Rank* rank = nullptr;
  int slot = -1;
  for (;;) {
    // The lock is released while an arena is created and while waiting for
    // a slot: the job, the rank and the shard are found again each time.
    Job* j = node_.table.Find(job_name);
    if (j == nullptr) return changed();
    Job* job = j;
    shard = node_.table.FindShard(job_name, step_no, rank_no);
    if (shard == nullptr || shard->gen != gen) return changed();
    if (shard->slot >= 0) return shard;  // another request loaded it
    auto existing = job->ranks.find(rank_no);
    if (existing == job->ranks.end() || !existing->second.arena ||
        existing->second.creating ||
        existing->second.arena->slot_bytes() < bytes) {
      uint64_t need = std::max<uint64_t>(bytes, job->rec.slot_bytes());
      // A load that may come from the object tier writes through the
      // file (a local one faults the slot in first: ReadShardImage).
      CKPT_RETURN_IF_ERROR(
          node_
              .EnsureArena(job_name, rank_no, need,
                           object ? NodeState::ArenaFor::kObjectLoad
                                  : NodeState::ArenaFor::kLoad)
              .status());
      continue;
    }
    rank = &existing->second;
    slot = rank->PickSlot();
    if (slot >= 0) break;
    if (!rank->reserve_error.ok())
      return absl::ResourceExhaustedError(
          absl::StrCat("BUSY: no usable slot to load the shard into: ",
                       rank->reserve_error.message()));
    hold_prefaulter.Release();
    const bool woken = node_.table.WaitUntil(JobTable::Waiter::kSlot, deadline);
    hold_prefaulter.Take();
    if (!woken)
      return absl::ResourceExhaustedError(
          "BUSY: no slot to load the shard into");
  }
  JobTable::DetachSlot(*node_.table.Find(job_name), rank_no, slot);
  rank->BeginWrite(slot, step_no, bytes, /*lease=*/0, /*writer_pid=*/0);
  char* dst = rank->arena->slot_data(slot);
  const std::shared_ptr<shm::Arena> arena = rank->arena;
  // A slot left unfaulted for it is written through the segment's file.
  SlotLeftToFile to_file;
  if (arena->slot_left_to_file(slot))
    to_file = {arena.get(), static_cast<uint32_t>(slot)};
  // Where the slot is, for a client that copies tensors as they verify.
  // Progress names tensors by their index in the image (info), which the
  // client looks up in the record's: without the same order, none is sent.
  const auto& metas = shard->rec.tensors();
  bool same_order = static_cast<size_t>(metas.size()) == info.tensors.size();
  for (size_t i = 0; same_order && i < info.tensors.size(); ++i)
    same_order =
        metas[static_cast<int>(i)].offset() == info.tensors[i].offset &&
        metas[static_cast<int>(i)].bytes() == info.tensors[i].bytes;
  if (!same_order) progress = nullptr;
  v1::OpenRestoreResponse where;
  if (progress != nullptr) {
    where.set_shm_name(arena->name());
    where.set_arena_bytes(arena->size());
    where.set_slot_offset(arena->slot_offset(slot));
    where.set_image_bytes(bytes);
    *where.mutable_tensors() = shard->rec.tensors();
  }
  node_.table.Unlock();
  if (progress != nullptr) progress->Started(std::move(where));
  auto t0 = std::chrono::steady_clock::now();
  absl::Status st = ReadShardImage(key, local, object, info, dst, bytes,
                                   &read_object, to_file, progress);
  if (st.ok())
    st = storage::ValidateImage({dst, bytes}, {job_name, step_no, rank_no}, key)
             .status();
  // The job's uid may have truncated the arena under the load.
  if (absl::Status a = arena->CheckIntact(); !a.ok()) st = a;
  *load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                .count();
  // The restore's client copies next: the arena's other slots wait on
  // (prefaulter.h).
  if (st.ok() && read != nullptr)
    read->Take(node_.prefaulter.get(), arena->name());
  hold_prefaulter.Release();
  if (from_object != nullptr) *from_object = read_object;
  LogInfo(absl::StrCat(
      "load ", key, read_object ? " (object tier)" : "", ": slot ready in ",
      std::chrono::duration<double>(t0 - start).count(), " s, read ", bytes,
      " bytes in ", *load_s, " s", st.ok() ? "" : ": ", st.message()));
  node_.table.Relock();
  // The job, rank or shard may have changed while the lock was released
  // (a slot in state kWriting is never replaced, so the arena is the same).
  Job* j = node_.table.Find(job_name);
  Rank* r = nullptr;
  if (j != nullptr && j->ranks.count(rank_no)) r = &j->ranks[rank_no];
  bool slot_ok = r && r->arena && r->arena->slot_data(slot) == dst;
  if (slot_ok) {
    r->Free(slot);
  }
  node_.table.Wake(JobTable::Waiter::kSlot);
  Shard* cur = node_.table.FindShard(job_name, step_no, rank_no);
  if (!st.ok() || !slot_ok || !cur || cur->gen != gen) {
    node_.MaybeForgetJob(job_name);
    if (!st.ok()) return Annotate(st, "load from storage");
    return changed();
  }
  r->Hold(slot, SlotStateOf(cur->phase), step_no, gen, bytes);
  cur->slot = slot;
  cur->slot_copy = read_object ? ShardCopy::kObject : ShardCopy::kFile;
  return cur;
}

absl::Status Restorer::ReadShardImage(const std::string& key, bool local,
                                      bool object,
                                      const storage::ShardInfo& info, char* dst,
                                      uint64_t bytes, bool* from_object,
                                      const SlotLeftToFile& to_file,
                                      LoadProgress* progress) {
  auto read = [&](storage::Backend& b) -> absl::Status {
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<storage::ObjectReader> reader,
                          b.NewObjectReader(key));
    if (reader->size() != bytes)
      return absl::DataLossError(absl::StrCat(
          key, ": ", reader->size(), " bytes, the catalog recorded ", bytes));
    // A local read lands through the mapping: the slot's pages are faulted
    // in first, on several threads, as the arena's creation would have.
    if (to_file.arena != nullptr)
      CKPT_RETURN_IF_ERROR(to_file.arena->ReserveSlots(to_file.slot, 1));
    return reader->ReadAt(0, dst, bytes);
  };
  storage::ObjectReader::DestFile file;
  if (to_file.arena != nullptr)
    file = {to_file.arena->slot_file(),
            to_file.arena->slot_offset(to_file.slot)};
  *from_object = false;
  absl::Status s = absl::NotFoundError(key + ": no local copy");
  if (local) s = read(*node_.backend);
  if (s.ok() || !object) return s;
  if (local)
    LogWarning(absl::StrCat("load ", key, ": local copy unreadable (",
                            s.message(), "); reading the object tier"));
  *from_object = true;
  auto t0 = std::chrono::steady_clock::now();
  std::pair<size_t, size_t> seen_whole{0, 0};
  s = [&]() -> absl::Status {
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<storage::ObjectReader> reader,
                          node_.object->NewObjectReader(key));
    if (reader->size() != bytes)
      return absl::DataLossError(absl::StrCat(
          key, ": ", reader->size(), " bytes, the catalog recorded ", bytes));
    return ReadVerified(*reader, info, key, dst, bytes, file, progress,
                        &seen_whole);
  }();
  LogInfo(absl::StrFormat(
      "load %s from the object tier: GETs and checksums %.3f s (%u of %u "
      "checksum chunks hashed as they came in)",
      key,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count(),
      seen_whole.first, seen_whole.second));
  return Annotate(s, absl::StrCat("object tier (", node_.object->name(), ")"));
}

absl::Status Restorer::Prefetch(const std::string& job_name,
                                uint32_t world_size, uint64_t step,
                                uint32_t rank, const std::string& key,
                                std::optional<uint32_t> owner_uid) {
  CKPT_RETURN_IF_ERROR(ValidateJobName(job_name));
  if (world_size == 0 || world_size > node_.options.max_world_size ||
      rank >= world_size)
    return absl::InvalidArgumentError(absl::StrCat(
        "world_size: ", world_size, " with rank ", rank, " is not valid"));
  if (!storage::IsShardKeyOf(key, job_name, step, rank))
    return absl::InvalidArgumentError(
        absl::StrCat("shard_key: \"", key, "\" is not the key of job '",
                     job_name, "' step ", step, " rank ", rank));
  // Without a shared directory the shard is in the object tier (the
  // shared root there); a local copy wins when there is one.
  storage::Backend* source = node_.backend;
  if (node_.object != nullptr && !node_.backend->Stat(key).ok())
    source = node_.object;
  // Read and check the header and index before touching any state.
  CKPT_ASSIGN_OR_RETURN(storage::ShardInfo info,
                        storage::ReadShardInfo(*source, key));
  if (info.job != job_name || info.step != step || info.rank != rank ||
      info.world_size != world_size)
    return absl::DataLossError(absl::StrCat(
        key, ": holds job '", info.job, "' step ", info.step, " rank ",
        info.rank, " of ", info.world_size, ", not the one ordered"));
  // The file's owner is only a guess for an older coordinator's order: an
  // object store has none, and a root-squashed NFS says "nobody".
  uint32_t uid = 0;
  if (owner_uid) {
    uid = *owner_uid;
  } else if (auto object = source->Stat(key);
             object.ok() && object->owner_uid) {
    uid = *object->owner_uid;
  }

  Section lock(&node_);
  if (node_.draining) return absl::UnavailableError("ckptd is shutting down");
  // The records are written in order outside the lock; the prefetch fails if
  // they could not be (the shard is then only in memory here).
  std::vector<uint64_t> tickets;
  if (node_.table.Find(job_name) == nullptr) {
    Job job;
    job.rec.set_job(job_name);
    job.rec.set_world_size(world_size);
    job.rec.set_uid(uid);
    job.rec.set_num_slots(node_.options.default_num_slots);
    job.rec.set_life_ns(NewJobLife());
    CatalogEdit edit;
    edit.PutJob(job.rec);
    tickets.push_back(node_.QueueEdit(std::move(edit), NodeState::kMemoryOnly));
    node_.table.Add(std::move(job));
  }
  Job& job = *node_.table.Find(job_name);
  job.forget_when_idle = false;
  // A resized job (elastic continuation) fetches shards saved at another
  // world size than the one its trainers run at: each shard carries its
  // own (checked against the order above).
  auto existing = job.steps.find(step);
  if (existing != job.steps.end() && existing->second.shards.count(rank)) {
    Shard& have = existing->second.shards[rank];
    const uint64_t ordered = storage::ChecksumsDigest(info);
    if (!IsOrderedSave(have, world_size, std::span(&ordered, 1))) {
      // This node's own save of the step in a timeline the job abandoned
      // (its file stays: another key, retention's to delete).
      LogWarning(
          absl::StrCat("prefetch job ", job_name, " step ", step, " rank ",
                       rank, ": this node's save of it (world size ",
                       have.rec.world_size(), ") is not the one ordered (", key,
                       ", world size ", world_size, "): dropped for it"));
      node_.DropShard(job, step, rank, false);
    } else if (have.slot >= 0) {
      return absl::OkStatus();  // already in memory
    } else if (have.phase != ShardPhase::kDurable) {
      node_.DropShard(job, step, rank, false);
    }
  }
  // Newer shards of this rank belong to a timeline the plan abandoned.
  std::vector<uint64_t> newer;
  for (const auto& [n, s] : job.steps)
    if (n > step && s.shards.count(rank)) newer.push_back(n);
  for (uint64_t n : newer) node_.DropShard(job, n, rank, /*delete_file=*/false);

  Step& target = job.steps[step];
  if (!target.shards.count(rank)) {
    Shard shard;
    shard.rec.set_job(job_name);
    shard.rec.set_step(step);
    shard.rec.set_rank(rank);
    shard.rec.set_world_size(world_size);
    shard.Start(ShardPhase::kDurable);  // a prefetched shard starts durable
    shard.rec.set_image_bytes(info.layout.image_bytes);
    shard.rec.set_path(key);
    ToTensorMetas(info, shard.rec.mutable_tensors());
    shard.info = info;
    shard.gen = node_.table.NextGen();
    if (source == node_.object) {
      // Only in the object tier: never uploaded again, never read locally.
      shard.uploaded = true;
      shard.local_gone = true;
      shard.rec.set_uploaded(true);
      shard.rec.set_local_gone(true);
    }
    // Not synced (kMemoryOnly): the file is the writer's, synced by it;
    // this record only says that this node holds it in memory.
    CatalogEdit edit;
    edit.PutShard(shard.rec);
    tickets.push_back(node_.QueueEdit(std::move(edit), NodeState::kMemoryOnly));
    target.shards[rank] = std::move(shard);
  }
  double load_s = 0;
  absl::Status loaded = LoadShard(job_name, step, rank, &load_s).status();
  lock.Unlock();
  for (uint64_t t : tickets) CKPT_RETURN_IF_ERROR(node_.writer->Wait(t));
  CKPT_RETURN_IF_ERROR(loaded);
  LogInfo(absl::StrCat("prefetched ", key, " (", info.layout.image_bytes,
                       " bytes) in ", load_s, " s"));
  return absl::OkStatus();
}

}  // namespace ckpt::daemon
