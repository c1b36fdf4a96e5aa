#include "storage/manifest_json.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace ckpt::storage {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

struct Field {
  int number;
  std::string_view json_name;
  FieldDescriptor::Type type;
  bool repeated;
  bool presence;  // proto3 `optional`: printed only when set
};

// The fields the encoder prints, as the schema must still declare them: a
// field added, renumbered or retyped in proto/manifest.proto would make its
// output differ from protobuf's, so it then declines instead.
constexpr Field kGlobalFields[] = {
    {1, "format", FieldDescriptor::TYPE_STRING, false, false},
    {2, "job", FieldDescriptor::TYPE_STRING, false, false},
    {3, "step", FieldDescriptor::TYPE_UINT64, false, false},
    {4, "worldSize", FieldDescriptor::TYPE_UINT32, false, false},
    {5, "shards", FieldDescriptor::TYPE_MESSAGE, true, false},
    {6, "generation", FieldDescriptor::TYPE_UINT64, false, false},
    {7, "fence", FieldDescriptor::TYPE_UINT64, false, false},
    {8, "layoutIndex", FieldDescriptor::TYPE_BYTES, false, true},
};
constexpr Field kShardFields[] = {
    {1, "rank", FieldDescriptor::TYPE_UINT32, false, false},
    {2, "key", FieldDescriptor::TYPE_STRING, false, false},
    {3, "bytes", FieldDescriptor::TYPE_UINT64, false, false},
    {4, "checksumDigest", FieldDescriptor::TYPE_STRING, false, false},
    {5, "nodeId", FieldDescriptor::TYPE_STRING, false, false},
};

template <size_t N>
bool Declares(const Descriptor* d, const Field (&fields)[N]) {
  if (d->field_count() != static_cast<int>(N) || d->extension_range_count())
    return false;
  for (size_t i = 0; i < N; ++i) {
    const FieldDescriptor* f = d->field(static_cast<int>(i));
    if (f->number() != fields[i].number ||
        f->json_name() != fields[i].json_name || f->type() != fields[i].type ||
        f->is_repeated() != fields[i].repeated ||
        f->has_presence() != fields[i].presence)
      return false;
  }
  return true;
}

bool SchemaMatches() {
  static const bool matches =
      Declares(v1::GlobalManifest::descriptor(), kGlobalFields) &&
      Declares(v1::ManifestShard::descriptor(), kShardFields);
  return matches;
}

// The bytes protobuf 3.21's printer copies as they are (checked against it
// byte by byte in manifest_json_test.cc): printable ASCII except '"' and
// '\' (escaped as JSON requires) and '<' and '>' (escaped as \u003c and
// \u003e for HTML). Anything else it escapes, or drops as invalid UTF-8.
constexpr std::array<bool, 256> kCopied = [] {
  std::array<bool, 256> t{};
  for (int c = 0x20; c <= 0x7e; ++c) t[c] = true;
  for (char c : {'"', '\\', '<', '>'}) t[static_cast<unsigned char>(c)] = false;
  return t;
}();

bool Copied(std::string_view s) {
  for (char c : s)
    if (!kCopied[static_cast<unsigned char>(c)]) return false;
  return true;
}

// The JSON around a shard's values, and the most its numbers take (uint32
// and uint64 in decimal): enough to reserve the whole text once.
constexpr absl::string_view kShardText[] = {
    ",{\"rank\":",      ",\"key\":\"",
    "\",\"bytes\":\"",  "\",\"checksumDigest\":\"",
    "\",\"nodeId\":\"", "\"}"};
constexpr size_t kShardFixed = [] {
  size_t n = 10 + 20;
  for (absl::string_view s : kShardText) n += s.size();
  return n;
}();
// The message's own names, punctuation and numbers, generously.
constexpr size_t kMessageFixed = 256;

}  // namespace

std::optional<std::string> GlobalManifestJson(const v1::GlobalManifest& m) {
  if (!SchemaMatches() || !m.GetReflection()->GetUnknownFields(m).empty() ||
      !Copied(m.format()) || !Copied(m.job()))
    return std::nullopt;
  size_t size = kMessageFixed + m.format().size() + m.job().size();
  if (m.has_layout_index()) size += (m.layout_index().size() + 2) / 3 * 4;
  for (const v1::ManifestShard& s : m.shards())
    size += kShardFixed + s.key().size() + s.checksum_digest().size() +
            s.node_id().size();
  std::string out;
  out.reserve(size);
  absl::StrAppend(&out, "{\"format\":\"", m.format(), "\",\"job\":\"", m.job(),
                  "\",\"step\":\"", m.step(),
                  "\",\"worldSize\":", m.world_size(), ",\"shards\":[");
  bool first = true;
  for (const v1::ManifestShard& s : m.shards()) {
    if (!s.GetReflection()->GetUnknownFields(s).empty() || !Copied(s.key()) ||
        !Copied(s.checksum_digest()) || !Copied(s.node_id()))
      return std::nullopt;
    // The first entry without kShardText[0]'s leading comma.
    absl::StrAppend(&out, kShardText[0].substr(first ? 1 : 0), s.rank(),
                    kShardText[1], s.key(), kShardText[2], s.bytes(),
                    kShardText[3], s.checksum_digest(), kShardText[4],
                    s.node_id(), kShardText[5]);
    first = false;
  }
  absl::StrAppend(&out, "],\"generation\":\"", m.generation(),
                  "\",\"fence\":\"", m.fence(), "\"");
  if (m.has_layout_index()) {
    // Standard base64 with padding, as protobuf prints bytes.
    absl::StrAppend(&out, ",\"layoutIndex\":\"",
                    absl::Base64Escape(m.layout_index()), "\"");
  }
  out += "}\n";
  return out;
}

}  // namespace ckpt::storage
