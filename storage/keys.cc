#include "storage/keys.h"

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/strings.h"
#include "util/validate.h"

namespace ckpt::storage {
namespace {

constexpr std::string_view kStepDir = "step-";
constexpr size_t kStepDigits = 20;
constexpr std::string_view kRankPrefix = "rank-";
constexpr std::string_view kShardSuffix = ".shard";
constexpr std::string_view kManifest = "MANIFEST";
constexpr size_t kRankMinDigits = 5;

bool AllDigits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// Decimal digits to an integer no larger than max; false on overflow.
bool ParseDigits(std::string_view s, uint64_t max, uint64_t* out) {
  uint64_t v = 0;
  for (char c : s) {
    uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (max - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

// "rank-<digits>": at least five digits, no padding beyond five.
absl::Status ParseRank(std::string_view part, uint32_t* rank) {
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank: ", QuotePrefix(part),
        " is not \"rank-\" and at least 5 digits without extra padding"));
  };
  if (!absl::StartsWith(AV(part), AV(kRankPrefix))) return bad();
  std::string_view digits = part.substr(kRankPrefix.size());
  if (digits.size() < kRankMinDigits || !AllDigits(digits)) return bad();
  if (digits.size() > kRankMinDigits && digits[0] == '0') return bad();
  uint64_t v;
  if (!ParseDigits(digits, UINT32_MAX, &v)) return bad();
  *rank = static_cast<uint32_t>(v);
  return absl::OkStatus();
}

absl::Status ParseNode(std::string_view node) { return ValidateNodeId(node); }

// The last component of a key: a shard or a manifest.
absl::Status ParseLeaf(std::string_view leaf, ParsedKey* p) {
  if (leaf == kManifest) {
    p->kind = KeyKind::kManifest;
    return absl::OkStatus();
  }
  if (absl::StartsWith(AV(leaf), absl::StrCat(AV(kManifest), "."))) {
    std::string_view node = leaf.substr(kManifest.size() + 1);
    if (node == kGlobalManifestSuffix) {
      p->kind = KeyKind::kGlobalManifest;
      return absl::OkStatus();
    }
    p->kind = KeyKind::kManifest;
    p->node = std::string(node);
    return ParseNode(node);
  }
  if (!absl::StartsWith(AV(leaf), AV(kRankPrefix)) ||
      !absl::EndsWith(AV(leaf), AV(kShardSuffix)))
    return absl::InvalidArgumentError(
        absl::StrCat("name: ", QuotePrefix(leaf),
                     " is neither \"rank-R[.<node>].shard\" nor "
                     "\"MANIFEST[.<node>|.global]\""));
  p->kind = KeyKind::kShard;
  std::string_view stem = leaf.substr(0, leaf.size() - kShardSuffix.size());
  size_t dot = stem.find('.');
  if (dot != std::string_view::npos) {
    p->node = std::string(stem.substr(dot + 1));
    if (absl::Status s = ParseNode(p->node); !s.ok()) return s;
    stem = stem.substr(0, dot);
  }
  return ParseRank(stem, &p->rank);
}

}  // namespace

absl::Status ValidateNodeId(std::string_view node, std::string_view field) {
  if (absl::Status s = ValidateJobName(node, field); !s.ok()) return s;
  if (node == kGlobalManifestSuffix)
    return absl::InvalidArgumentError(absl::StrCat(
        AV(field),
        ": \"global\" is reserved (MANIFEST.global is the coordinator's)"));
  return absl::OkStatus();
}

std::string JobPrefix(std::string_view job) {
  return absl::StrCat(AV(job), "/");
}

std::string StepPrefix(std::string_view job, uint64_t step) {
  return absl::StrFormat("%s/%s%020d/", AV(job), AV(kStepDir), step);
}

std::string ShardKey(std::string_view job, uint64_t step, uint32_t rank,
                     std::string_view node) {
  if (node.empty())
    return absl::StrFormat("%srank-%05d.shard", StepPrefix(job, step), rank);
  return absl::StrFormat("%srank-%05d.%s.shard", StepPrefix(job, step), rank,
                         AV(node));
}

std::string ManifestKey(std::string_view job, uint64_t step,
                        std::string_view node) {
  std::string key = absl::StrCat(StepPrefix(job, step), AV(kManifest));
  if (!node.empty()) absl::StrAppend(&key, ".", AV(node));
  return key;
}

std::string GlobalManifestKey(std::string_view job, uint64_t step) {
  return ManifestKey(job, step, kGlobalManifestSuffix);
}

std::string KeyOf(const ParsedKey& p) {
  switch (p.kind) {
    case KeyKind::kShard:
      return ShardKey(p.job, p.step, p.rank, p.node);
    case KeyKind::kManifest:
      return ManifestKey(p.job, p.step, p.node);
    case KeyKind::kGlobalManifest:
      return GlobalManifestKey(p.job, p.step);
  }
  return "";
}

absl::StatusOr<uint64_t> ParseStepDir(std::string_view name) {
  std::string_view digits = absl::StartsWith(AV(name), AV(kStepDir))
                                ? name.substr(kStepDir.size())
                                : std::string_view();
  uint64_t step;
  if (digits.size() != kStepDigits || !AllDigits(digits) ||
      !ParseDigits(digits, UINT64_MAX, &step))
    return absl::InvalidArgumentError(absl::StrCat(
        "step: ", QuotePrefix(name), " is not \"step-\" and 20 digits"));
  return step;
}

absl::StatusOr<ParsedKey> ParseKey(std::string_view key) {
  auto bad = [&](const absl::Status& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("key ", QuotePrefix(key), ": ", why.message()));
  };
  size_t first = key.find('/');
  size_t last = key.rfind('/');
  if (first == std::string_view::npos || first == last ||
      key.find('/', first + 1) != last)
    return bad(
        absl::InvalidArgumentError("is not \"<job>/step-<20 digits>/<name>\""));
  ParsedKey p;
  std::string_view job = key.substr(0, first);
  if (absl::Status s = ValidateJobName(job); !s.ok()) return bad(s);
  p.job = std::string(job);
  absl::StatusOr<uint64_t> step =
      ParseStepDir(key.substr(first + 1, last - first - 1));
  if (!step.ok()) return bad(step.status());
  p.step = *step;
  if (absl::Status s = ParseLeaf(key.substr(last + 1), &p); !s.ok())
    return bad(s);
  return p;
}

bool IsShardKeyOf(std::string_view key, std::string_view job, uint64_t step,
                  uint32_t rank) {
  absl::StatusOr<ParsedKey> p = ParseKey(key);
  return p.ok() && p->kind == KeyKind::kShard && p->job == job &&
         p->step == step && p->rank == rank;
}

}  // namespace ckpt::storage
