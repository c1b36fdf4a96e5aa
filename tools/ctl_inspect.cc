// inspect and restore: offline commands on one shard file.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "storage/keys.h"
#include "storage/shard_reader.h"
#include "tools/ctl_commands.h"
#include "tools/json_writer.h"
#include "tools/out_file.h"
#include "tools/shard_access.h"
#include "util/status.h"

namespace ckpt::tools {
namespace {

std::string FormatTime(uint64_t unix_ns) {
  if (unix_ns == 0) return "unknown";
  time_t secs = static_cast<time_t>(unix_ns / 1000000000ull);
  struct tm tm;
  char buf[64];
  if (!gmtime_r(&secs, &tm) ||
      !std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm))
    return std::to_string(unix_ns);
  return buf;
}

void TensorJson(JsonWriter& w, const storage::ShardTensor& t) {
  w.Field("name", t.name).Field("dtype", std::string(DTypeName(t.dtype)));
  w.Key("shape").BeginArray();
  for (uint64_t d : t.shape) w.Uint(d);
  w.EndArray();
}

// A file name for tensor `name`: [A-Za-z0-9._-] kept, anything else '_',
// no leading '.', unique within `taken`.
std::string TensorFileName(const std::string& name,
                           std::set<std::string>* taken) {
  std::string base;
  for (char c : name)
    base += (isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' ||
             c == '-')
                ? c
                : '_';
  if (base.empty() || base[0] == '.') base = "_" + base;
  std::string file = base + ".bin";
  for (int i = 1; taken->count(file) || file == "index.json"; ++i)
    file = absl::StrCat(base, "~", i, ".bin");
  taken->insert(file);
  return file;
}

}  // namespace

absl::Status RunInspect(const ShardSelector& sel, bool json) {
  CKPT_ASSIGN_OR_RETURN(OpenedShard shard, OpenShard(sel));
  absl::StatusOr<storage::ParsedKey> where = storage::ParseKey(shard.key);
  if (where.ok() && where->kind != storage::KeyKind::kShard)
    return InspectManifest(*shard.backend, shard.key, shard.path, json);
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<storage::ShardReader> reader,
                        storage::ShardReader::Open(*shard.backend, shard.key));
  const storage::ShardInfo& info = reader->info();
  uint64_t tensor_bytes = 0;
  for (const auto& t : info.tensors) tensor_bytes += t.bytes;

  if (json) {
    JsonWriter w;
    w.BeginObject()
        .Field("path", shard.path)
        .Field("format_version", info.layout.version);
    w.Field("job", info.job).Field("step", info.step).Field("rank", info.rank);
    w.Field("world_size", info.world_size)
        .Field("created_unix_ns", info.created_unix_ns);
    w.Field("created", FormatTime(info.created_unix_ns));
    w.Field("image_bytes", info.layout.image_bytes)
        .Field("tensor_bytes", tensor_bytes);
    w.Field("data_offset", info.layout.data_offset)
        .Field("footer_offset", info.layout.footer_offset);
    w.Key("tensors").BeginArray();
    for (const auto& t : info.tensors) {
      w.BeginObject();
      TensorJson(w, t);
      w.Field("offset", t.offset)
          .Field("bytes", t.bytes)
          .Field("checksum", HexChecksum(t.checksum));
      if (!t.global_shape.empty()) {
        w.Key("global_shape").BeginArray();
        for (uint64_t d : t.global_shape) w.Uint(d);
        w.EndArray();
        w.Key("piece_offsets").BeginArray();
        for (uint64_t d : t.piece_offsets) w.Uint(d);
        w.EndArray();
        if (!t.global_name.empty()) w.Field("global_name", t.global_name);
      }
      w.EndObject();
    }
    w.EndArray().EndObject();
    std::printf("%s\n", w.str().c_str());
    return absl::OkStatus();
  }

  std::printf("shard      %s\n", shard.path.c_str());
  std::printf("job        %s\nstep       %llu\nrank       %u of %u\n",
              info.job.c_str(), static_cast<unsigned long long>(info.step),
              info.rank, info.world_size);
  std::printf("created    %s\n", FormatTime(info.created_unix_ns).c_str());
  std::printf("size       %s (%llu bytes; tensors %s)\n",
              FormatBytes(info.layout.image_bytes).c_str(),
              static_cast<unsigned long long>(info.layout.image_bytes),
              FormatBytes(tensor_bytes).c_str());
  std::printf("layout     index at %llu, data at %llu, footer at %llu\n",
              static_cast<unsigned long long>(info.layout.index_offset),
              static_cast<unsigned long long>(info.layout.data_offset),
              static_cast<unsigned long long>(info.layout.footer_offset));
  std::printf("tensors    %zu\n\n", info.tensors.size());
  Table t({"NAME", "DTYPE", "SHAPE", "OFFSET", "BYTES", "CHECKSUM"});
  for (const auto& ti : info.tensors)
    t.AddRow({ti.name, std::string(DTypeName(ti.dtype)), ShapeString(ti),
              std::to_string(ti.offset), std::to_string(ti.bytes),
              HexChecksum(ti.checksum)});
  t.Print(stdout);
  return absl::OkStatus();
}

absl::Status RunRestore(const ShardSelector& sel, const std::string& out,
                        bool json) {
  if (out.empty()) return absl::InvalidArgumentError("--out: empty path");
  CKPT_ASSIGN_OR_RETURN(OpenedShard shard, OpenShard(sel));
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<storage::ShardReader> reader,
                        storage::ShardReader::Open(*shard.backend, shard.key));
  const storage::ShardInfo& info = reader->info();
  std::error_code ec;
  const bool to_dir =
      out.back() == '/' || std::filesystem::is_directory(out, ec);
  Progress progress("restore " + shard.key, info.layout.image_bytes);

  if (!to_dir) {
    OutFile file;
    CKPT_RETURN_IF_ERROR(file.Open(out));
    ShardSink sink;
    sink.other = [&](uint64_t, const char* d, uint64_t n) {
      return file.Write(d, n);
    };
    sink.tensor = [&](const storage::ShardTensor&, const char* d, uint64_t n) {
      return file.Write(d, n);
    };
    CKPT_RETURN_IF_ERROR(StreamShard(*reader, sink, &progress));
    CKPT_RETURN_IF_ERROR(file.Close());
    progress.Finish();
    if (json) {
      JsonWriter w;
      w.BeginObject()
          .Field("out", out)
          .Field("mode", "shard")
          .Field("bytes", info.layout.image_bytes);
      w.Field("tensors", static_cast<uint64_t>(info.tensors.size()))
          .Field("verified", true)
          .EndObject();
      std::printf("%s\n", w.str().c_str());
    } else {
      std::printf("restored %s (%zu tensors, %s, checksums verified) to %s\n",
                  shard.path.c_str(), info.tensors.size(),
                  FormatBytes(info.layout.image_bytes).c_str(), out.c_str());
    }
    return absl::OkStatus();
  }

  std::filesystem::create_directories(out, ec);
  if (ec)
    return absl::InternalError(absl::StrCat("--out ", out, ": ", ec.message()));
  const std::filesystem::path dir(out);
  std::set<std::string> taken;
  std::vector<std::string> files;
  for (const auto& t : info.tensors)
    files.push_back(TensorFileName(t.name, &taken));

  std::unique_ptr<OutFile> file;
  auto index_of = [&](const storage::ShardTensor& t) {
    return static_cast<size_t>(&t - info.tensors.data());
  };
  ShardSink sink;
  sink.tensor = [&](const storage::ShardTensor& t, const char* d,
                    uint64_t n) -> absl::Status {
    if (!file) {
      file = std::make_unique<OutFile>();
      CKPT_RETURN_IF_ERROR(file->Open((dir / files[index_of(t)]).string()));
    }
    return file->Write(d, n);
  };
  // Called once the tensor's checksum matched: only then is its file kept.
  sink.tensor_done = [&](const storage::ShardTensor& t) -> absl::Status {
    if (!file) {  // an empty tensor never reached sink.tensor
      file = std::make_unique<OutFile>();
      CKPT_RETURN_IF_ERROR(file->Open((dir / files[index_of(t)]).string()));
    }
    absl::Status s = file->Close();
    file.reset();
    return s;
  };
  CKPT_RETURN_IF_ERROR(StreamShard(*reader, sink, &progress));
  progress.Finish();

  JsonWriter index;
  index.BeginObject()
      .Field("job", info.job)
      .Field("step", info.step)
      .Field("rank", info.rank);
  index.Field("world_size", info.world_size).Key("tensors").BeginArray();
  for (size_t i = 0; i < info.tensors.size(); ++i) {
    const auto& t = info.tensors[i];
    index.BeginObject();
    TensorJson(index, t);
    index.Field("file", files[i])
        .Field("bytes", t.bytes)
        .Field("checksum", HexChecksum(t.checksum));
    index.EndObject();
  }
  index.EndArray().EndObject();
  OutFile index_file;
  CKPT_RETURN_IF_ERROR(index_file.Open((dir / "index.json").string()));
  std::string text = index.str() + "\n";
  CKPT_RETURN_IF_ERROR(index_file.Write(text.data(), text.size()));
  CKPT_RETURN_IF_ERROR(index_file.Close());

  if (json) {
    JsonWriter w;
    w.BeginObject()
        .Field("out", out)
        .Field("mode", "tensors")
        .Field("bytes", info.layout.image_bytes);
    w.Field("tensors", static_cast<uint64_t>(info.tensors.size()))
        .Field("verified", true)
        .EndObject();
    std::printf("%s\n", w.str().c_str());
  } else {
    std::printf(
        "restored %zu tensors of %s (checksums verified) into %s (see "
        "index.json)\n",
        info.tensors.size(), shard.path.c_str(), out.c_str());
  }
  return absl::OkStatus();
}

}  // namespace ckpt::tools
