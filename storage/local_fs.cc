#include "storage/local_fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "util/status.h"

namespace ckpt::storage::internal {
namespace fs = std::filesystem;

namespace {
absl::string_view AV(std::string_view s) { return {s.data(), s.size()}; }

absl::Status FsError(const std::error_code& ec, const std::string& path) {
  return ErrnoToStatus(ec.value(), path);
}
}  // namespace

absl::Status ValidateKey(std::string_view key, std::string_view field) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat(AV(field), " \"", absl::CEscape(AV(key)), "\": ", AV(why)));
  };
  if (key.empty()) return bad("empty");
  if (key.size() > 1024) return bad("longer than 1024 bytes");
  if (key.front() == '/') return bad("must be relative");
  size_t start = 0;
  while (start <= key.size()) {
    size_t end = key.find('/', start);
    if (end == std::string_view::npos) end = key.size();
    std::string_view part = key.substr(start, end - start);
    if (part.empty()) return bad("empty path component");
    if (part == "." || part == "..") return bad("'.' and '..' components are not allowed");
    if (part.find(kTmpMarker) != std::string_view::npos)
      return bad("\".tmp.\" is reserved for temporary files");
    if (part.find('\0') != std::string_view::npos) return bad("contains NUL");
    start = end + 1;
  }
  return absl::OkStatus();
}

absl::Status ValidatePrefix(std::string_view prefix) {
  if (prefix.empty()) return absl::OkStatus();
  std::string_view trimmed = prefix;
  if (trimmed.back() == '/') trimmed.remove_suffix(1);
  // A prefix may end in a partial component ("job/step-0000"): it only needs
  // to be a valid key once completed.
  return ValidateKey(trimmed, "prefix");
}

absl::Status SyncDir(const std::string& dir) {
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("open directory ", dir));
  int ret = fsync(fd);
  int err = errno;
  close(fd);
  if (ret != 0) return ErrnoToStatus(err, absl::StrCat("fsync directory ", dir));
  return absl::OkStatus();
}

absl::Status MakeParentDirs(const std::string& root, std::string_view key, bool sync) {
  std::string dir = root;
  size_t start = 0;
  for (;;) {
    size_t slash = key.find('/', start);
    if (slash == std::string_view::npos) return absl::OkStatus();
    std::string parent = dir;
    dir = absl::StrCat(root, "/", AV(key.substr(0, slash)));
    if (mkdir(dir.c_str(), 0755) == 0) {
      if (sync) CKPT_RETURN_IF_ERROR(SyncDir(parent));
    } else if (errno != EEXIST) {
      return ErrnoToStatus(errno, absl::StrCat("mkdir ", dir));
    } else {
      // One that exists may have been made by a user who can write to the
      // root (a shared directory): never write through a symlink.
      struct stat st;
      if (lstat(dir.c_str(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat("lstat ", dir));
      if (!S_ISDIR(st.st_mode))
        return absl::FailedPreconditionError(
            absl::StrCat(dir, ": not a directory (a symlink?); refusing to write through it"));
    }
    start = slash + 1;
  }
}

absl::StatusOr<std::vector<std::string>> ListFiles(const std::string& root,
                                                   std::string_view dir_part) {
  std::vector<std::string> out;
  const fs::path start = fs::path(root) / std::string(dir_part);
  std::error_code ec;
  if (!fs::is_directory(start, ec)) return out;
  fs::recursive_directory_iterator it(start, ec), end;
  if (ec) return FsError(ec, start.string());
  for (; it != end; it.increment(ec)) {
    if (ec) return FsError(ec, start.string());
    if (!it->is_regular_file(ec)) continue;
    std::string name = it->path().filename().string();
    if (name.find(kTmpMarker) != std::string::npos) continue;
    out.push_back(fs::relative(it->path(), root, ec).generic_string());
    if (ec) return FsError(ec, it->path().string());
  }
  if (ec) return FsError(ec, start.string());
  return out;
}

std::string TmpSuffix(std::string_view tag, std::string_view nonce) {
  if (tag.empty()) return absl::StrCat(AV(kTmpMarker), AV(nonce));
  return absl::StrCat(AV(kTmpMarker), AV(tag), ".", AV(nonce));
}

bool IsTmpFileOf(std::string_view name, std::string_view tag) {
  size_t at = name.find(kTmpMarker);
  if (at == std::string_view::npos) return false;
  if (tag.empty()) return true;
  std::string_view rest = name.substr(at + kTmpMarker.size());
  // "<tag>.<nonce>" exactly: tag "a" is not tag "a.b".
  return rest.size() > tag.size() + 1 && rest.substr(0, tag.size()) == tag &&
         rest[tag.size()] == '.' &&
         rest.find('.', tag.size() + 1) == std::string_view::npos;
}

absl::Status RemoveTmpFiles(const std::string& root, std::string_view tag) {
  std::error_code ec;
  fs::recursive_directory_iterator it(root, ec), end;
  if (ec) return FsError(ec, root);
  std::vector<fs::path> doomed;
  for (; it != end; it.increment(ec)) {
    if (ec) return FsError(ec, root);
    if (!it->is_regular_file(ec)) continue;
    if (IsTmpFileOf(it->path().filename().string(), tag))
      doomed.push_back(it->path());
  }
  if (ec) return FsError(ec, root);
  for (const fs::path& p : doomed) {
    if (unlink(p.c_str()) != 0 && errno != ENOENT)
      return ErrnoToStatus(errno, absl::StrCat("unlink leftover ", p.string()));
  }
  return absl::OkStatus();
}

void RemoveEmptyParents(const std::string& root, std::string_view key) {
  std::string_view rest = key;
  for (;;) {
    size_t slash = rest.rfind('/');
    if (slash == std::string_view::npos || slash == 0) return;
    rest = rest.substr(0, slash);
    std::string dir = absl::StrCat(root, "/", AV(rest));
    if (rmdir(dir.c_str()) != 0) return;  // not empty (or gone): stop
  }
}

}  // namespace ckpt::storage::internal
