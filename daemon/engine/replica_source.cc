// Peer replicas on this node's side (doc/replicas.md): what the replicate
// stage and the replica listener read of this node's staged shards
// (StagedShards, staged_shards.h), and a PREFETCH's fetch of a shard from
// a peer straight into the slot the trainer restores from, which
// OpenRestore waits for instead of failing. See replica_source.h.
#include "daemon/engine/replica_source.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/core/engine_util.h"
#include "daemon/replica/replica_service.h"
#include "daemon/replica/replica_store.h"
#include "storage/keys.h"
#include "storage/manifest.h"
#include "storage/shard_image.h"
#include "util/checksum.h"
#include "util/status.h"
#include "util/validate.h"

namespace ckpt::daemon {

namespace rv1 = ::ckpt::replica::v1;

namespace {

// DataLoss naming `copy` unless the peer's copy is of the job, step,
// rank and world size ordered, and well formed.
absl::Status CheckOrderedCopy(const rv1::ShardCopy& copy,
                              const std::string& job, uint32_t world_size,
                              uint64_t step, uint32_t rank) {
  if (copy.job() != job || copy.step() != step || copy.rank() != rank ||
      copy.world_size() != world_size)
    return absl::DataLossError(
        absl::StrCat("copy: the peer sent job '", copy.job(), "' step ",
                     copy.step(), " rank ", copy.rank(), " of ",
                     copy.world_size(), ", not the one ordered"));
  return ValidateShardCopy(copy, "copy.");
}

// DataLoss naming `digest` unless the copy's checksums digest to one of
// the save's (`save_digests`, not empty): another save of the step.
absl::Status CheckSaveDigest(const storage::ShardInfo& info,
                             const std::vector<uint64_t>& save_digests,
                             const std::string& job, uint64_t step,
                             uint32_t rank) {
  const uint64_t digest = storage::ChecksumsDigest(info);
  if (std::find(save_digests.begin(), save_digests.end(), digest) !=
      save_digests.end())
    return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      "digest: the peer's copy of job '", job, "' step ", step, " rank ", rank,
      " is another save (digest ", storage::DigestHex(digest),
      "), not the one the plan chose (",
      storage::DigestHex(save_digests.front()), ")"));
}

}  // namespace

absl::StatusOr<StagedCopy> ReplicaSource::SnapshotStaged(
    const std::string& job_name, std::optional<uint64_t> step,
    uint32_t rank_no) {
  Section lock(&node_);
  Job* job = node_.table.Find(job_name);
  const Shard* shard = nullptr;
  if (job != nullptr && step) {
    shard = node_.table.FindShard(job_name, *step, rank_no);
  } else if (job != nullptr) {
    for (auto it = job->steps.rbegin(); it != job->steps.rend(); ++it)
      if (auto sh = it->second.shards.find(rank_no);
          sh != it->second.shards.end()) {
        shard = &sh->second;
        break;
      }
  }
  if (shard == nullptr || shard->slot < 0 ||
      shard->phase == ShardPhase::kFailed)
    return absl::NotFoundError(absl::StrCat(
        "step: job '", job_name, "' rank ", rank_no, " has no shard of step ",
        step ? absl::StrCat(*step) : "any", " in memory here"));
  const std::vector<bool> known = KnownChecksums(shard->rec.tensors());
  if (std::find(known.begin(), known.end(), false) != known.end())
    return absl::UnavailableError(
        "checksums: a device tensor's checksum is computed by the persist");
  const RankSlots& rank = job->ranks[rank_no];
  StagedCopy snap;
  snap.arena = rank.arena;
  snap.slot = shard->slot;
  snap.write_no = rank.slots[shard->slot].write_no;
  rv1::ShardCopy& c = snap.copy;
  c.set_job(job_name);
  c.set_step(shard->rec.step());
  c.set_rank(rank_no);
  // The world size the shard was saved at (a resized job's trainers run
  // at another); records before it was kept: the job's.
  c.set_world_size(shard->rec.world_size() != 0 ? shard->rec.world_size()
                                                : job->rec.world_size());
  c.set_generation(shard->rec.generation());
  c.set_image_bytes(shard->rec.image_bytes());
  for (const storage::ShardTensor& t : shard->info.tensors)
    c.add_checksums(t.checksum);
  c.set_owner_uid(job->rec.uid());
  c.set_job_life(job->rec.life_ns());
  for (const v1::TensorMeta& m : shard->rec.tensors())
    snap.chunk_hashes.emplace_back(m.chunk_hashes().begin(),
                                   m.chunk_hashes().end());
  return snap;
}

bool ReplicaSource::StagedUnchanged(const std::string& job_name,
                                    uint32_t rank_no, const StagedCopy& snap) {
  Section lock(&node_);
  Job* job = node_.table.Find(job_name);
  if (job == nullptr) return false;
  auto rank = job->ranks.find(rank_no);
  return rank != job->ranks.end() && rank->second.arena == snap.arena &&
         rank->second.slots[snap.slot].write_no == snap.write_no;
}

void ReplicaSource::BeginFetches(const std::string& job, uint64_t step,
                                 const std::vector<uint32_t>& ranks) {
  Section lock(&node_);
  for (uint32_t r : ranks) node_.table.BeginFetch(job, step, r);
}

void ReplicaSource::EndFetch(const std::string& job, uint64_t step,
                             uint32_t rank) {
  Section lock(&node_);
  node_.table.EndFetch(job, step, rank);
}

absl::StatusOr<char*> ReplicaSource::TakeSlot(
    const std::string& job_name, uint32_t world_size, uint64_t step,
    uint32_t rank_no, std::optional<uint32_t> owner_uid,
    const rv1::ShardCopy& copy, std::vector<uint64_t>* tickets,
    std::shared_ptr<shm::Arena>* arena, int* slot, bool* have,
    std::span<const uint64_t> save_digests) {
  const uint64_t bytes = copy.image_bytes();
  Section lock(&node_);
  if (node_.draining) return absl::UnavailableError("ckptd is shutting down");
  if (node_.table.Find(job_name) == nullptr) {
    Job job;
    job.rec.set_job(job_name);
    job.rec.set_world_size(world_size);
    job.rec.set_uid(owner_uid.value_or(copy.owner_uid()));
    job.rec.set_num_slots(node_.options.default_num_slots);
    job.rec.set_life_ns(NewJobLife());
    CatalogEdit edit;
    edit.PutJob(job.rec);
    tickets->push_back(
        node_.QueueEdit(std::move(edit), NodeState::kMemoryOnly));
    node_.table.Add(std::move(job));
  }
  Job* job = node_.table.Find(job_name);
  job->forget_when_idle = false;
  // (A resized job fetches shards of another world size than its
  // trainers': the copy's own is checked by the caller.)
  if (const Shard* s = node_.table.FindShard(job_name, step, rank_no);
      have != nullptr && s != nullptr) {
    if (!IsOrderedSave(*s, world_size, save_digests)) {
      // This node's own save of the step in a timeline the job abandoned
      // (its file stays: another key, retention's to delete).
      LogWarning(absl::StrCat("fetch job ", job_name, " step ", step, " rank ",
                              rank_no, ": this node's save of it (world size ",
                              s->rec.world_size(),
                              ") is not the one ordered (world size ",
                              world_size, "): dropped for it"));
      node_.DropShard(*job, step, rank_no, /*delete_file=*/false);
    } else if (s->slot >= 0) {
      *have = true;
      return absl::AlreadyExistsError("in memory already");
    }
  }
  const auto deadline =
      std::chrono::steady_clock::now() + node_.options.default_busy_timeout;
  for (;;) {
    job = node_.table.Find(job_name);
    if (job == nullptr) return absl::AbortedError("job: deleted meanwhile");
    auto r = job->ranks.find(rank_no);
    if (r == job->ranks.end() || !r->second.arena || r->second.creating ||
        r->second.arena->slot_bytes() < bytes) {
      CKPT_RETURN_IF_ERROR(
          node_
              .EnsureArena(job_name, rank_no,
                           std::max<uint64_t>(bytes, job->rec.slot_bytes()),
                           NodeState::ArenaFor::kLoad)
              .status());
      continue;
    }
    *slot = r->second.PickSlot();
    if (*slot >= 0) {
      JobTable::DetachSlot(*job, rank_no, *slot);
      r->second.BeginWrite(*slot, step, bytes, /*lease=*/0, /*writer_pid=*/0);
      *arena = r->second.arena;
      return (*arena)->slot_data(*slot);
    }
    if (!node_.table.WaitUntil(JobTable::Waiter::kSlot, deadline))
      return absl::ResourceExhaustedError(
          "BUSY: no slot to fetch the shard into");
  }
}

absl::Status ReplicaSource::FetchFromPeer(
    const std::string& job_name, uint32_t world_size, uint64_t step,
    uint32_t rank_no, const std::string& key, std::optional<uint32_t> owner_uid,
    const PeerFetch& fetch, std::vector<uint64_t> save_digests) {
  CKPT_RETURN_IF_ERROR(ValidateJobName(job_name));
  if (world_size == 0 || world_size > node_.options.max_world_size ||
      rank_no >= world_size)
    return absl::InvalidArgumentError(absl::StrCat(
        "world_size: ", world_size, " with rank ", rank_no, " is not valid"));
  if (!key.empty() && !storage::IsShardKeyOf(key, job_name, step, rank_no))
    return absl::InvalidArgumentError(
        absl::StrCat("shard_key: \"", key, "\" is not the key of job '",
                     job_name, "' step ", step, " rank ", rank_no));
  std::vector<uint64_t> tickets;
  std::shared_ptr<shm::Arena> arena;
  int slot = -1;
  // Where a fetch's time goes (logged): the slot (its arena created), the
  // transfer, the verification, the catalog.
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t0 = Clock::now();
  Clock::time_point slot_at = t0;
  bool have = false;  // already in memory here
  // Called with the copy's description once the peer answers: the slot
  // is taken then, when its size is known, and filled with no lock held.
  auto dst_for = [&](const rv1::ShardCopy& copy) -> absl::StatusOr<char*> {
    CKPT_RETURN_IF_ERROR(
        CheckOrderedCopy(copy, job_name, world_size, step, rank_no));
    CKPT_ASSIGN_OR_RETURN(
        char* dst,
        TakeSlot(job_name, world_size, step, rank_no, owner_uid, copy, &tickets,
                 &arena, &slot, &have, save_digests));
    slot_at = Clock::now();
    return dst;
  };
  absl::StatusOr<rv1::ShardCopy> got = fetch(dst_for);
  if (have) return absl::OkStatus();
  const Clock::time_point got_at = Clock::now();
  absl::StatusOr<storage::ShardInfo> info =
      got.ok()
          ? VerifyReplicaImage(arena->slot_data(slot), *got,
                               absl::StrCat("peer copy of job '", job_name,
                                            "' step ", step, " rank ", rank_no))
          : absl::StatusOr<storage::ShardInfo>(got.status());
  if (info.ok() && !save_digests.empty()) {
    // Every tensor verified against the copy's own checksums; those must
    // be the save's the plan chose, not another save of the step.
    if (absl::Status st =
            CheckSaveDigest(*info, save_digests, job_name, step, rank_no);
        !st.ok())
      info = st;
  }
  const Clock::time_point verified_at = Clock::now();
  Section lock(&node_);
  Job* job = node_.table.Find(job_name);
  RankSlots* r = nullptr;
  if (job != nullptr && job->ranks.count(rank_no)) r = &job->ranks[rank_no];
  const bool slot_ok = arena && r && r->arena == arena;
  if (slot_ok) r->Free(slot);
  node_.table.Wake(JobTable::Waiter::kSlot);
  if (!info.ok() || !slot_ok) {
    node_.MaybeForgetJob(job_name);
    if (!info.ok()) return info.status();
    return absl::AbortedError("fetch: the rank's arena changed meanwhile");
  }
  // The plan's step replaces whatever this rank has of it or after it.
  std::vector<uint64_t> drop;
  for (const auto& [n, s] : job->steps)
    if (n >= step && s.shards.count(rank_no)) drop.push_back(n);
  for (uint64_t n : drop) node_.DropShard(*job, n, rank_no, false);
  Shard shard;
  shard.rec.set_job(job_name);
  shard.rec.set_step(step);
  shard.rec.set_rank(rank_no);
  shard.rec.set_world_size(world_size);
  // With a stored copy the shard is durable there already (a PREFETCH from
  // storage says the same); without one this node persists it.
  shard.Start(key.empty() ? ShardPhase::kStaged : ShardPhase::kDurable);
  if (!key.empty()) shard.rec.set_path(key);
  shard.rec.set_slot(static_cast<uint32_t>(slot));
  shard.rec.set_image_bytes(got->image_bytes());
  shard.rec.set_created_unix_ns(info->created_unix_ns);
  if (got->generation() != 0) shard.rec.set_generation(got->generation());
  ToTensorMetas(*info, shard.rec.mutable_tensors());
  shard.info = *info;
  shard.gen = node_.table.NextGen();
  shard.slot = slot;
  // Not synced: the shard's bytes are in this node's shared memory (its
  // file, if any, is the writer's and synced by it): see kMemoryOnly.
  CatalogEdit edit;
  edit.PutShard(shard.rec);
  tickets.push_back(node_.QueueEdit(std::move(edit), NodeState::kMemoryOnly));
  r->Hold(static_cast<uint32_t>(slot), SlotStateOf(shard.phase), step,
          shard.gen, got->image_bytes());
  const uint64_t gen = shard.gen;
  const bool staged = key.empty();
  if (staged) node_.ReportShard(shard, /*durable=*/false);
  job->steps[step].shards[rank_no] = std::move(shard);
  if (staged)
    node_.persister->Push(
        PersistTask{PersistTask::kShard, job_name, step, rank_no, gen, {}});
  lock.Unlock();
  for (uint64_t t : tickets) CKPT_RETURN_IF_ERROR(node_.writer->Wait(t));
  auto secs = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  LogInfo(absl::StrCat("fetched job '", job_name, "' step ", step, " rank ",
                       rank_no, " from a peer (", got->image_bytes(),
                       " bytes, verified): slot ", secs(t0, slot_at),
                       " s, transfer ", secs(slot_at, got_at), " s, verify ",
                       secs(got_at, verified_at), " s, catalog ",
                       secs(verified_at, Clock::now()), " s"));
  return absl::OkStatus();
}

absl::StatusOr<RangedSlot> ReplicaSource::FetchRangesFromPeer(
    const std::string& job_name, uint32_t world_size, uint64_t step,
    uint32_t rank_no, std::optional<uint32_t> owner_uid,
    std::span<const ImageRange> ranges, const RangeFetch& fetch,
    const std::vector<uint64_t>& save_digests) {
  // The peer's messages, in image order, into the slot `begin` takes
  // when the first (the copy's description) arrives.
  auto read = [&](const RangeBegin& begin,
                  std::vector<ImageRange>* arrived) -> absl::Status {
    char* image = nullptr;
    uint64_t image_bytes = 0;
    auto on_message = [&](rv1::RangeChunk& m) -> absl::Status {
      if (image == nullptr) {
        if (!m.has_copy())
          return absl::DataLossError(
              "copy: the first message does not describe the copy");
        std::map<uint32_t, std::vector<uint64_t>> hashes;
        for (const rv1::TensorChunkHashes& h : m.hashes()) {
          if (!hashes.empty() && hashes.rbegin()->first >= h.tensor())
            return absl::DataLossError(absl::StrCat(
                "hashes.tensor: ", h.tensor(), " is not in order"));
          hashes[h.tensor()].assign(h.hashes().begin(), h.hashes().end());
        }
        CKPT_ASSIGN_OR_RETURN(image, begin(m.copy(), std::move(hashes)));
        image_bytes = m.copy().image_bytes();
      } else if (m.has_copy() || m.hashes_size() != 0) {
        return absl::DataLossError(
            "copy: only the first message describes the copy");
      }
      const uint64_t at = m.offset(), n = m.data().size();
      const uint64_t end =
          arrived->empty() ? 0
                           : arrived->back().offset + arrived->back().length;
      if (n == 0 || n > kMaxReplicaChunkBytes)
        return absl::DataLossError(
            absl::StrCat("data: ", n, " bytes in one message"));
      if (at < end || at > image_bytes || n > image_bytes - at)
        return absl::DataLossError(
            absl::StrCat("offset: ", at, " (+", n, " bytes) is before ", end,
                         " or past image_bytes ", image_bytes));
      std::memcpy(image + at, m.data().data(), n);
      arrived->push_back({at, n});
      return absl::OkStatus();
    };
    return fetch(on_message);
  };
  return ReadRanges(job_name, world_size, step, rank_no, owner_uid, ranges,
                    save_digests, std::string("a peer"), read);
}

absl::StatusOr<RangedSlot> ReplicaSource::ReadRanges(
    const std::string& job_name, uint32_t world_size, uint64_t step,
    uint32_t rank_no, std::optional<uint32_t> owner_uid,
    std::span<const ImageRange> ranges,
    const std::vector<uint64_t>& save_digests, const std::string& from,
    const RangeRead& read) {
  CKPT_RETURN_IF_ERROR(ValidateJobName(job_name));
  if (world_size == 0 || world_size > node_.options.max_world_size ||
      rank_no >= world_size)
    return absl::InvalidArgumentError(absl::StrCat(
        "world_size: ", world_size, " with rank ", rank_no, " is not valid"));
  // The trust anchor: the save's digest the coordinator committed (or
  // this node's catalog recorded). Without it the source's own checksums
  // would vouch for themselves.
  if (save_digests.empty())
    return absl::FailedPreconditionError(
        "save_digests: no digest of the save to verify ranges against");
  const std::string what =
      absl::StrCat("ranges of job '", job_name, "' step ", step, " rank ",
                   rank_no, " from ", from);
  std::vector<uint64_t> tickets;
  std::shared_ptr<shm::Arena> arena;
  int slot = -1;
  char* image = nullptr;
  rv1::ShardCopy copy;
  // The save's chunk hashes the source sent, by tensor.
  std::map<uint32_t, std::vector<uint64_t>> hashes;
  // What arrived, in image order: [at, at + bytes).
  std::vector<ImageRange> arrived;
  auto begin = [&](const rv1::ShardCopy& c,
                   std::map<uint32_t, std::vector<uint64_t>> h)
      -> absl::StatusOr<char*> {
    if (image != nullptr) return absl::DataLossError("copy: described twice");
    copy = c;
    CKPT_RETURN_IF_ERROR(
        CheckOrderedCopy(copy, job_name, world_size, step, rank_no));
    for (const auto& [t, hs] : h)
      if (t >= static_cast<uint32_t>(copy.checksums_size()))
        return absl::DataLossError(absl::StrCat(
            "hashes.tensor: ", t, " is not a tensor of the copy's ",
            copy.checksums_size()));
    hashes = std::move(h);
    CKPT_ASSIGN_OR_RETURN(
        image, TakeSlot(job_name, world_size, step, rank_no, owner_uid, copy,
                        &tickets, &arena, &slot, nullptr));
    return image;
  };
  // Whether [a, b) arrived whole.
  auto covered = [&](uint64_t a, uint64_t b) {
    auto it = std::upper_bound(
        arrived.begin(), arrived.end(), a,
        [](uint64_t v, const ImageRange& r) { return v < r.offset; });
    if (it == arrived.begin()) return a >= b;
    --it;
    uint64_t reach = it->offset + it->length;
    while (reach < b && ++it != arrived.end() && it->offset == reach)
      reach += it->length;
    return reach >= b;
  };
  absl::Status st = read(begin, &arrived);
  uint64_t wire = 0;
  for (size_t i = 0; st.ok() && i < arrived.size(); ++i) {
    const ImageRange& a = arrived[i];
    const uint64_t end =
        i == 0 ? 0 : arrived[i - 1].offset + arrived[i - 1].length;
    if (a.length == 0 || a.offset < end || a.offset > copy.image_bytes() ||
        a.length > copy.image_bytes() - a.offset)
      st = absl::DataLossError(absl::StrCat(
          "offset: ", a.offset, " (+", a.length, " bytes) is before ", end,
          " or past image_bytes ", copy.image_bytes()));
    wire += a.length;
  }
  absl::StatusOr<storage::ShardInfo> info =
      absl::DataLossError(absl::StrCat(what, ": the header did not come"));
  if (!st.ok()) {
    info = st;
  } else if (image == nullptr) {
    info = absl::DataLossError(absl::StrCat("copy: ", from, " sent nothing"));
  } else if (covered(0, storage::kShardAlign)) {
    absl::StatusOr<storage::ShardHeader> header =
        storage::DecodeHeader({image, storage::kShardAlign});
    if (!header.ok())
      info = Annotate(header.status(), what);
    else if (header->data_offset > copy.image_bytes() ||
             header->footer_offset > copy.image_bytes() ||
             !covered(0, header->data_offset) ||
             !covered(header->footer_offset, copy.image_bytes()))
      info = absl::DataLossError(
          absl::StrCat(what, ": the index or the footer did not come whole"));
    else
      info = storage::ValidateImage({image, copy.image_bytes()},
                                    {job_name, step, rank_no}, what);
  }
  if (info.ok() && info->world_size != world_size)
    info = absl::DataLossError(absl::StrCat(what, ": world_size ",
                                            info->world_size,
                                            ", the copy says ", world_size));
  if (info.ok() &&
      info->tensors.size() != static_cast<size_t>(copy.checksums_size()))
    info = absl::DataLossError(absl::StrCat(
        what, ": checksums: the copy names ", copy.checksums_size(),
        ", the image's index has ", info->tensors.size(), " tensors"));
  if (info.ok()) {
    for (size_t i = 0; i < info->tensors.size(); ++i)
      info->tensors[i].checksum = copy.checksums(static_cast<int>(i));
    // The copy's checksums are the save's the plan chose ...
    if (absl::Status st =
            CheckSaveDigest(*info, save_digests, job_name, step, rank_no);
        !st.ok())
      info = st;
  }
  std::vector<TouchedChunk> chunks;
  if (info.ok()) {
    // ... each touched tensor's chunk hashes combine into its checksum,
    // and each touched chunk hashes to its own: only those chunks are read.
    chunks = TouchedChunks(*info, ranges);
    for (size_t i = 0; info.ok() && i < chunks.size(); ++i) {
      const TouchedChunk& c = chunks[i];
      const storage::ShardTensor& x = info->tensors[c.tensor];
      const std::string tensor =
          absl::StrCat("tensor \"", x.name.substr(0, 64), "\"");
      auto h = hashes.find(c.tensor);
      if (i == 0 || chunks[i - 1].tensor != c.tensor) {
        if (h == hashes.end() || h->second.size() != ChecksumChunks(x.bytes) ||
            CombineChunkHashes(h->second) != x.checksum) {
          info = absl::DataLossError(absl::StrCat(
              what, ": ", tensor, ": its chunk hashes ",
              h == hashes.end() ? "did not come"
                                : "do not combine into the save's checksum"));
          break;
        }
      }
      if (!covered(c.at, c.at + c.bytes)) {
        info = absl::DataLossError(absl::StrCat(what, ": ", tensor, " chunk ",
                                                c.chunk, ": did not come"));
        break;
      }
      const uint64_t got = Hash64(image + c.at, c.bytes);
      if (got != h->second[c.chunk])
        info = absl::DataLossError(absl::StrFormat(
            "%s: %s chunk %d (bytes [%d, %d) of the image): checksum mismatch "
            "(the save's %016x, received %016x)",
            what, tensor, c.chunk, c.at, c.at + c.bytes, h->second[c.chunk],
            got));
    }
  }
  Section lock(&node_);
  Job* job = node_.table.Find(job_name);
  RankSlots* r = nullptr;
  if (job != nullptr && job->ranks.count(rank_no)) r = &job->ranks[rank_no];
  const bool slot_ok = arena && r && r->arena == arena;
  if (!info.ok() || !slot_ok) {
    if (slot_ok) r->Free(slot);
    node_.table.Wake(JobTable::Waiter::kSlot);
    node_.MaybeForgetJob(job_name);
    if (!info.ok()) return info.status();
    return absl::AbortedError("fetch: the rank's arena changed meanwhile");
  }
  // The slot is held for the caller's read only: no shard of the table
  // (it holds a part of one), freed when the last reader ends.
  const uint64_t gen = node_.table.NextGen();
  r->Hold(static_cast<uint32_t>(slot), shm::SlotState::kDurable, step, gen,
          copy.image_bytes());
  r->AddReader(static_cast<uint32_t>(slot));
  r->DropShard(slot, gen);
  RangedSlot out;
  out.slot = slot;
  out.image_bytes = copy.image_bytes();
  out.wire_bytes = wire;
  ToTensorMetas(*info, &out.tensors);
  for (const auto& [t, hs] : hashes)
    if (t < static_cast<uint32_t>(out.tensors.size()))
      out.tensors[static_cast<int>(t)].mutable_chunk_hashes()->Add(hs.begin(),
                                                                   hs.end());
  lock.Unlock();
  for (uint64_t t : tickets) CKPT_RETURN_IF_ERROR(node_.writer->Wait(t));
  LogInfo(absl::StrCat("fetched ", chunks.size(), " chunks of job '", job_name,
                       "' step ", step, " rank ", rank_no, " from ", from, " (",
                       wire, " of ", copy.image_bytes(),
                       " bytes, verified against the save's digest)"));
  return out;
}

}  // namespace ckpt::daemon
