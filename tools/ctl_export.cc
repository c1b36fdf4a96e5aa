// export --format safetensors: one shard (from a directory or s3://) as a
// safetensors file (https://github.com/huggingface/safetensors: 8-byte
// little-endian header length, a JSON header of {name: {dtype, shape,
// data_offsets}} plus "__metadata__", then the tensors packed in order).
// Every tensor is checked against its stored checksum as it streams; a
// mismatch leaves no output file.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "storage/shard_reader.h"
#include "tools/ctl_commands.h"
#include "tools/json_writer.h"
#include "tools/out_file.h"
#include "tools/shard_access.h"
#include "util/status.h"

namespace ckpt::tools {
namespace {

// safetensors' dtype names.
const char* SafetensorsDType(DType d) {
  switch (d) {
    case DType::kFloat32:
      return "F32";
    case DType::kFloat16:
      return "F16";
    case DType::kBFloat16:
      return "BF16";
    case DType::kFloat64:
      return "F64";
    case DType::kInt8:
      return "I8";
    case DType::kUInt8:
      return "U8";
    case DType::kInt16:
      return "I16";
    case DType::kInt32:
      return "I32";
    case DType::kInt64:
      return "I64";
    case DType::kBool:
      return "BOOL";
  }
  return nullptr;
}

absl::StatusOr<std::string> SafetensorsHeader(const storage::ShardInfo& info) {
  JsonWriter w;
  w.BeginObject();
  w.Key("__metadata__").BeginObject();
  w.Field("format", "pt").Field("source", "ckptd").Field("job", info.job);
  w.Field("step", absl::StrCat(info.step))
      .Field("rank", absl::StrCat(info.rank));
  w.Field("world_size", absl::StrCat(info.world_size));
  w.EndObject();
  uint64_t offset = 0;
  for (const storage::ShardTensor& t : info.tensors) {
    const char* dtype = SafetensorsDType(t.dtype);
    if (dtype == nullptr)
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", t.name.substr(0, 80),
                       "\": dtype has no safetensors name"));
    if (t.name == "__metadata__")
      return absl::InvalidArgumentError(
          "a tensor named \"__metadata__\" cannot be exported");
    w.Key(t.name).BeginObject().Field("dtype", dtype);
    w.Key("shape").BeginArray();
    for (uint64_t d : t.shape) w.Uint(d);
    w.EndArray();
    w.Key("data_offsets")
        .BeginArray()
        .Uint(offset)
        .Uint(offset + t.bytes)
        .EndArray();
    w.EndObject();
    offset += t.bytes;
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
  CKPT_ASSIGN_OR_RETURN(std::string header, SafetensorsHeader(info));
  uint64_t data_bytes = 0;
  for (const storage::ShardTensor& t : info.tensors) data_bytes += t.bytes;

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
  sink.tensor = [&](const storage::ShardTensor&, const char* d, uint64_t len) {
    return file.Write(d, len);
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
    w.Field("tensors", static_cast<uint64_t>(info.tensors.size()))
        .Field("bytes", 8 + header.size() + data_bytes)
        .Field("verified", true)
        .EndObject();
    std::printf("%s\n", w.str().c_str());
  } else {
    std::printf(
        "exported %zu tensors of %s (checksums verified) to %s (safetensors, "
        "%s)\n",
        info.tensors.size(), shard.path.c_str(), out.c_str(),
        FormatBytes(8 + header.size() + data_bytes).c_str());
  }
  return absl::OkStatus();
}

}  // namespace ckpt::tools
