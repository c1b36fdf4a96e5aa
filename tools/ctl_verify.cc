// verify: checks every tensor checksum of the selected shards, and every
// manifest against the shards it lists: one-node "MANIFEST", per-node
// "MANIFEST.<node>" (a cluster's node daemons) and "MANIFEST.global" (the
// coordinator). Keys and manifests are read through storage/keys.h and
// storage/manifest.h, so both layouts are checked alike.
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "storage/keys.h"
#include "storage/manifest.h"
#include "storage/shard_reader.h"
#include "tools/ctl_commands.h"
#include "tools/json_writer.h"
#include "tools/shard_access.h"
#include "util/status.h"
#include "util/validate.h"

namespace ckpt::tools {
namespace {

struct Problem {
  std::string key;
  std::string tensor;  // empty: the whole file
  std::string error;
};

struct VerifiedShard {
  bool ok = false;
  uint64_t bytes = 0;
  std::vector<uint64_t> checksums;  // per tensor, as stored
  storage::ShardInfo info;          // its index (bytes == 0: unread)
};

struct Report {
  std::vector<Problem> problems;
  std::vector<std::string> warnings;
  std::map<std::string, VerifiedShard> shards;  // by key
  uint64_t tensors = 0;
  uint64_t bytes = 0;
  uint64_t manifests = 0;
};

std::string Str(absl::string_view s) { return std::string(s.data(), s.size()); }

std::string DirOf(const std::string& key) {
  size_t slash = key.rfind('/');
  return slash == std::string::npos ? "" : key.substr(0, slash + 1);
}

void VerifyOneShard(storage::Backend& backend, const std::string& key,
                    Progress* progress, Report* report) {
  VerifiedShard& out = report->shards[key];
  auto reader = storage::ShardReader::Open(backend, key);
  if (!reader.ok()) {
    report->problems.push_back({key, "", Str(reader.status().message())});
    return;
  }
  const storage::ShardInfo& info = (*reader)->info();
  out.bytes = info.layout.image_bytes;
  for (const auto& t : info.tensors) out.checksums.push_back(t.checksum);
  out.info = info;
  bool ok = true;
  if (!storage::IsShardKeyOf(key, info.job, info.step, info.rank)) {
    report->problems.push_back(
        {key, "",
         absl::StrFormat(
             "header names job \"%s\" step %d rank %d, which belongs at %s",
             info.job, info.step, info.rank,
             storage::ShardKey(info.job, info.step, info.rank))});
    ok = false;
  }
  const size_t problems_before = report->problems.size();
  absl::Status s = (*reader)->Verify([&](const storage::ShardTensor& t,
                                         uint64_t computed) {
    ++report->tensors;
    report->bytes += t.bytes;
    if (progress) progress->Add(t.bytes);
    if (computed != t.checksum)
      report->problems.push_back(
          {key, t.name,
           absl::StrFormat("checksum mismatch (stored %s, computed %s)",
                           HexChecksum(t.checksum), HexChecksum(computed))});
  });
  // Mismatches were recorded per tensor above; anything else (an I/O error
  // or a file that changed under us) is recorded here.
  if (!s.ok() && report->problems.size() == problems_before)
    report->problems.push_back({key, "", Str(s.message())});
  if (!s.ok()) ok = false;
  out.ok = ok;
}

// What a manifest says of one shard, checked against the shard itself.
struct Listed {
  uint32_t rank = 0;
  std::string key;
  uint64_t bytes = 0;
  std::optional<uint64_t> tensors;
  std::optional<std::string> digest;  // storage::DigestHex of ChecksumsDigest
  const char* digest_field = "checksums_digest";
};

void CheckListedShard(storage::Backend& backend, const Listed& l,
                      Report* report,
                      const std::function<void(const std::string&)>& bad) {
  auto actual = backend.Stat(l.key);
  if (!actual.ok())
    return bad(absl::StrFormat("rank %d: listed shard %s: %s", l.rank, l.key,
                               Str(actual.status().message())));
  if (actual->size != l.bytes)
    bad(absl::StrFormat("rank %d: %s has %d bytes, manifest says %d", l.rank,
                        l.key, actual->size, l.bytes));
  auto it = report->shards.find(l.key);
  if (it == report->shards.end() || it->second.bytes == 0)
    return;  // unreadable: reported
  const VerifiedShard& vs = it->second;
  if (l.tensors && *l.tensors != vs.checksums.size())
    bad(absl::StrFormat("rank %d: manifest says %d tensors, shard has %d",
                        l.rank, *l.tensors, vs.checksums.size()));
  if (l.digest &&
      *l.digest != storage::DigestHex(storage::ChecksumsDigest(vs.checksums)))
    bad(absl::StrFormat("rank %d: %s does not match the shard's tensor index",
                        l.rank, l.digest_field));
}

void VerifyNodeManifest(storage::Backend& backend, const std::string& key,
                        Report* report) {
  ++report->manifests;
  auto bad = [&](const std::string& msg) {
    report->problems.push_back({key, "", msg});
  };
  absl::StatusOr<std::string> text = storage::ReadManifestText(backend, key);
  if (!text.ok()) return bad(Str(text.status().message()));
  absl::StatusOr<storage::v1::NodeManifest> m =
      storage::ParseNodeManifest(*text, key);
  if (!m.ok()) return bad(Str(m.status().message()));
  for (const std::string& p : storage::NodeManifestProblems(*m, key)) bad(p);
  for (int i = 0; i < m->shards_size(); ++i) {
    const storage::v1::NodeManifestShard& s = m->shards(i);
    if (!storage::IsShardKeyOf(s.key(), m->job(), m->step(), s.rank()))
      continue;  // reported
    Listed l{s.rank(), s.key(), s.bytes(), {}, {}};
    if (s.has_tensors()) l.tensors = s.tensors();
    if (s.has_checksums_digest()) l.digest = s.checksums_digest();
    CheckListedShard(backend, l, report, bad);
    // Its chunk hashes against the shard's index (each tensor's count, and
    // that they combine into its checksum, which Verify checked against
    // the bytes).
    auto it = report->shards.find(s.key());
    if (s.chunk_hashes_size() != 0 && it != report->shards.end() &&
        it->second.bytes != 0)
      if (absl::Status st =
              storage::ManifestChunkHashes(s, it->second.info,
                                           absl::StrFormat("shards[%d]", i))
                  .status();
          !st.ok())
        bad(Str(st.message()));
  }
}

void VerifyGlobalManifest(storage::Backend& backend, const std::string& key,
                          Report* report) {
  ++report->manifests;
  auto bad = [&](const std::string& msg) {
    report->problems.push_back({key, "", msg});
  };
  absl::StatusOr<storage::ParsedKey> where = storage::ParseKey(key);
  if (!where.ok()) return bad(Str(where.status().message()));
  absl::StatusOr<std::string> text = storage::ReadManifestText(backend, key);
  if (!text.ok()) return bad(Str(text.status().message()));
  absl::StatusOr<storage::v1::GlobalManifest> m =
      storage::DecodeGlobalManifest(*text, key, where->job, where->step);
  if (!m.ok()) return bad(Str(m.status().message()));
  for (const storage::v1::ManifestShard& s : m->shards()) {
    if (!storage::IsShardKeyOf(s.key(), m->job(), m->step(), s.rank())) {
      bad(absl::StrFormat(
          "rank %d: key \"%s\" is not this step's shard of that rank", s.rank(),
          s.key().substr(0, 200)));
      continue;
    }
    Listed l{s.rank(), s.key(), s.bytes(), {}, {}};
    l.digest = s.checksum_digest();
    l.digest_field = "checksum_digest";
    CheckListedShard(backend, l, report, bad);
  }
}

// A step directory's shards without the manifest that makes them durable.
void WarnUnlisted(const RootContents& c, Report* report) {
  std::map<std::string, std::set<std::string>> nodes_with_shards,
      manifests;  // by dir
  for (const std::string& k : c.shards) {
    auto p = storage::ParseKey(k);
    nodes_with_shards[DirOf(k)].insert(p.ok() ? p->node : "");
  }
  for (const std::string& k : c.node_manifests)
    manifests[DirOf(k)].insert(storage::ParseKey(k)->node);
  for (const std::string& k : c.global_manifests)
    manifests[DirOf(k)].insert(".global");
  for (const auto& [dir, nodes] : nodes_with_shards) {
    const std::set<std::string>& have = manifests[dir];
    for (const std::string& node : nodes) {
      if (node.empty() && !have.count(""))
        report->warnings.push_back(
            dir + ": no MANIFEST (the step is not durable on every rank yet)");
      if (!node.empty() && !have.count(node))
        report->warnings.push_back(
            absl::StrCat(dir, ": no MANIFEST.", node, " (node ", node,
                         " has not made every rank it hosts durable)"));
    }
    if (!nodes.count("") && !have.count(".global"))
      report->warnings.push_back(
          dir +
          ": no MANIFEST.global (the coordinator has not committed the step)");
  }
}

void PrintReport(const VerifyOptions& opts, const RootContents& c,
                 const Report& report, bool json) {
  if (json) {
    JsonWriter w;
    w.BeginObject()
        .Field("ok", report.problems.empty())
        .Field("root", opts.root);
    w.Field("shards", static_cast<uint64_t>(c.shards.size()))
        .Field("manifests", report.manifests);
    w.Field("tensors", report.tensors).Field("bytes", report.bytes);
    w.Key("problems").BeginArray();
    for (const auto& p : report.problems) {
      w.BeginObject().Field("key", p.key);
      if (!p.tensor.empty()) w.Field("tensor", p.tensor);
      w.Field("error", p.error).EndObject();
    }
    w.EndArray().Key("warnings").BeginArray();
    for (const auto& m : report.warnings) w.String(m);
    w.EndArray().EndObject();
    std::printf("%s\n", w.str().c_str());
    return;
  }
  for (const auto& [key, vs] : report.shards)
    std::printf("%-7s %s (%s)\n", vs.ok ? "OK" : "DAMAGED", key.c_str(),
                FormatBytes(vs.bytes).c_str());
  for (const auto& p : report.problems) {
    if (p.tensor.empty())
      std::printf("  %s: %s\n", p.key.c_str(), p.error.c_str());
    else
      std::printf("  %s: tensor \"%s\": %s\n", p.key.c_str(), p.tensor.c_str(),
                  p.error.c_str());
  }
  for (const auto& m : report.warnings) std::printf("  note: %s\n", m.c_str());
  std::printf(
      "%zu shard(s), %llu tensor(s), %s verified; %llu manifest(s); %zu "
      "problem(s)\n",
      c.shards.size(), static_cast<unsigned long long>(report.tensors),
      FormatBytes(report.bytes).c_str(),
      static_cast<unsigned long long>(report.manifests),
      report.problems.size());
}

}  // namespace

absl::Status RunVerify(const VerifyOptions& opts, bool json) {
  if (opts.step && opts.job.empty())
    return absl::InvalidArgumentError("--step: needs --job");
  if (opts.rank && !opts.step)
    return absl::InvalidArgumentError("--rank: needs --job and --step");
  if (!opts.job.empty())
    CKPT_RETURN_IF_ERROR(ValidateJobName(opts.job, "--job"));
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<storage::Backend> backend,
                        OpenRoot(opts.root, "--root"));

  const std::string prefix = opts.step
                                 ? storage::StepPrefix(opts.job, *opts.step)
                             : opts.job.empty() ? ""
                                                : storage::JobPrefix(opts.job);
  CKPT_ASSIGN_OR_RETURN(RootContents c, ScanRoot(*backend, prefix));
  if (opts.rank) {
    // Only that rank's shards (every node's copy); no manifests.
    RootContents one;
    for (const std::string& k : c.shards)
      if (storage::IsShardKeyOf(k, opts.job, *opts.step, *opts.rank))
        one.shards.push_back(k);
    if (one.shards.empty())
      one.shards.push_back(storage::ShardKey(opts.job, *opts.step, *opts.rank));
    c = std::move(one);
  }
  if (c.shards.empty() && c.node_manifests.empty() &&
      c.global_manifests.empty() && (opts.step || !opts.job.empty()))
    return absl::NotFoundError(
        absl::StrCat("no shards of the selected checkpoint under ", opts.root));

  if (c.shards.empty() && c.node_manifests.empty() &&
      c.global_manifests.empty() && c.unrecognized.empty())
    return absl::NotFoundError(absl::StrCat(
        "nothing to verify under ", opts.root,
        ": no shards or manifests (is it the daemon's --root, or a job's "
        "shared root?)"));
  Report report;
  for (const auto& [key, why] : c.unrecognized)
    report.problems.push_back({key, "", why});
  uint64_t total = 0;
  for (const std::string& k : c.shards) {
    auto info = backend->Stat(k);
    if (info.ok()) total += info->size;
  }
  {
    Progress progress("verify", total);
    for (const std::string& k : c.shards)
      VerifyOneShard(*backend, k, &progress, &report);
  }
  for (const std::string& k : c.node_manifests)
    VerifyNodeManifest(*backend, k, &report);
  for (const std::string& k : c.global_manifests)
    VerifyGlobalManifest(*backend, k, &report);
  if (!opts.rank) WarnUnlisted(c, &report);
  PrintReport(opts, c, report, json);

  if (report.problems.empty()) return absl::OkStatus();
  const Problem& first = report.problems.front();
  return absl::DataLossError(absl::StrCat(
      report.problems.size(), " problem(s) under ", opts.root,
      "; first: ", first.key,
      first.tensor.empty() ? ""
                           : absl::StrCat(": tensor \"", first.tensor, "\""),
      ": ", first.error));
}

}  // namespace ckpt::tools
