// RangesFromStorage: the chunks of a saved rank that a resharded restore's
// ranges touch, read from storage (ranged reads: GETs with a Range header
// from the object tier) into a slot held for that read, verified against
// this node's catalog record of the save (doc/resharding.md, "Byte ranges
// from storage"). See restorer.h.
#include <algorithm>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/core/engine_util.h"
#include "daemon/engine/replica_source.h"
#include "daemon/engine/restorer.h"
#include "daemon/replica/ranged_read.h"
#include "replica.pb.h"
#include "storage/manifest.h"
#include "storage/shard_format.h"
#include "util/checksum.h"
#include "util/log.h"
#include "util/status.h"

namespace ckpt::daemon {
namespace {

// The most bytes of header and index a ranged read takes in (a shard of
// kMaxShardTensors tensors with layouts is far less).
constexpr uint64_t kMaxHeadBytes = uint64_t{256} << 20;
// Touched chunks this close are read by one request (the padding between
// two tensors is less than a 4 KiB block).
constexpr uint64_t kMergeGap = storage::kShardAlign;

// Ranges that touch more than a third of the tensors' bytes: the whole
// shard, which stays in its slot for the next reader here. A ranged slot
// is not shared, and a full restore at another world size reads every
// byte of every saved rank on some new rank, each new rank opening its
// own saved rank whole first: on one node, 8 -> 6 with ranges of up to
// half read by ranges GETs 9% more than whole loads (doc/resharding.md).
// A third of a saved rank rounded up to whole chunks is more than a
// third, so such boundary thirds load whole. FailedPrecondition then.
absl::Status NotMoreThanAThird(const storage::ShardInfo& info,
                               std::span<const ImageRange> ranges) {
  uint64_t touched = 0, total = 0;
  for (const TouchedChunk& c : TouchedChunks(info, ranges)) touched += c.bytes;
  for (const storage::ShardTensor& t : info.tensors) total += t.bytes;
  if (touched > total / 3)
    return absl::FailedPreconditionError(
        absl::StrCat("the ranges touch ", touched, " of its ", total,
                     " tensor bytes, more than a third"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RangedSlot> Restorer::RangesFromStorage(
    const std::string& job_name, uint64_t step, uint32_t rank_no,
    std::span<const ImageRange> ranges, bool* from_object) {
  // What the catalog recorded of the save, copied under the lock: the
  // trust anchor (the checksums the commit carried, and each tensor's
  // chunk hashes, checked at commit to combine into its checksum).
  std::string key;
  uint64_t image_bytes = 0;
  uint32_t world_size = 0;
  uint32_t uid = 0;
  bool local = false, object = false;
  storage::ShardInfo trusted;
  std::map<std::string, std::vector<uint64_t>> chunk_hashes;  // by name
  {
    Section lock(&node_);
    Job* job = node_.table.Find(job_name);
    const Shard* s = node_.table.FindShard(job_name, step, rank_no);
    if (job == nullptr || s == nullptr)
      return absl::NotFoundError("the shard is gone meanwhile");
    const std::vector<bool> known = KnownChecksums(s->rec.tensors());
    if (std::find(known.begin(), known.end(), false) != known.end())
      return absl::FailedPreconditionError(
          "checksums: a device tensor's checksum is the persister's");
    key = s->rec.path();
    image_bytes = s->rec.image_bytes();
    world_size =
        s->rec.world_size() != 0 ? s->rec.world_size() : job->rec.world_size();
    uid = job->rec.uid();
    local = !s->local_gone;
    object = node_.object != nullptr && s->uploaded;
    trusted = s->info;
    for (const v1::TensorMeta& m : s->rec.tensors())
      if (m.chunk_hashes_size() != 0)
        chunk_hashes[m.name()].assign(m.chunk_hashes().begin(),
                                      m.chunk_hashes().end());
  }
  CKPT_RETURN_IF_ERROR(NotMoreThanAThird(trusted, ranges));
  // Where a load would read it: the local copy while it has the recorded
  // size, else the object tier.
  StoredRanges src;
  src.key = key;
  src.image_bytes = image_bytes;
  src.world_size = world_size;
  src.uid = uid;
  if (local) {
    absl::StatusOr<storage::ObjectInfo> st = node_.backend->Stat(key);
    if (st.ok() && st->size == image_bytes) src.tier = node_.backend;
  }
  if (src.tier == nullptr && object) src.tier = node_.object;
  if (src.tier == nullptr)
    return absl::NotFoundError(absl::StrCat(key, ": no stored copy"));
  *from_object = src.tier == node_.object;
  src.from =
      *from_object ? std::string("the object tier") : std::string("the root");
  src.digests = {storage::ChecksumsDigest(trusted)};
  src.trusted = &trusted;
  src.catalog_hashes = &chunk_hashes;
  return ReadStoredRanges(job_name, step, rank_no, ranges, src);
}

absl::StatusOr<RangedSlot> Restorer::ReadStoredRanges(
    const std::string& job_name, uint64_t step, uint32_t rank_no,
    std::span<const ImageRange> ranges, const StoredRanges& src) {
  storage::Backend* tier = src.tier;
  const std::string& key = src.key;
  const uint64_t image_bytes = src.image_bytes;
  auto read = [&](const ReplicaSource::RangeBegin& begin,
                  std::vector<ImageRange>* arrived) -> absl::Status {
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<storage::ObjectReader> reader,
                          tier->NewObjectReader(key));
    if (reader->size() != image_bytes)
      return absl::DataLossError(absl::StrCat(key, ": ", reader->size(),
                                              " bytes, the catalog recorded ",
                                              image_bytes));
    if (image_bytes < 2 * storage::kShardAlign)
      return absl::DataLossError(
          absl::StrCat(key, ": image_bytes: ", image_bytes, " is too small"));
    // The header, then the rest of the head (the index) and the footer.
    std::string head(storage::kShardAlign, '\0');
    CKPT_RETURN_IF_ERROR(reader->ReadAt(0, head.data(), head.size()));
    CKPT_ASSIGN_OR_RETURN(storage::ShardHeader h,
                          storage::DecodeHeader({head.data(), head.size()}));
    if (h.data_offset < storage::kShardAlign || h.data_offset > kMaxHeadBytes ||
        h.footer_offset < h.data_offset ||
        h.footer_offset != image_bytes - storage::kShardAlign)
      return absl::DataLossError(absl::StrCat(
          key, ": data_offset ", h.data_offset, ", footer_offset ",
          h.footer_offset, " do not fit image_bytes ", image_bytes));
    head.resize(h.data_offset);
    CKPT_RETURN_IF_ERROR(reader->ReadAt(storage::kShardAlign,
                                        head.data() + storage::kShardAlign,
                                        h.data_offset - storage::kShardAlign));
    std::string foot(storage::kShardAlign, '\0');
    CKPT_RETURN_IF_ERROR(
        reader->ReadAt(h.footer_offset, foot.data(), foot.size()));
    CKPT_ASSIGN_OR_RETURN(
        storage::ShardInfo info,
        storage::DecodeShardMetadata({head.data(), head.size()},
                                     {foot.data(), foot.size()}, image_bytes));
    // The stored index must place every tensor where the catalog does (its
    // checksums are checked against the catalog's digest by ReadRanges).
    // Without a catalog record (a node manifest's shard) the index is the
    // stored one, as for a whole load; its checksums must digest to the
    // manifest's checksums_digest (ReadRanges).
    if (src.trusted == nullptr)
      CKPT_RETURN_IF_ERROR(NotMoreThanAThird(info, ranges));
    const storage::ShardInfo& trusted =
        src.trusted != nullptr ? *src.trusted : info;
    if (info.tensors.size() != trusted.tensors.size())
      return absl::DataLossError(absl::StrCat(
          key, ": tensors: ", info.tensors.size(), " in the stored index, ",
          trusted.tensors.size(), " in the catalog"));
    for (size_t i = 0; i < info.tensors.size(); ++i) {
      const storage::ShardTensor &a = info.tensors[i], &b = trusted.tensors[i];
      if (a.name != b.name || a.offset != b.offset || a.bytes != b.bytes)
        return absl::DataLossError(absl::StrCat(
            key, ": tensors[", i, "] \"", a.name.substr(0, 64), "\" at offset ",
            a.offset, " of ", a.bytes, " bytes in the stored index, \"",
            b.name.substr(0, 64), "\" at ", b.offset, " of ", b.bytes,
            " in the catalog"));
    }
    // The save's chunk hashes of each touched tensor. A tensor of one
    // chunk has none recorded (its checksum is the hash of its one chunk
    // hash): that chunk is read first and hashed here, and ReadRanges
    // checks that the hash combines into the save's checksum. A bigger
    // one without them (a catalog written before they were kept) is not
    // read by ranges.
    const std::vector<TouchedChunk> chunks = TouchedChunks(info, ranges);
    std::map<uint32_t, std::vector<uint64_t>> listed;  // the manifest's
    if (src.manifest_shard != nullptr) {
      CKPT_ASSIGN_OR_RETURN(
          listed, storage::ManifestChunkHashes(*src.manifest_shard, info,
                                               src.manifest_field));
    }
    std::map<uint32_t, std::vector<uint64_t>> hashes;
    std::map<uint32_t, std::string> small;  // one-chunk tensors' bytes
    for (const TouchedChunk& c : chunks) {
      if (hashes.count(c.tensor) != 0) continue;
      const storage::ShardTensor& t = info.tensors[c.tensor];
      const std::vector<uint64_t>* have = nullptr;
      if (src.catalog_hashes != nullptr) {
        if (auto it = src.catalog_hashes->find(t.name);
            it != src.catalog_hashes->end())
          have = &it->second;
      } else if (auto it = listed.find(c.tensor); it != listed.end()) {
        have = &it->second;
      }
      if (have != nullptr && have->size() == ChecksumChunks(t.bytes)) {
        hashes[c.tensor] = *have;
      } else if (ChecksumChunks(t.bytes) == 1) {
        std::string bytes(t.bytes, '\0');
        CKPT_RETURN_IF_ERROR(reader->ReadAt(t.offset, bytes.data(), t.bytes));
        hashes[c.tensor] = {Hash64(bytes.data(), bytes.size())};
        small[c.tensor] = std::move(bytes);
      } else {
        return absl::FailedPreconditionError(absl::StrCat(
            "tensor \"", t.name.substr(0, 64), "\": the ",
            src.catalog_hashes != nullptr ? "catalog" : "node manifest",
            " keeps no chunk hashes of it (an older save)"));
      }
    }
    replica::v1::ShardCopy copy;
    copy.set_job(job_name);
    copy.set_step(step);
    copy.set_rank(rank_no);
    copy.set_world_size(src.world_size);
    copy.set_image_bytes(image_bytes);
    if (src.uid) copy.set_owner_uid(*src.uid);
    for (const storage::ShardTensor& t : info.tensors)
      copy.add_checksums(t.checksum);
    CKPT_ASSIGN_OR_RETURN(char* image, begin(copy, std::move(hashes)));
    std::memcpy(image, head.data(), head.size());
    arrived->push_back({0, head.size()});
    // The touched chunks, adjacent ones (and those a padding apart) in one
    // read; a one-chunk tensor's from what was read above.
    for (size_t i = 0; i < chunks.size();) {
      if (auto s = small.find(chunks[i].tensor); s != small.end()) {
        std::memcpy(image + chunks[i].at, s->second.data(), s->second.size());
        arrived->push_back({chunks[i].at, s->second.size()});
        ++i;
        continue;
      }
      const uint64_t a = chunks[i].at;
      uint64_t b = a + chunks[i].bytes;
      size_t j = i + 1;
      for (; j < chunks.size() && small.count(chunks[j].tensor) == 0 &&
             chunks[j].at >= b && chunks[j].at - b <= kMergeGap;
           ++j)
        b = chunks[j].at + chunks[j].bytes;
      CKPT_RETURN_IF_ERROR(reader->ReadAt(a, image + a, b - a));
      arrived->push_back({a, b - a});
      i = j;
    }
    std::memcpy(image + h.footer_offset, foot.data(), foot.size());
    arrived->push_back({h.footer_offset, foot.size()});
    return absl::OkStatus();
  };
  ReplicaSource source(node_);
  return source.ReadRanges(job_name, src.world_size, step, rank_no, src.uid,
                           ranges, src.digests, src.from, read);
}

absl::StatusOr<RangedSlot> Restorer::RangesFromManifest(
    const std::string& job_name, uint64_t step, uint32_t rank_no,
    std::span<const ImageRange> ranges, bool* from_object) {
  std::vector<std::string> tried;
  CKPT_ASSIGN_OR_RETURN(ManifestShard m,
                        FindInNodeManifests(job_name, step, rank_no, &tried));
  // Inside the image the manifest records (sorted and disjoint already;
  // the reader checks the object's size against it).
  if (!ranges.empty()) {
    const ImageRange& last = ranges.back();
    if (last.offset > m.shard.bytes() ||
        last.length > m.shard.bytes() - last.offset)
      return absl::InvalidArgumentError(absl::StrCat(
          "ranges[", ranges.size() - 1, "]: bytes [", last.offset, ", +",
          last.length, ") past image_bytes ", m.shard.bytes()));
  }
  // The trust anchor: the entry's checksums_digest (the saving node's
  // ChecksumsDigest of its catalog's checksums, in the manifest that made
  // the step visible). An older manifest without it, or without chunk
  // hashes, is loaded whole.
  uint64_t digest = 0;
  if (!m.shard.has_checksums_digest() ||
      !absl::SimpleHexAtoi(m.shard.checksums_digest(), &digest))
    return absl::FailedPreconditionError(
        absl::StrCat(m.field, ".checksums_digest: none"));
  if (m.shard.chunk_hashes_size() == 0)
    return absl::FailedPreconditionError(absl::StrCat(
        m.field, ".chunk_hashes: none (an older daemon's manifest)"));
  StoredRanges src;
  src.tier = m.tier;
  src.key = m.shard.key();
  src.image_bytes = m.shard.bytes();
  src.world_size = m.world_size;
  // The owner's uid as a load would take it (the object store keeps none).
  if (absl::StatusOr<storage::ObjectInfo> o = m.tier->Stat(src.key);
      o.ok() && o->owner_uid)
    src.uid = *o->owner_uid;
  else
    src.uid = 0;
  src.digests = {digest};
  *from_object = m.tier == node_.object;
  src.from = absl::StrCat(*from_object ? "the object tier" : "the root", " (",
                          m.manifest_key, ")");
  src.manifest_shard = &m.shard;
  src.manifest_field = m.field;
  return ReadStoredRanges(job_name, step, rank_no, ranges, src);
}

}  // namespace ckpt::daemon
