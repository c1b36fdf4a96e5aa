// export --format safetensors: one shard (from a directory or s3://), or
// one whole step's global tensors, as a safetensors file
// (https://github.com/huggingface/safetensors: 8-byte little-endian header
// length, a JSON header of {name: {dtype, shape, data_offsets}} plus
// "__metadata__", then the tensors packed in order without holes).
// Every tensor is checked against its stored checksum; a mismatch leaves
// no output file. export_plan.h decides a shard's keys: a ckpt.torch shard
// exports as its state_dict. A step's global tensors are assembled from
// their pieces on every rank (step_source.h) under their global names.
#include <sys/stat.h>

#include <algorithm>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "storage/layout.h"
#include "storage/shard_reader.h"
#include "tools/ctl_commands.h"
#include "tools/export_plan.h"
#include "tools/json_writer.h"
#include "tools/out_file.h"
#include "tools/shard_access.h"
#include "tools/step_source.h"
#include "util/status.h"

namespace ckpt::tools {
namespace {

void LittleEndian64(uint64_t n, char out[8]) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
}

// Pad with spaces (the format allows it) so the data starts 8-aligned.
void PadHeader(std::string* header) {
  while ((8 + header->size()) % 8 != 0) *header += ' ';
}

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
  PadHeader(&header);
  return header;
}

absl::Status CheckOut(const std::string& format, const std::string& out,
                      bool force) {
  if (format != "safetensors")
    return absl::InvalidArgumentError(absl::StrCat(
        "--format: \"", format.substr(0, 40), "\" is not one of: safetensors"));
  if (out.empty()) return absl::InvalidArgumentError("--out: empty path");
  struct stat st;
  if (!force && ::lstat(out.c_str(), &st) == 0)
    return absl::AlreadyExistsError(
        absl::StrCat("--out ", out, ": exists; give --force to replace it"));
  return absl::OkStatus();
}

// A step's global tensors: one safetensors entry each, sorted by name
// (the index's order), packed in that order.
absl::Status ExportStep(const ExportArgs& args, bool json) {
  CKPT_ASSIGN_OR_RETURN(
      std::unique_ptr<StepSource> src,
      StepSource::Open(args.sel.root, args.sel.job, *args.sel.step));
  const storage::LayoutIndex& index = src->index();
  // A ckpt.torch step: tensors under their state_dict keys (rank 0's
  // skeleton names them, as for one shard: export_plan.h), and a whole
  // tensor stored as raw bytes in its real dtype and shape.
  ExportPlan torch;
  absl::flat_hash_map<std::string, const ExportTensor*> torch_of;
  if (src->torch()) {
    CKPT_ASSIGN_OR_RETURN(torch, PlanExport(src->shard(0)));
    for (const ExportTensor& e : torch.tensors)
      torch_of[src->shard(0).info().tensors[e.index].name] = &e;
  }
  struct Entry {
    std::string key;
    std::string dtype;
    std::vector<uint64_t> shape;
    uint64_t begin = 0, end = 0;
  };
  std::vector<Entry> entries;
  absl::flat_hash_map<std::string, std::string> key_of;  // key -> tensor
  // The requested layout: every tensor whole, on one rank, at its place in
  // the data section (index order).
  storage::LayoutIndexBuilder want(1);
  const std::vector<uint64_t> zeros(kMaxTensorDims, 0);
  uint64_t offset = 0;
  for (const storage::LayoutTensor& t : index.tensors()) {
    const char* dtype = SafetensorsDType(t.dtype);
    if (dtype == nullptr)
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", t.name.substr(0, 160),
                       "\": dtype has no safetensors name"));
    const std::span<const uint64_t> shape(t.global_shape.data(), t.ndim);
    uint64_t bytes = DTypeSize(t.dtype);
    for (uint64_t d : shape) bytes *= d;  // the index checked for overflow
    Entry e{
        t.name, dtype, {shape.begin(), shape.end()}, offset, offset + bytes};
    if (auto it = torch_of.find(t.name); it != torch_of.end()) {
      const ExportTensor& p = *it->second;
      e.key = p.key;
      const storage::ShardTensor& local = src->shard(0).info().tensors[p.index];
      if (local.global_shape.empty() && local.bytes == bytes) {
        e.dtype = p.dtype;  // its bytes are the same (PlanExport checked)
        e.shape = p.shape;
      }
    }
    if (e.key == "__metadata__")
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", t.name.substr(0, 160),
          "\" would be exported as \"__metadata__\", which cannot be"));
    if (auto [it, fresh] = key_of.emplace(e.key, t.name); !fresh)
      return absl::InvalidArgumentError(
          absl::StrCat("tensors \"", it->second.substr(0, 160), "\" and \"",
                       t.name.substr(0, 160), "\" would both be exported as \"",
                       e.key.substr(0, 160), "\""));
    entries.push_back(std::move(e));
    CKPT_ASSIGN_OR_RETURN(uint32_t id, want.AddTensor(t.name, t.dtype, shape));
    if (bytes > 0)
      CKPT_RETURN_IF_ERROR(want.AddPiece(
          id, 0, offset, std::span<const uint64_t>(zeros.data(), t.ndim),
          shape));
    offset += bytes;
  }
  // The header lists them by key; the data stays in index order.
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.key < b.key; });
  JsonWriter w;
  w.BeginObject();
  w.Key("__metadata__").BeginObject();
  w.Field("format", "pt").Field("source", "ckptd").Field("job", src->job());
  w.Field("step", absl::StrCat(src->step()))
      .Field("world_size", absl::StrCat(src->world_size()));
  w.EndObject();
  for (const Entry& e : entries) {
    w.Key(e.key).BeginObject().Field("dtype", e.dtype);
    w.Key("shape").BeginArray();
    for (uint64_t d : e.shape) w.Uint(d);
    w.EndArray();
    w.Key("data_offsets").BeginArray().Uint(e.begin).Uint(e.end);
    w.EndArray().EndObject();
  }
  w.EndObject();
  std::string header = w.str();
  PadHeader(&header);
  CKPT_ASSIGN_OR_RETURN(storage::LayoutIndex requested,
                        std::move(want).Finish());

  OutFile file;
  CKPT_RETURN_IF_ERROR(file.Open(args.out));
  char len_le[8];
  LittleEndian64(header.size(), len_le);
  CKPT_RETURN_IF_ERROR(file.Write(len_le, 8));
  CKPT_RETURN_IF_ERROR(file.Write(header.data(), header.size()));
  Progress progress("export", offset);
  uint64_t pos = 0;
  CKPT_RETURN_IF_ERROR(src->AssembleRequested(
      requested,
      [&](uint64_t request, uint64_t at, const char* data,
          uint64_t len) -> absl::Status {
        // Tensors come in index order, each in order: the file is written
        // front to back.
        if (requested.piece_data_offset(request) + at != pos)
          return absl::InternalError("export: tensors out of order");
        CKPT_RETURN_IF_ERROR(file.Write(data, len));
        pos += len;
        progress.Add(len);
        return absl::OkStatus();
      }));
  if (pos != offset)
    return absl::InternalError(
        absl::StrCat("export: ", pos, " data bytes written of ", offset));
  CKPT_RETURN_IF_ERROR(file.Close(/*replace=*/args.force));
  progress.Finish();
  const uint64_t total = 8 + header.size() + offset;
  if (json) {
    JsonWriter j;
    j.BeginObject()
        .Field("out", args.out)
        .Field("format", "safetensors")
        .Field("job", src->job())
        .Field("step", src->step())
        .Field("world_size", src->world_size());
    j.Field("tensors", static_cast<uint64_t>(index.tensors().size()))
        .Field("pieces", index.num_pieces())
        .Field("bytes", total)
        .Field("verified", true)
        .EndObject();
    std::printf("%s\n", j.str().c_str());
  } else {
    std::printf(
        "exported %zu tensors of job %s step %zu (%u ranks, %llu pieces, "
        "checksums verified) to %s (safetensors, %s)\n",
        index.tensors().size(), src->job().c_str(),
        static_cast<size_t>(src->step()), src->world_size(),
        static_cast<unsigned long long>(index.num_pieces()), args.out.c_str(),
        FormatBytes(total).c_str());
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunExport(const ExportArgs& args, bool json) {
  const ShardSelector& sel = args.sel;
  const std::string& out = args.out;
  CKPT_RETURN_IF_ERROR(CheckOut(args.format, out, args.force));
  if (sel.file.empty() && !sel.rank && sel.node.empty()) {
    if (sel.root.empty() || sel.job.empty() || !sel.step)
      return absl::InvalidArgumentError(
          "give a shard FILE, --root/--job/--step/--rank (one shard), or "
          "--root/--job/--step (the whole step)");
    return ExportStep(args, json);
  }
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
  LittleEndian64(header.size(), len_le);
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
  CKPT_RETURN_IF_ERROR(file.Close(/*replace=*/args.force));
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
