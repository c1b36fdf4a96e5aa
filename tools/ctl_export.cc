// export --format safetensors: one shard (from a directory or s3://) as a
// safetensors file (https://github.com/huggingface/safetensors: 8-byte
// little-endian header length, a JSON header of {name: {dtype, shape,
// data_offsets}} plus "__metadata__", then the tensors packed in order).
// Every tensor is checked against its stored checksum as it streams; a
// mismatch leaves no output file. export_plan.h decides the keys: a
// ckpt.torch shard exports as its state_dict.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "storage/shard_reader.h"
#include "tools/ctl_commands.h"
#include "tools/export_plan.h"
#include "tools/json_writer.h"
#include "tools/out_file.h"
#include "tools/shard_access.h"
#include "util/status.h"

namespace ckpt::tools {
namespace {

// The header of the plan's tensors, packed in the shard's order.
std::string SafetensorsHeader(const ExportPlan& plan,
                              const storage::ShardInfo& info) {
  JsonWriter w;
  w.BeginObject();
  w.Key("__metadata__").BeginObject();
  for (const auto& [key, value] : plan.metadata) w.Field(key, value);
  w.EndObject();
  uint64_t offset = 0;
  for (const ExportTensor& t : plan.tensors) {
    const uint64_t bytes = info.tensors[t.index].bytes;
    w.Key(t.key).BeginObject().Field("dtype", t.dtype);
    w.Key("shape").BeginArray();
    for (uint64_t d : t.shape) w.Uint(d);
    w.EndArray();
    w.Key("data_offsets").BeginArray().Uint(offset).Uint(offset + bytes);
    w.EndArray().EndObject();
    offset += bytes;
  }
  w.EndObject();
  std::string header = w.str();
  // Pad with spaces (the format allows it) so the data starts 8-aligned.
  while ((8 + header.size()) % 8 != 0) header += ' ';
  return header;
}

}  // namespace

absl::Status RunExport(const ShardSelector& sel, const std::string& out,
                       const std::string& format, bool json) {
  if (format != "safetensors")
    return absl::InvalidArgumentError(absl::StrCat(
        "--format: \"", format.substr(0, 40), "\" is not one of: safetensors"));
  if (out.empty()) return absl::InvalidArgumentError("--out: empty path");
  CKPT_ASSIGN_OR_RETURN(OpenedShard shard, OpenShard(sel));
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<storage::ShardReader> reader,
                        storage::ShardReader::Open(*shard.backend, shard.key));
  const storage::ShardInfo& info = reader->info();
  CKPT_ASSIGN_OR_RETURN(ExportPlan plan, PlanExport(*reader));
  const std::string header = SafetensorsHeader(plan, info);
  uint64_t data_bytes = 0;
  for (const ExportTensor& t : plan.tensors)
    data_bytes += info.tensors[t.index].bytes;

  OutFile file;
  CKPT_RETURN_IF_ERROR(file.Open(out));
  char len_le[8];
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i)
    len_le[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  CKPT_RETURN_IF_ERROR(file.Write(len_le, 8));
  CKPT_RETURN_IF_ERROR(file.Write(header.data(), header.size()));
  Progress progress("export " + shard.key, info.layout.image_bytes);
  ShardSink sink;
  sink.tensor = [&](const storage::ShardTensor& t, const char* d,
                    uint64_t len) {
    // The tensors a ckpt.torch shard keeps for itself went to the metadata.
    return plan.exported[&t - info.tensors.data()] ? file.Write(d, len)
                                                   : absl::OkStatus();
  };
  CKPT_RETURN_IF_ERROR(StreamShard(*reader, sink, &progress));
  CKPT_RETURN_IF_ERROR(file.Close());
  progress.Finish();
  if (json) {
    JsonWriter w;
    w.BeginObject()
        .Field("out", out)
        .Field("format", "safetensors")
        .Field("source", shard.path);
    w.Field("tensors", static_cast<uint64_t>(plan.tensors.size()))
        .Field("bytes", 8 + header.size() + data_bytes)
        .Field("verified", true)
        .EndObject();
    std::printf("%s\n", w.str().c_str());
  } else {
    std::printf(
        "exported %zu tensors of %s (checksums verified) to %s (safetensors, "
        "%s)\n",
        plan.tensors.size(), shard.path.c_str(), out.c_str(),
        FormatBytes(8 + header.size() + data_bytes).c_str());
  }
  return absl::OkStatus();
}

}  // namespace ckpt::tools
