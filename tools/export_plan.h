// What `ckptctl export` writes for each tensor of a shard: its key, its
// safetensors dtype and shape, and the metadata entries beside them.
//
// A shard of the Python package ckpt.torch holds a state_dict as tensors
// under escaped path names ("model/0.weight", "%h<digest>~..."), plus two
// tensors of its own: "%ckpt/header" (int64[2]: format version, skeleton
// bytes) and "%ckpt/skeleton" (the structure as UTF-8 JSON, which maps
// every tensor to its place; python/ckpt/torch/_tree.py). Its export is
// the state_dict as `state_dict()` names it: each tensor under the keys of
// its path joined by "." ("model.0.weight"), in its real dtype and shape,
// with the header and skeleton as metadata strings, so that
// `model.load_state_dict(safetensors.torch.load_file(path))` works. Any
// other shard (the C and C++ clients) exports every tensor under its own
// name. Everything read is untrusted: a damaged header or skeleton is
// DataLoss naming it.
#ifndef CKPT_TOOLS_EXPORT_PLAN_H_
#define CKPT_TOOLS_EXPORT_PLAN_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/shard_reader.h"

namespace ckpt::tools {

struct ExportTensor {
  size_t index = 0;  // into the shard's info().tensors
  std::string key;
  std::string dtype;  // safetensors' name: "F32", "BF16", ...
  std::vector<uint64_t> shape;
};

struct ExportPlan {
  std::vector<ExportTensor> tensors;  // in the shard's order
  std::vector<bool> exported;         // by shard index: its bytes are written
  std::vector<std::pair<std::string, std::string>> metadata;
};

// safetensors' name of a dtype ("F32", "BF16", ...), or nullptr when it
// has none.
const char* SafetensorsDType(DType dtype);

// Reads a ckpt.torch shard's header and skeleton (checksums verified) to
// name its tensors; any other shard's plan names each tensor as it is. A
// key that two tensors share, or "__metadata__", is InvalidArgument.
[[nodiscard]] absl::StatusOr<ExportPlan> PlanExport(
    storage::ShardReader& reader);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_EXPORT_PLAN_H_
