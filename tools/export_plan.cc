#include "tools/export_plan.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "util/status.h"

namespace ckpt::tools {
namespace {

using google::protobuf::Value;

constexpr char kHeaderName[] = "%ckpt/header";
constexpr char kSkeletonName[] = "%ckpt/skeleton";
constexpr int64_t kHeaderVersion = 1;
// Python's unflatten() refuses deeper skeletons too.
constexpr int kMaxDepth = 200;

}  // namespace

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

namespace {

// A torch dtype (the skeleton's name) that safetensors also has. ckpt.torch
// stores the ones libckpt lacks as raw bytes (uint8); their export is in
// the real dtype and shape. A dtype not listed (complex, ...) stays raw.
struct TorchDType {
  std::string_view torch;
  const char* safetensors;
  uint64_t size;
};
constexpr TorchDType kTorchDTypes[] = {
    {"float32", "F32", 4},
    {"float16", "F16", 2},
    {"bfloat16", "BF16", 2},
    {"float64", "F64", 8},
    {"int8", "I8", 1},
    {"uint8", "U8", 1},
    {"int16", "I16", 2},
    {"int32", "I32", 4},
    {"int64", "I64", 8},
    {"bool", "BOOL", 1},
    {"float8_e4m3fn", "F8_E4M3", 1},
    {"float8_e5m2", "F8_E5M2", 1},
    {"uint16", "U16", 2},
    {"uint32", "U32", 4},
    {"uint64", "U64", 8},
};

const TorchDType* FindTorchDType(std::string_view name) {
  for (const TorchDType& d : kTorchDTypes)
    if (d.torch == name) return &d;
  return nullptr;
}

// The shortest text that reads back as v (Python's repr of most floats).
std::string ShortestDouble(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : absl::StrCat(v);
}

// A dict key node as Python prints the key: a str as it is, an int in
// decimal, True/False/None, a float ({"f": hex}) as its shortest decimal.
std::optional<std::string> KeyText(const Value& k) {
  switch (k.kind_case()) {
    case Value::kStringValue:
      return k.string_value();
    case Value::kNumberValue: {
      const double v = k.number_value();
      if (std::trunc(v) == v && std::fabs(v) < 9.2e18)
        return absl::StrCat(static_cast<int64_t>(v));
      return ShortestDouble(v);
    }
    case Value::kBoolValue:
      return k.bool_value() ? "True" : "False";
    case Value::kNullValue:
      return "None";
    case Value::kStructValue: {
      const auto& f = k.struct_value().fields();
      auto hex = f.find("f");
      if (f.size() != 1 || hex == f.end() || !hex->second.has_string_value())
        return std::nullopt;
      const std::string& s = hex->second.string_value();
      char* end = nullptr;
      const double v = std::strtod(s.c_str(), &end);
      if (end == s.c_str()) return std::nullopt;
      return ShortestDouble(v);
    }
    default:
      return std::nullopt;
  }
}

// Walks the skeleton's structure and gives each tensor reference
// ({"T": i}) the keys of its path joined by ".".
class KeyWalk {
 public:
  explicit KeyWalk(size_t count) : keys_(count) {}

  absl::Status Node(const Value& node, const std::string& path, int depth) {
    if (depth > kMaxDepth) return Bad("nested too deeply");
    if (!node.has_struct_value()) return absl::OkStatus();  // a scalar
    const auto& f = node.struct_value().fields();
    auto child = [&](const std::string& component) {
      return depth == 0 ? component : absl::StrCat(path, ".", component);
    };
    if (auto t = f.find("T"); t != f.end()) {
      const double i = t->second.number_value();
      if (!t->second.has_number_value() || i < 0 || std::trunc(i) != i ||
          i >= static_cast<double>(keys_.size()))
        return Bad("a tensor reference out of range");
      std::optional<std::string>& key = keys_[static_cast<size_t>(i)];
      if (key.has_value())
        return Bad(absl::StrCat("tensors[", static_cast<size_t>(i),
                                "] is referenced twice"));
      key = path;
      return absl::OkStatus();
    }
    if (auto d = f.find("d"); d != f.end()) {
      if (!d->second.has_list_value()) return Bad("a dict that is no list");
      for (const Value& item : d->second.list_value().values()) {
        if (!item.has_list_value() || item.list_value().values_size() != 2)
          return Bad("a dict item that is no pair");
        std::optional<std::string> k = KeyText(item.list_value().values(0));
        if (!k.has_value()) return Bad("a dict key of no known kind");
        CKPT_RETURN_IF_ERROR(
            Node(item.list_value().values(1), child(*k), depth + 1));
      }
      return absl::OkStatus();
    }
    for (const char* tag : {"l", "t"}) {
      auto l = f.find(tag);
      if (l == f.end()) continue;
      if (!l->second.has_list_value()) return Bad("a sequence that is no list");
      int i = 0;
      for (const Value& v : l->second.list_value().values())
        CKPT_RETURN_IF_ERROR(Node(v, child(absl::StrCat(i++)), depth + 1));
      return absl::OkStatus();
    }
    return absl::OkStatus();  // {"f": hex}: a float
  }

  std::vector<std::optional<std::string>>& keys() { return keys_; }

 private:
  static absl::Status Bad(const std::string& why) {
    return absl::DataLossError(absl::StrCat(kSkeletonName, ": ", why));
  }
  std::vector<std::optional<std::string>> keys_;
};

// The skeleton's JSON text, checked against the header.
absl::StatusOr<std::string> ReadSkeleton(storage::ShardReader& reader,
                                         size_t header, size_t skeleton) {
  const storage::ShardTensor& h = reader.info().tensors[header];
  const storage::ShardTensor& s = reader.info().tensors[skeleton];
  if (h.dtype != DType::kInt64 || h.bytes != 16)
    return absl::DataLossError(
        absl::StrCat(reader.key(), ": ", kHeaderName, " is not int64[2]"));
  int64_t fields[2];
  CKPT_RETURN_IF_ERROR(reader.ReadTensor(header, fields));
  if (fields[0] != kHeaderVersion)
    return absl::FailedPreconditionError(absl::StrCat(
        reader.key(), ": ", kHeaderName, ": ckpt.torch format version ",
        fields[0], "; this ckptctl exports version ", kHeaderVersion));
  if (s.dtype != DType::kUInt8 || fields[1] < 0 ||
      s.bytes != static_cast<uint64_t>(fields[1]))
    return absl::DataLossError(absl::StrCat(reader.key(), ": ", kSkeletonName,
                                            " is not uint8[", fields[1],
                                            "] as ", kHeaderName, " says"));
  std::string text(s.bytes, '\0');
  CKPT_RETURN_IF_ERROR(reader.ReadTensor(skeleton, text.data()));
  return text;
}

// The plan of a ckpt.torch shard: every tensor but the header and the
// skeleton, under its state_dict key.
absl::Status PlanTorch(storage::ShardReader& reader, size_t header,
                       size_t skeleton, ExportPlan* plan) {
  const std::vector<storage::ShardTensor>& ts = reader.info().tensors;
  CKPT_ASSIGN_OR_RETURN(std::string text,
                        ReadSkeleton(reader, header, skeleton));
  Value root;
  if (!google::protobuf::util::JsonStringToMessage(text, &root).ok() ||
      !root.has_struct_value())
    return absl::DataLossError(
        absl::StrCat(reader.key(), ": ", kSkeletonName, ": not JSON"));
  const auto& fields = root.struct_value().fields();
  auto table = fields.find("tensors");
  auto structure = fields.find("root");
  if (table == fields.end() || !table->second.has_list_value() ||
      structure == fields.end())
    return absl::DataLossError(absl::StrCat(reader.key(), ": ", kSkeletonName,
                                            ": no tensor table or root"));
  const auto& entries = table->second.list_value().values();
  KeyWalk walk(entries.size());
  if (absl::Status st = walk.Node(structure->second, "", 0); !st.ok())
    return absl::DataLossError(absl::StrCat(reader.key(), ": ", st.message()));

  // The skeleton's entry of each shard tensor, by its shard name.
  absl::flat_hash_map<std::string, int> entry_of;
  for (int i = 0; i < entries.size(); ++i) {
    const Value* name = nullptr;
    if (entries[i].has_struct_value()) {
      const auto& f = entries[i].struct_value().fields();
      auto it = f.find("name");
      if (it != f.end() && it->second.has_string_value()) name = &it->second;
    }
    if (name == nullptr || !walk.keys()[i].has_value())
      return absl::DataLossError(
          absl::StrCat(reader.key(), ": ", kSkeletonName, ": tensors[", i,
                       "] has no name or no place in the structure"));
    entry_of[name->string_value()] = i;
  }
  for (size_t i = 0; i < ts.size(); ++i) {
    if (i == header || i == skeleton) continue;
    const storage::ShardTensor& t = ts[i];
    auto it = entry_of.find(t.name);
    if (it == entry_of.end())
      return absl::DataLossError(absl::StrCat(reader.key(), ": tensor \"",
                                              t.name.substr(0, 80),
                                              "\" is not in ", kSkeletonName));
    const auto& e = entries[it->second].struct_value().fields();
    ExportTensor out{i, *walk.keys()[it->second], "", t.shape};
    // The real dtype and shape of a tensor stored as raw bytes.
    auto dtype = e.find("dtype");
    auto shape = e.find("shape");
    const TorchDType* real = dtype == e.end()
                                 ? nullptr
                                 : FindTorchDType(dtype->second.string_value());
    if (real != nullptr && shape != e.end() && shape->second.has_list_value()) {
      std::vector<uint64_t> dims;
      uint64_t bytes = real->size;
      bool ok = true;
      for (const Value& d : shape->second.list_value().values()) {
        const double v = d.number_value();
        ok = ok && d.has_number_value() && v >= 0 && v < 9.2e18 &&
             std::trunc(v) == v;
        dims.push_back(ok ? static_cast<uint64_t>(v) : 0);
        ok = ok && !__builtin_mul_overflow(bytes, dims.back(), &bytes);
      }
      if (!ok || bytes != t.bytes)
        return absl::DataLossError(absl::StrCat(
            reader.key(), ": tensor \"", t.name.substr(0, 80),
            "\": its skeleton entry does not match its ", t.bytes, " bytes"));
      out.dtype = real->safetensors;
      out.shape = std::move(dims);
    } else {
      out.dtype = SafetensorsDType(t.dtype);
    }
    plan->tensors.push_back(std::move(out));
  }
  plan->exported[header] = plan->exported[skeleton] = false;
  plan->metadata.emplace_back(
      std::string(kHeaderName),
      absl::StrCat("[", kHeaderVersion, ", ", text.size(), "]"));
  plan->metadata.emplace_back(std::string(kSkeletonName), std::move(text));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ExportPlan> PlanExport(storage::ShardReader& reader) {
  const storage::ShardInfo& info = reader.info();
  ExportPlan plan;
  plan.exported.assign(info.tensors.size(), true);
  plan.metadata = {{"format", "pt"},
                   {"source", "ckptd"},
                   {"job", info.job},
                   {"step", absl::StrCat(info.step)},
                   {"rank", absl::StrCat(info.rank)},
                   {"world_size", absl::StrCat(info.world_size)}};
  std::optional<size_t> header, skeleton;
  for (size_t i = 0; i < info.tensors.size(); ++i) {
    if (info.tensors[i].name == kHeaderName) header = i;
    if (info.tensors[i].name == kSkeletonName) skeleton = i;
  }
  if (header.has_value() && skeleton.has_value()) {
    CKPT_RETURN_IF_ERROR(PlanTorch(reader, *header, *skeleton, &plan));
  } else {
    for (size_t i = 0; i < info.tensors.size(); ++i) {
      const storage::ShardTensor& t = info.tensors[i];
      const char* dtype = SafetensorsDType(t.dtype);
      if (dtype == nullptr)
        return absl::InvalidArgumentError(
            absl::StrCat("tensor \"", t.name.substr(0, 80),
                         "\": dtype has no safetensors name"));
      plan.tensors.push_back({i, t.name, dtype, t.shape});
    }
  }
  absl::flat_hash_map<std::string, size_t> seen;
  for (const ExportTensor& t : plan.tensors) {
    if (t.key == "__metadata__")
      return absl::InvalidArgumentError(
          "a tensor named \"__metadata__\" cannot be exported");
    auto [it, fresh] = seen.emplace(t.key, t.index);
    if (!fresh)
      return absl::InvalidArgumentError(absl::StrCat(
          "tensors \"", info.tensors[it->second].name.substr(0, 80),
          "\" and \"", info.tensors[t.index].name.substr(0, 80),
          "\" would both be exported as \"", t.key.substr(0, 80), "\""));
  }
  return plan;
}

}  // namespace ckpt::tools
