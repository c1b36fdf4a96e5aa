// list --root and inspect of a manifest: what is on storage, read through
// storage/keys.h and storage/manifest.h (one-node and cluster layouts).
#include <cstdio>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "storage/keys.h"
#include "storage/layout.h"
#include "storage/layout_format.h"
#include "storage/manifest.h"
#include "tools/ctl_commands.h"
#include "tools/json_writer.h"
#include "tools/shard_access.h"
#include "util/status.h"
#include "util/validate.h"

namespace ckpt::tools {
namespace {

struct StepEntry {
  struct ShardEntry {
    uint32_t rank;
    std::string node;
    std::string key;
    uint64_t bytes;
  };
  std::vector<ShardEntry> shards;
  std::vector<std::string>
      manifests;  // "MANIFEST", "MANIFEST.n1", "MANIFEST.global"
  // MANIFEST.global's stamp (which write it is), when it could be read;
  // `suspect` says why it cannot be the committed write, or is empty.
  bool stamped = false;
  uint64_t generation = 0, fence = 0;
  std::string suspect;
};

// Which write of a step's MANIFEST.global the coordinator committed is in
// its state, not on the root. What the root does show: a job's committed
// steps were committed in step order (a report of a step older than the
// last good one is refused), each under a generation and a leader fence
// that never go down, so a manifest stamped older than an earlier step's
// is not the committed write (a deposed leader's late write) or belongs
// to a timeline a rollback abandoned.
void FlagStaleStamps(
    std::map<std::pair<std::string, uint64_t>, StepEntry>& steps) {
  const std::pair<std::string, uint64_t>* newest = nullptr;
  const StepEntry* newest_entry = nullptr;
  for (auto& [id, e] : steps) {
    if (newest && newest->first != id.first) newest = nullptr;
    if (!e.stamped) continue;
    if (newest && (e.generation < newest_entry->generation ||
                   e.fence < newest_entry->fence)) {
      e.suspect = absl::StrCat(
          "older than step ", newest->second, "'s (generation ",
          newest_entry->generation, " fence ", newest_entry->fence,
          "): not the write the coordinator committed for this step (a "
          "deposed leader's late write), or of a timeline a rollback "
          "abandoned; ckptctl cluster shows the committed steps");
      continue;
    }
    if (!newest || e.generation > newest_entry->generation ||
        e.fence > newest_entry->fence) {
      newest = &id;
      newest_entry = &e;
    }
  }
}

std::string Leaf(const std::string& key) {
  return key.substr(key.rfind('/') + 1);
}

}  // namespace

absl::Status RunListRoot(const std::string& root, const std::string& job,
                         bool json) {
  if (!job.empty()) CKPT_RETURN_IF_ERROR(ValidateJobName(job, "--job"));
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<storage::Backend> backend,
                        OpenRoot(root, "--root"));
  CKPT_ASSIGN_OR_RETURN(
      RootContents c,
      ScanRoot(*backend, job.empty() ? "" : storage::JobPrefix(job)));
  std::map<std::pair<std::string, uint64_t>, StepEntry> steps;
  for (const std::string& k : c.shards) {
    absl::StatusOr<storage::ParsedKey> p = storage::ParseKey(k);
    if (!p.ok()) continue;  // not where a shard belongs: verify reports it
    absl::StatusOr<storage::ObjectInfo> info = backend->Stat(k);
    steps[{p->job, p->step}].shards.push_back(
        {p->rank, p->node, k, info.ok() ? info->size : 0});
  }
  for (const auto* keys : {&c.node_manifests, &c.global_manifests}) {
    for (const std::string& k : *keys) {
      absl::StatusOr<storage::ParsedKey> p = storage::ParseKey(k);
      if (p.ok()) steps[{p->job, p->step}].manifests.push_back(Leaf(k));
    }
  }
  for (const std::string& k : c.global_manifests) {
    absl::StatusOr<storage::ParsedKey> p = storage::ParseKey(k);
    if (!p.ok()) continue;
    StepEntry& e = steps[{p->job, p->step}];
    absl::StatusOr<storage::v1::GlobalManifest> m =
        storage::ReadGlobalManifest(*backend, p->job, p->step);
    if (!m.ok()) {
      e.suspect = std::string(m.status().message());
      continue;
    }
    e.stamped = true;
    e.generation = m->generation();
    e.fence = m->fence();
  }
  FlagStaleStamps(steps);
  if (json) {
    JsonWriter w;
    w.BeginObject().Field("root", root).Key("steps").BeginArray();
    for (const auto& [id, e] : steps) {
      w.BeginObject()
          .Field("job", id.first)
          .Field("step", id.second)
          .Key("shards")
          .BeginArray();
      for (const auto& s : e.shards) {
        w.BeginObject()
            .Field("rank", s.rank)
            .Field("node", s.node)
            .Field("key", s.key);
        w.Field("bytes", s.bytes).EndObject();
      }
      w.EndArray().Key("manifests").BeginArray();
      for (const std::string& m : e.manifests) w.String(m);
      w.EndArray();
      if (e.stamped || !e.suspect.empty()) {
        w.Key("global").BeginObject();
        if (e.stamped)
          w.Field("generation", e.generation).Field("fence", e.fence);
        w.Field("suspect", e.suspect).EndObject();
      }
      w.EndObject();
    }
    w.EndArray().EndObject();
    std::printf("%s\n", w.str().c_str());
    return absl::OkStatus();
  }
  Table t({"JOB", "STEP", "SHARDS", "RANKS", "NODES", "BYTES", "MANIFESTS",
           "GEN/FENCE"});
  for (const auto& [id, e] : steps) {
    std::set<uint32_t> ranks;
    std::set<std::string> nodes;
    uint64_t bytes = 0;
    for (const auto& s : e.shards) {
      ranks.insert(s.rank);
      nodes.insert(s.node.empty() ? "-" : s.node);
      bytes += s.bytes;
    }
    t.AddRow({id.first, std::to_string(id.second),
              std::to_string(e.shards.size()), std::to_string(ranks.size()),
              absl::StrJoin(nodes, ","), FormatBytes(bytes),
              e.manifests.empty() ? "-" : absl::StrJoin(e.manifests, ","),
              e.stamped ? absl::StrCat(e.generation, "/", e.fence) : "-"});
  }
  t.Print(stdout);
  for (const auto& [id, e] : steps) {
    if (e.suspect.empty()) continue;
    const std::string key = storage::GlobalManifestKey(id.first, id.second);
    if (e.stamped)
      std::printf("  note: %s: generation %llu fence %llu, %s\n", key.c_str(),
                  static_cast<unsigned long long>(e.generation),
                  static_cast<unsigned long long>(e.fence), e.suspect.c_str());
    else
      std::printf("  note: %s: %s\n", key.c_str(), e.suspect.c_str());
  }
  for (const auto& [key, why] : c.unrecognized)
    std::printf("  note: %s: %s\n", key.c_str(), why.c_str());
  return absl::OkStatus();
}

absl::Status InspectManifest(storage::Backend& backend, const std::string& key,
                             const std::string& path, bool json) {
  CKPT_ASSIGN_OR_RETURN(storage::ParsedKey where, storage::ParseKey(key));
  CKPT_ASSIGN_OR_RETURN(std::string text,
                        storage::ReadManifestText(backend, key));
  struct Row {
    uint32_t rank;
    std::string key, bytes, digest, node;
  };
  std::vector<Row> rows;
  std::string format;
  uint32_t world_size = 0;
  uint64_t generation = 0, fence = 0;         // global: which write it is
  std::optional<storage::LayoutIndex> index;  // node manifests may carry one
  uint64_t index_bytes = 0;
  if (where.kind == storage::KeyKind::kGlobalManifest) {
    CKPT_ASSIGN_OR_RETURN(
        storage::v1::GlobalManifest m,
        storage::DecodeGlobalManifest(text, key, where.job, where.step));
    format = m.format();
    world_size = m.world_size();
    generation = m.generation();
    fence = m.fence();
    for (const auto& s : m.shards())
      rows.push_back({s.rank(), s.key(), std::to_string(s.bytes()),
                      s.checksum_digest(), s.node_id()});
  } else {
    CKPT_ASSIGN_OR_RETURN(storage::v1::NodeManifest m,
                          storage::DecodeNodeManifest(text, key));
    format = m.format();
    world_size = m.world_size();
    for (const auto& s : m.shards())
      rows.push_back({s.rank(), s.key(), std::to_string(s.bytes()),
                      s.checksums_digest(), where.node});
    if (m.has_layout_index()) {
      // DecodeNodeManifest parsed it once already: it is valid.
      CKPT_ASSIGN_OR_RETURN(index, storage::ParseLayoutIndex(m.layout_index()));
      index_bytes = m.layout_index().size();
    }
  }
  if (json) {
    JsonWriter w;
    w.BeginObject()
        .Field("path", path)
        .Field("key", key)
        .Field("format", format);
    w.Field("job", where.job)
        .Field("step", where.step)
        .Field("world_size", world_size);
    w.Field("global", where.kind == storage::KeyKind::kGlobalManifest);
    if (where.kind == storage::KeyKind::kGlobalManifest)
      w.Field("generation", generation).Field("fence", fence);
    w.Key("shards").BeginArray();
    for (const Row& r : rows) {
      w.BeginObject()
          .Field("rank", r.rank)
          .Field("key", r.key)
          .Field("bytes", r.bytes);
      w.Field("digest", r.digest).Field("node", r.node).EndObject();
    }
    w.EndArray();
    if (index) {
      // Every piece of every tensor, as the planner reads them.
      w.Key("layout_index").BeginObject().Field("bytes", index_bytes);
      w.Field("pieces", index->num_pieces());
      w.Key("tensors").BeginArray();
      for (const storage::LayoutTensor& t : index->tensors()) {
        w.BeginObject()
            .Field("name", t.name)
            .Field("dtype", std::string(DTypeName(t.dtype)));
        w.Key("global_shape").BeginArray();
        for (uint32_t d = 0; d < t.ndim; ++d) w.Uint(t.global_shape[d]);
        w.EndArray().Key("pieces").BeginArray();
        for (uint64_t p = t.first_piece; p < t.first_piece + t.num_pieces;
             ++p) {
          w.BeginObject().Field("rank", index->piece_rank(p));
          w.Key("offsets").BeginArray();
          for (uint32_t d = 0; d < t.ndim; ++d)
            w.Uint(index->piece_offset(p, d));
          w.EndArray().Key("lengths").BeginArray();
          for (uint32_t d = 0; d < t.ndim; ++d)
            w.Uint(index->piece_length(p, d));
          w.EndArray().EndObject();
        }
        w.EndArray().EndObject();
      }
      w.EndArray().EndObject();
    }
    w.EndObject();
    std::printf("%s\n", w.str().c_str());
    return absl::OkStatus();
  }
  std::printf(
      "manifest   %s\nformat     %s\njob        %s\nstep       %llu\nworld "
      "size %u\n",
      path.c_str(), format.c_str(), where.job.c_str(),
      static_cast<unsigned long long>(where.step), world_size);
  if (where.kind == storage::KeyKind::kGlobalManifest)
    std::printf("generation %llu\nfence      %llu\n",
                static_cast<unsigned long long>(generation),
                static_cast<unsigned long long>(fence));
  if (index)
    std::printf("layout     index of %zu tensors, %llu pieces (%llu bytes)\n",
                index->tensors().size(),
                static_cast<unsigned long long>(index->num_pieces()),
                static_cast<unsigned long long>(index_bytes));
  std::printf("\n");
  Table t({"RANK", "NODE", "KEY", "BYTES", "DIGEST"});
  for (const Row& r : rows)
    t.AddRow({std::to_string(r.rank), r.node.empty() ? "-" : r.node, r.key,
              r.bytes, r.digest});
  t.Print(stdout);
  return absl::OkStatus();
}

}  // namespace ckpt::tools
