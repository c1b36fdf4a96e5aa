#include "storage/local_fs.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <system_error>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "util/status.h"
#include "util/strings.h"

namespace ckpt::storage::internal {
namespace fs = std::filesystem;

namespace {

absl::Status FsError(const std::error_code& ec, const std::string& path) {
  return ErrnoToStatus(ec.value(), path);
}
}  // namespace

absl::Status ValidateKey(std::string_view key, std::string_view field) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        AV(field), " \"", absl::CEscape(AV(key)), "\": ", AV(why)));
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
    if (part == "." || part == "..")
      return bad("'.' and '..' components are not allowed");
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

ScopedFd& ScopedFd::operator=(ScopedFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) close(fd_);
    fd_ = o.release();
  }
  return *this;
}

ScopedFd::~ScopedFd() {
  if (fd_ >= 0) close(fd_);
}

int ScopedFd::release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

std::pair<std::string_view, std::string_view> SplitKey(std::string_view key) {
  size_t slash = key.rfind('/');
  if (slash == std::string_view::npos) return {std::string_view(), key};
  return {key.substr(0, slash), key.substr(slash + 1)};
}

absl::Status SyncFd(int fd, const std::string& what) {
  if (fsync(fd) != 0) return ErrnoToStatus(errno, absl::StrCat("fsync ", what));
  return absl::OkStatus();
}

namespace {

constexpr int kDirFlags = O_RDONLY | O_DIRECTORY | O_CLOEXEC;

// One component `name` below the directory fd `at`, never through a
// symlink. -1 with errno set on failure (ELOOP/ENOTDIR for a symlink).
int OpenComponent(int at, const std::string& name) {
  static std::atomic<bool> have_openat2{true};
  if (have_openat2.load(std::memory_order_relaxed)) {
    open_how how{};
    how.flags = kDirFlags | O_NOFOLLOW;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
    long fd = syscall(SYS_openat2, at, name.c_str(), &how, sizeof(how));
    if (fd >= 0 || errno != ENOSYS) return static_cast<int>(fd);
    have_openat2.store(false, std::memory_order_relaxed);  // kernel < 5.6
  }
  // Components never contain '/', "." or ".." (ValidateKey), so O_NOFOLLOW
  // on each one refuses every symlink openat2 would.
  return openat(at, name.c_str(), kDirFlags | O_NOFOLLOW);
}

absl::Status ComponentError(int err, const std::string& path) {
  if (err == ELOOP || err == ENOTDIR || err == EXDEV)
    return absl::FailedPreconditionError(
        absl::StrCat(path,
                     ": a symlink or not a directory; refusing to follow it "
                     "(the root is shared: "
                     "someone who can write to it may have planted it)"));
  return ErrnoToStatus(err, absl::StrCat("open directory ", path));
}

}  // namespace

absl::StatusOr<ScopedFd> OpenDirBeneath(const std::string& root,
                                        std::string_view dir, bool create,
                                        bool sync,
                                        std::optional<uid_t> job_uid) {
  ScopedFd cur(open(root.c_str(), kDirFlags));
  if (cur.get() < 0)
    return ErrnoToStatus(errno, absl::StrCat("open root ", root));
  struct stat root_st {};
  if (create && fstat(cur.get(), &root_st) != 0)
    return ErrnoToStatus(errno, absl::StrCat("fstat root ", root));
  auto trusted = [&](uid_t owner) {
    return owner == 0 || owner == geteuid() || owner == root_st.st_uid ||
           (job_uid && owner == *job_uid);
  };
  std::string path = root;
  size_t start = 0;
  while (start < dir.size()) {
    size_t end = dir.find('/', start);
    if (end == std::string_view::npos) end = dir.size();
    const std::string name(dir.substr(start, end - start));
    absl::StrAppend(&path, "/", name);
    start = end + 1;
    if (create) {
      if (mkdirat(cur.get(), name.c_str(), 0755) != 0 && errno != EEXIST)
        return ErrnoToStatus(errno, absl::StrCat("mkdir ", path));
      // Made by us or by a concurrent writer whose parent fsync may still
      // be pending: either way the entry must be durable before a file in
      // it is (a no-op on a clean directory).
      if (sync)
        CKPT_RETURN_IF_ERROR(
            SyncFd(cur.get(), path.substr(0, path.rfind('/'))));
    }
    ScopedFd next(OpenComponent(cur.get(), name));
    if (next.get() < 0) return ComponentError(errno, path);
    struct stat st;
    if (fstat(next.get(), &st) != 0)
      return ErrnoToStatus(errno, absl::StrCat("fstat ", path));
    if (!S_ISDIR(st.st_mode)) return ComponentError(ENOTDIR, path);
    if (create && !trusted(st.st_uid))
      return absl::FailedPreconditionError(absl::StrCat(
          path, ": owned by uid ", st.st_uid,
          ", neither root, ckptd, the root's owner nor the job's uid; "
          "refusing to write into it (the root is shared: its owner could "
          "rename or delete what is written there)"));
    cur = std::move(next);
  }
  return cur;
}

absl::StatusOr<std::vector<std::string>> ListFiles(const std::string& root,
                                                   std::string_view dir_part) {
  std::vector<std::string> out;
  // The start must be a real directory below root; the walk itself follows
  // no symlink (the iterator's default) and lists none.
  absl::StatusOr<ScopedFd> start_dir =
      OpenDirBeneath(root, dir_part, false, false);
  if (absl::IsNotFound(start_dir.status())) return out;
  if (!start_dir.ok()) return start_dir.status();
  const fs::path start = fs::path(root) / std::string(dir_part);
  std::error_code ec;
  fs::recursive_directory_iterator it(start, ec), end;
  if (ec) return FsError(ec, start.string());
  for (; it != end; it.increment(ec)) {
    if (ec) return FsError(ec, start.string());
    if (!fs::is_regular_file(it->symlink_status(ec))) continue;
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
  std::vector<std::string> doomed;  // keys relative to root
  for (; it != end; it.increment(ec)) {
    if (ec) return FsError(ec, root);
    if (!fs::is_regular_file(it->symlink_status(ec))) continue;
    if (IsTmpFileOf(it->path().filename().string(), tag))
      doomed.push_back(fs::relative(it->path(), root, ec).generic_string());
    if (ec) return FsError(ec, it->path().string());
  }
  if (ec) return FsError(ec, root);
  for (const std::string& key : doomed) {
    auto [dir, name] = SplitKey(key);
    absl::StatusOr<ScopedFd> parent = OpenDirBeneath(root, dir, false, false);
    if (absl::IsNotFound(parent.status())) continue;
    if (!parent.ok()) return parent.status();
    if (unlinkat(parent->get(), std::string(name).c_str(), 0) != 0 &&
        errno != ENOENT)
      return ErrnoToStatus(errno,
                           absl::StrCat("unlink leftover ", root, "/", key));
  }
  return absl::OkStatus();
}

void RemoveEmptyParents(const std::string& root, std::string_view key) {
  std::string_view rest = SplitKey(key).first;
  while (!rest.empty()) {
    auto [parent_dir, name] = SplitKey(rest);
    absl::StatusOr<ScopedFd> parent =
        OpenDirBeneath(root, parent_dir, false, false);
    if (!parent.ok()) return;
    // Not empty (or gone, or not a directory): stop.
    if (unlinkat(parent->get(), std::string(name).c_str(), AT_REMOVEDIR) != 0)
      return;
    rest = parent_dir;
  }
}

}  // namespace ckpt::storage::internal
