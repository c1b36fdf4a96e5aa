// File-system helpers of the local backend: key validation, durable
// directory creation, directory fsync, the recursive listing and the removal
// of crash leftovers. Every error is a Status naming the path. Thread-safe
// (no shared state).
#ifndef CKPT_STORAGE_LOCAL_FS_H_
#define CKPT_STORAGE_LOCAL_FS_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt::storage::internal {

// The marker of temporary files: "<key>.tmp.<nonce>", or with a writer's
// tag "<key>.tmp.<tag>.<nonce>" (the nonce has no '.').
inline constexpr std::string_view kTmpMarker = ".tmp.";

// The temp file name suffix for `tag` and `nonce`.
std::string TmpSuffix(std::string_view tag, std::string_view nonce);
// Whether the file `name` is a temp file of `tag` (any temp file for "").
bool IsTmpFileOf(std::string_view name, std::string_view tag);

// A key is a relative path of non-empty components, none "." or "..", and
// no component containing ".tmp.". A prefix may be empty or end in '/'.
[[nodiscard]] absl::Status ValidateKey(std::string_view key,
                                       std::string_view field = "key");
absl::Status ValidatePrefix(std::string_view prefix);

// Opens dir and fsyncs it.
[[nodiscard]] absl::Status SyncDir(const std::string& dir);
// Creates every missing directory of path's parent below root; each
// directory created is made durable by an fsync of its parent. One that
// exists but is not a directory (a symlink) is FailedPrecondition.
[[nodiscard]] absl::Status MakeParentDirs(const std::string& root,
                                          std::string_view key, bool sync);
// Regular files under root/dir_part (recursively), as keys relative to
// root, skipping temporary files.
[[nodiscard]] absl::StatusOr<std::vector<std::string>> ListFiles(
    const std::string& root, std::string_view dir_part);
// Removes every temp file of `tag` under root (IsTmpFileOf).
[[nodiscard]] absl::Status RemoveTmpFiles(const std::string& root,
                                          std::string_view tag = "");
// Removes the parent directories of key, deepest first, while they are empty.
void RemoveEmptyParents(const std::string& root, std::string_view key);

}  // namespace ckpt::storage::internal

#endif  // CKPT_STORAGE_LOCAL_FS_H_
