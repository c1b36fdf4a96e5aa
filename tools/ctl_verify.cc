// verify: checks every tensor checksum of the selected shards and every
// step MANIFEST (written by ckptd once all ranks of a step are durable)
// against the shards it lists.
#include <cstdio>
#include <map>
#include <set>

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

void VerifyOneShard(storage::Backend& backend, const std::string& key, Progress* progress,
                    Report* report) {
  VerifiedShard& out = report->shards[key];
  auto info = storage::ReadShardInfo(backend, key);
  if (!info.ok()) {
    report->problems.push_back({key, "", Str(info.status().message())});
    return;
  }
  out.bytes = info->layout.image_bytes;
  for (const auto& t : info->tensors) out.checksums.push_back(t.checksum);
  bool ok = true;
  if (storage::ShardKey(info->job, info->step, info->rank) != key) {
    report->problems.push_back({key, "", absl::StrFormat(
        "header names job \"%s\" step %d rank %d, which belongs at %s", info->job, info->step,
        info->rank, storage::ShardKey(info->job, info->step, info->rank))});
    ok = false;
  }
  const size_t problems_before = report->problems.size();
  absl::Status s = storage::VerifyShard(
      backend, key, [&](const storage::ShardTensor& t, uint64_t computed) {
        ++report->tensors;
        report->bytes += t.bytes;
        if (progress) progress->Add(t.bytes);
        if (computed != t.checksum)
          report->problems.push_back({key, t.name, absl::StrFormat(
              "checksum mismatch (stored %s, computed %s)", HexChecksum(t.checksum), HexChecksum(computed))});
      });
  // Mismatches were recorded per tensor above; anything else (an I/O error
  // or a file that changed under us) is recorded here.
  if (!s.ok() && report->problems.size() == problems_before)
    report->problems.push_back({key, "", Str(s.message())});
  if (!s.ok()) ok = false;
  out.ok = ok;
}

// The manifest's digest of a shard's checksums (daemon/engine_persist.cc).
uint64_t ChecksumsDigest(const std::vector<uint64_t>& checksums) {
  uint64_t combined = 0;
  for (uint64_t c : checksums) combined = combined * 1000003 ^ c;
  return combined;
}

void VerifyManifest(storage::Backend& backend, const std::string& key, Report* report) {
  ++report->manifests;
  auto bad = [&](const std::string& msg) { report->problems.push_back({key, "", msg}); };
  auto size = backend.ObjectSize(key);
  if (!size.ok()) return bad(Str(size.status().message()));
  if (*size > (16u << 20)) return bad(absl::StrCat("manifest of ", *size, " bytes is implausibly large"));
  std::string text(*size, '\0');
  absl::Status s = backend.ReadAt(key, 0, text.data(), text.size());
  if (!s.ok()) return bad(Str(s.message()));
  google::protobuf::Struct doc;
  auto parsed = google::protobuf::util::JsonStringToMessage(text, &doc);
  if (!parsed.ok()) return bad("not valid JSON: " + std::string(parsed.message()));
  const auto& f = doc.fields();
  auto str = [&](const char* k) { return f.count(k) ? f.at(k).string_value() : std::string(); };
  auto num = [&](const google::protobuf::Value& v) { return static_cast<uint64_t>(v.number_value()); };
  if (str("format") != "ckptd-manifest-v1") return bad("format: \"" + str("format") + "\", expected \"ckptd-manifest-v1\"");
  if (!f.count("step") || !f.count("shards") || !f.count("world_size")) return bad("missing step, world_size or shards");
  const std::string job = str("job");
  const uint64_t step = num(f.at("step"));
  if (!ValidateJobName(job).ok() || storage::ManifestKey(job, step) != key)
    return bad(absl::StrFormat("names job \"%s\" step %d, which does not match its location", job, step));
  const auto& shards = f.at("shards").list_value().values();
  if (static_cast<uint64_t>(shards.size()) != num(f.at("world_size")))
    bad(absl::StrFormat("lists %d shards for world_size %d", shards.size(), num(f.at("world_size"))));
  for (const auto& v : shards) {
    const auto& sf = v.struct_value().fields();
    if (!sf.count("key") || !sf.count("bytes") || !sf.count("rank")) {
      bad("a shard entry lacks key, bytes or rank");
      continue;
    }
    const std::string skey = sf.at("key").string_value();
    const uint64_t rank = num(sf.at("rank"));
    if (skey != storage::ShardKey(job, step, static_cast<uint32_t>(rank))) {
      bad(absl::StrFormat("rank %d: key \"%s\" is not this step's shard of that rank", rank, skey));
      continue;
    }
    auto actual = backend.ObjectSize(skey);
    if (!actual.ok()) {
      bad(absl::StrFormat("rank %d: listed shard %s: %s", rank, skey, Str(actual.status().message())));
      continue;
    }
    if (*actual != num(sf.at("bytes")))
      bad(absl::StrFormat("rank %d: %s has %d bytes, manifest says %d", rank, skey, *actual, num(sf.at("bytes"))));
    auto it = report->shards.find(skey);
    if (it == report->shards.end() || it->second.bytes == 0) continue;  // unreadable: reported
    const VerifiedShard& vs = it->second;
    if (sf.count("tensors") && num(sf.at("tensors")) != vs.checksums.size())
      bad(absl::StrFormat("rank %d: manifest says %d tensors, shard has %d", rank,
                          num(sf.at("tensors")), vs.checksums.size()));
    if (sf.count("checksums_digest") &&
        sf.at("checksums_digest").string_value() != absl::StrFormat("%016x", ChecksumsDigest(vs.checksums)))
      bad(absl::StrFormat("rank %d: checksums_digest does not match the shard's tensor index", rank));
  }
}

}  // namespace

absl::Status RunVerify(const VerifyOptions& opts, bool json) {
  if (opts.step && opts.job.empty()) return absl::InvalidArgumentError("--step: needs --job");
  if (opts.rank && !opts.step) return absl::InvalidArgumentError("--rank: needs --job and --step");
  if (!opts.job.empty()) CKPT_RETURN_IF_ERROR(ValidateJobName(opts.job, "--job"));
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<storage::Backend> backend, OpenRoot(opts.root, "--root"));

  std::vector<std::string> shard_keys, manifest_keys;
  std::set<std::string> shard_dirs, manifest_dirs;
  if (opts.rank) {
    shard_keys.push_back(storage::ShardKey(opts.job, *opts.step, *opts.rank));
  } else {
    std::string prefix = opts.step ? storage::StepPrefix(opts.job, *opts.step)
                                   : opts.job.empty() ? "" : opts.job + "/";
    CKPT_ASSIGN_OR_RETURN(std::vector<std::string> keys, backend->List(prefix));
    for (const std::string& k : keys) {
      if (absl::StartsWith(k, ".catalog/")) continue;  // the daemon's RocksDB
      if (absl::EndsWith(k, ".shard")) {
        shard_keys.push_back(k);
        shard_dirs.insert(DirOf(k));
      } else if (k == "MANIFEST" || absl::EndsWith(k, "/MANIFEST")) {
        manifest_keys.push_back(k);
        manifest_dirs.insert(DirOf(k));
      }
    }
  }
  if (shard_keys.empty() && manifest_keys.empty() && (opts.step || !opts.job.empty()))
    return absl::NotFoundError(absl::StrCat("no shards of the selected checkpoint under ", opts.root));

  Report report;
  uint64_t total = 0;
  for (const std::string& k : shard_keys) {
    auto size = backend->ObjectSize(k);
    if (size.ok()) total += *size;
  }
  {
    Progress progress("verify", total);
    for (const std::string& k : shard_keys) VerifyOneShard(*backend, k, &progress, &report);
  }
  for (const std::string& k : manifest_keys) VerifyManifest(*backend, k, &report);
  for (const std::string& d : shard_dirs)
    if (!manifest_dirs.count(d))
      report.warnings.push_back(d + ": no MANIFEST (the step is not durable on every rank yet)");

  if (json) {
    JsonWriter w;
    w.BeginObject().Field("ok", report.problems.empty()).Field("root", opts.root);
    w.Field("shards", static_cast<uint64_t>(shard_keys.size())).Field("manifests", report.manifests);
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
  } else {
    for (const auto& [key, vs] : report.shards)
      std::printf("%-7s %s (%s)\n", vs.ok ? "OK" : "DAMAGED", key.c_str(), FormatBytes(vs.bytes).c_str());
    for (const auto& p : report.problems) {
      if (p.tensor.empty()) std::printf("  %s: %s\n", p.key.c_str(), p.error.c_str());
      else std::printf("  %s: tensor \"%s\": %s\n", p.key.c_str(), p.tensor.c_str(), p.error.c_str());
    }
    for (const auto& m : report.warnings) std::printf("  note: %s\n", m.c_str());
    std::printf("%zu shard(s), %llu tensor(s), %s verified; %llu manifest(s); %zu problem(s)\n",
                shard_keys.size(), static_cast<unsigned long long>(report.tensors),
                FormatBytes(report.bytes).c_str(), static_cast<unsigned long long>(report.manifests),
                report.problems.size());
  }
  if (report.problems.empty()) return absl::OkStatus();
  const Problem& first = report.problems.front();
  return absl::DataLossError(absl::StrCat(
      report.problems.size(), " problem(s) under ", opts.root, "; first: ", first.key,
      first.tensor.empty() ? "" : absl::StrCat(": tensor \"", first.tensor, "\""), ": ", first.error));
}

}  // namespace ckpt::tools
