// A hand-written JSON encoder of the global manifest (v1::GlobalManifest),
// the one message the coordinator encodes at every committed step with a
// shard entry per rank: protobuf's printer costs ~100 ms a step at 16,384
// ranks. Its output is byte-for-byte what EncodeGlobalManifest wrote through
// protobuf (MessageToJsonString with always_print_primitive_fields, then
// "\n"): lowerCamelCase names in field-number order, uint64 as quoted
// decimals, uint32 as numbers, zero values printed, layout_index as padded
// base64 and only when set. Where the two could differ it declines and
// EncodeGlobalManifest falls back to protobuf: a string with a byte that
// protobuf escapes or that is not printable ASCII, unknown fields, or a
// schema that no longer matches the fields it knows.
#ifndef CKPT_STORAGE_MANIFEST_JSON_H_
#define CKPT_STORAGE_MANIFEST_JSON_H_

#include <optional>
#include <string>

#include "manifest.pb.h"

namespace ckpt::storage {

// The text EncodeGlobalManifest writes for `m` (protobuf's JSON and "\n"),
// or nullopt where it cannot promise the same bytes as protobuf.
std::optional<std::string> GlobalManifestJson(const v1::GlobalManifest& m);

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_MANIFEST_JSON_H_
