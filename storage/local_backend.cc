// The local-disk Backend: io_uring (or pread/pwrite) with O_DIRECT for the
// aligned middle of every piece, and the commit protocol of backend.h.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "storage/backend.h"
#include "storage/io_queue.h"
#include "storage/local_fs.h"
#include "util/status.h"
#include "util/strings.h"

namespace ckpt::storage {
namespace {

// Opens `name` in the directory dir_fd (path names it in errors) without
// following a symlink, and with O_DIRECT when asked; a file system that
// refuses direct I/O (tmpfs: EINVAL) gets -1 in *direct and the caller uses
// buffered I/O. Both descriptors are checked to be the same regular file:
// the name is looked up twice.
absl::Status OpenPair(int dir_fd, const std::string& name,
                      const std::string& path, int flags, bool want_direct,
                      int* direct, int* buffered) {
  *direct = -1;
  *buffered =
      openat(dir_fd, name.c_str(), flags | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (*buffered < 0 && errno == ELOOP)
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": a symlink; refusing to follow it (the root is shared)"));
  if (*buffered < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  auto fail = [&](absl::Status s) {
    if (*direct >= 0) close(*direct);
    close(*buffered);
    *direct = *buffered = -1;
    return s;
  };
  struct stat st;
  if (fstat(*buffered, &st) != 0)
    return fail(ErrnoToStatus(errno, absl::StrCat("fstat ", path)));
  if (!S_ISREG(st.st_mode))
    return fail(
        absl::NotFoundError(absl::StrCat(path, ": not a regular file")));
  if (!want_direct) return absl::OkStatus();
  *direct =
      openat(dir_fd, name.c_str(),
             (flags & ~(O_CREAT | O_EXCL)) | O_DIRECT | O_CLOEXEC | O_NOFOLLOW);
  if (*direct < 0 && errno == EINVAL) return absl::OkStatus();
  if (*direct < 0)
    return fail(ErrnoToStatus(errno, absl::StrCat("open (O_DIRECT) ", path)));
  struct stat again;
  if (fstat(*direct, &again) != 0)
    return fail(ErrnoToStatus(errno, absl::StrCat("fstat ", path)));
  if (again.st_dev != st.st_dev || again.st_ino != st.st_ino)
    return fail(absl::FailedPreconditionError(
        absl::StrCat(path, ": replaced while it was being opened; refused")));
  return absl::OkStatus();
}

void CloseFd(int* fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

class LocalBackend;

class LocalWriter : public ObjectWriter {
 public:
  LocalWriter(LocalBackend* backend, std::string key, uint64_t size,
              WriterOptions options)
      : backend_(backend),
        key_(std::move(key)),
        size_(size),
        wopts_(std::move(options)) {}
  ~LocalWriter() override { Abort(); }
  absl::Status Open();
  absl::Status WriteAt(uint64_t offset, const void* data,
                       uint64_t len) override;
  absl::Status Commit() override;
  void Abort() override;

 private:
  absl::Status Durable();
  absl::Status ApplyOwnerAndMode();

  LocalBackend* const backend_;
  const std::string key_;
  const uint64_t size_;
  const WriterOptions wopts_;
  std::string path_, tmp_path_;
  std::string name_, tmp_name_;  // in dir_
  internal::ScopedFd dir_;
  int direct_fd_ = -1, buffered_fd_ = -1;
  std::unique_ptr<IoQueue> queue_;
  uint64_t bytes_ = 0;
  bool done_ = false;
};

// One open object: both descriptors are opened once; each ReadAt borrows a
// ring for its requests and returns it.
class LocalReader : public ObjectReader {
 public:
  LocalReader(LocalBackend* backend, std::string key, std::string path)
      : backend_(backend), key_(std::move(key)), path_(std::move(path)) {}
  ~LocalReader() override {
    CloseFd(&direct_fd_);
    CloseFd(&buffered_fd_);
  }
  absl::Status Open();
  uint64_t size() const override { return size_; }
  absl::Status ReadAt(uint64_t offset, void* dst, uint64_t len) override;

 private:
  LocalBackend* const backend_;
  const std::string key_, path_;
  int direct_fd_ = -1, buffered_fd_ = -1;
  uint64_t size_ = 0;
};

class LocalBackend : public Backend {
 public:
  explicit LocalBackend(LocalBackendOptions options)
      : options_(std::move(options)),
        pool_(std::max(1u, options_.queue_depth), 8) {}

  absl::Status Init() {
    if (options_.root.empty()) return absl::InvalidArgumentError("root: empty");
    std::error_code ec;
    std::filesystem::create_directories(options_.root, ec);
    if (ec)
      return ErrnoToStatus(ec.value(),
                           absl::StrCat("create root ", options_.root));
    // Absolute, so LocalPath() names the object for any process.
    std::filesystem::path abs = std::filesystem::absolute(options_.root, ec);
    if (ec)
      return ErrnoToStatus(
          ec.value(), absl::StrCat("absolute path of root ", options_.root));
    options_.root = abs.lexically_normal().string();
    while (options_.root.size() > 1 && options_.root.back() == '/')
      options_.root.pop_back();
    if (options_.use_io_uring && !pool_.Probe()) options_.use_io_uring = false;
    if (!options_.remove_tmp_files) return absl::OkStatus();
    return internal::RemoveTmpFiles(options_.root, options_.tmp_tag);
  }

  std::string name() const override {
    return options_.use_io_uring ? "io_uring" : "pwrite";
  }
  const LocalBackendOptions& options() const { return options_; }
  std::string Path(std::string_view key) const {
    return absl::StrCat(options_.root, "/", AV(key));
  }

  std::unique_ptr<IoQueue> NewQueue(IoOp op, const std::string& what) {
    return std::make_unique<IoQueue>(options_.use_io_uring ? &pool_ : nullptr,
                                     op, options_.queue_depth,
                                     options_.io_bytes, what);
  }
  std::string Nonce() {
    static std::atomic<uint64_t> counter{0};
    static const uint64_t salt = std::random_device{}();
    return absl::StrFormat("%d-%x-%d", getpid(), salt & 0xffffff,
                           counter.fetch_add(1));
  }

  absl::StatusOr<std::unique_ptr<ObjectWriter>> NewObjectWriter(
      std::string_view key, uint64_t size,
      const WriterOptions& options) override {
    CKPT_RETURN_IF_ERROR(internal::ValidateKey(key));
    auto writer =
        std::make_unique<LocalWriter>(this, std::string(key), size, options);
    CKPT_RETURN_IF_ERROR(writer->Open());
    return std::unique_ptr<ObjectWriter>(std::move(writer));
  }

  absl::Status PutSmallObject(std::string_view key,
                              std::string_view contents) override {
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<ObjectWriter> writer,
                          NewObjectWriter(key, contents.size(), {}));
    CKPT_RETURN_IF_ERROR(writer->WriteAt(0, contents.data(), contents.size()));
    return writer->Commit();
  }

  absl::StatusOr<std::unique_ptr<ObjectReader>> NewObjectReader(
      std::string_view key) override {
    CKPT_RETURN_IF_ERROR(internal::ValidateKey(key));
    auto reader =
        std::make_unique<LocalReader>(this, std::string(key), Path(key));
    CKPT_RETURN_IF_ERROR(reader->Open());
    return std::unique_ptr<ObjectReader>(std::move(reader));
  }

  absl::StatusOr<ObjectInfo> Stat(std::string_view key) override {
    CKPT_RETURN_IF_ERROR(internal::ValidateKey(key));
    const std::string path = Path(key);
    auto [dir, name] = internal::SplitKey(key);
    CKPT_ASSIGN_OR_RETURN(internal::ScopedFd parent, OpenDir(dir, false));
    struct stat st;
    if (fstatat(parent.get(), std::string(name).c_str(), &st,
                AT_SYMLINK_NOFOLLOW) != 0)
      return ErrnoToStatus(errno, absl::StrCat("stat ", path));
    if (!S_ISREG(st.st_mode))
      return absl::NotFoundError(absl::StrCat(path, ": not a regular file"));
    ObjectInfo info;
    info.size = static_cast<uint64_t>(st.st_size);
    info.owner_uid = st.st_uid;
    info.mode = st.st_mode & 07777;
    return info;
  }

  // root/dir, reached without following a symlink (local_fs.h).
  // job_uid: with create, the uid the files written there are made for.
  absl::StatusOr<internal::ScopedFd> OpenDir(
      std::string_view dir, bool create,
      std::optional<uid_t> job_uid = std::nullopt) const {
    return internal::OpenDirBeneath(options_.root, dir, create, options_.sync,
                                    job_uid);
  }

  std::optional<std::string> LocalPath(std::string_view key) const override {
    if (!internal::ValidateKey(key).ok()) return std::nullopt;
    return Path(key);
  }

  void CountRead(uint64_t bytes) { bytes_read_ += bytes; }

  absl::StatusOr<std::vector<std::string>> List(
      std::string_view prefix) override {
    CKPT_RETURN_IF_ERROR(internal::ValidatePrefix(prefix));
    size_t slash = prefix.rfind('/');
    std::string_view dir =
        slash == std::string_view::npos ? "" : prefix.substr(0, slash);
    CKPT_ASSIGN_OR_RETURN(std::vector<std::string> all,
                          internal::ListFiles(options_.root, dir));
    std::vector<std::string> out;
    for (std::string& k : all) {
      if (std::string_view(k).substr(0, prefix.size()) == prefix)
        out.push_back(std::move(k));
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  absl::Status Delete(std::string_view key) override {
    CKPT_RETURN_IF_ERROR(internal::ValidateKey(key));
    const std::string path = Path(key);
    auto [dir, name] = internal::SplitKey(key);
    absl::StatusOr<internal::ScopedFd> parent = OpenDir(dir, false);
    if (absl::IsNotFound(parent.status())) return absl::OkStatus();
    if (!parent.ok()) return parent.status();
    if (unlinkat(parent->get(), std::string(name).c_str(), 0) != 0 &&
        errno != ENOENT)
      return ErrnoToStatus(errno, absl::StrCat("unlink ", path));
    return absl::OkStatus();
  }

  absl::Status DeletePrefix(std::string_view prefix) override {
    CKPT_ASSIGN_OR_RETURN(std::vector<std::string> keys, List(prefix));
    for (const std::string& k : keys) CKPT_RETURN_IF_ERROR(Delete(k));
    for (const std::string& k : keys)
      internal::RemoveEmptyParents(options_.root, k);
    return absl::OkStatus();
  }

  absl::Status RegisterMemory(void* base, uint64_t len) override {
    if (base == nullptr || len == 0)
      return absl::InvalidArgumentError(
          absl::StrFormat("RegisterMemory(%p, %d): empty region", base, len));
    if (!options_.use_io_uring) return absl::OkStatus();
    return pool_.Register(base, len);
  }
  void UnregisterMemory(void* base) override { pool_.Unregister(base); }

  BackendStats stats() const override {
    BackendStats s;
    s.bytes_written = bytes_written_.load();
    s.bytes_read = bytes_read_.load();
    s.objects_committed = objects_committed_.load();
    return s;
  }

  void CountCommit(uint64_t bytes) {
    bytes_written_ += bytes;
    ++objects_committed_;
  }

 private:
  LocalBackendOptions options_;
  RingPool pool_;
  std::atomic<uint64_t> bytes_written_{0}, bytes_read_{0},
      objects_committed_{0};
};

absl::Status LocalWriter::Open() {
  const LocalBackendOptions& o = backend_->options();
  path_ = backend_->Path(key_);
  auto [dir, name] = internal::SplitKey(key_);
  name_ = std::string(name);
  tmp_name_ =
      absl::StrCat(name_, internal::TmpSuffix(o.tmp_tag, backend_->Nonce()));
  tmp_path_ =
      absl::StrCat(path_.substr(0, path_.size() - name_.size()), tmp_name_);
  CKPT_ASSIGN_OR_RETURN(
      dir_, backend_->OpenDir(dir, /*create=*/true, wopts_.owner_uid));
  absl::Status opened =
      OpenPair(dir_.get(), tmp_name_, tmp_path_, O_WRONLY | O_CREAT | O_EXCL,
               o.direct_io, &direct_fd_, &buffered_fd_);
  if (!opened.ok()) {
    if (!absl::IsAlreadyExists(opened))
      unlinkat(dir_.get(), tmp_name_.c_str(), 0);
    dir_ = internal::ScopedFd();
    return opened;
  }
  // Reserving the space up front turns a full disk into an early, clear
  // ENOSPC and keeps direct writes from extending the file one by one.
  if (size_ > 0) {
    int ret = fallocate(buffered_fd_, 0, 0, static_cast<off_t>(size_));
    if (ret != 0 && errno != EOPNOTSUPP) {
      absl::Status s = ErrnoToStatus(
          errno,
          absl::StrFormat("fallocate %d bytes for %s", size_, tmp_path_));
      Abort();
      return s;
    }
    if (ret != 0 && ftruncate(buffered_fd_, static_cast<off_t>(size_)) != 0) {
      absl::Status s =
          ErrnoToStatus(errno, absl::StrCat("ftruncate ", tmp_path_));
      Abort();
      return s;
    }
  }
  if (absl::Status s = ApplyOwnerAndMode(); !s.ok()) {
    Abort();
    return s;
  }
  queue_ = backend_->NewQueue(IoOp::kWrite, tmp_path_);
  return absl::OkStatus();
}

// Before the rename, so the object is never visible with the wrong owner or
// mode.
absl::Status LocalWriter::ApplyOwnerAndMode() {
  if (wopts_.mode.has_value() && fchmod(buffered_fd_, *wopts_.mode) != 0)
    return ErrnoToStatus(
        errno, absl::StrFormat("fchmod %o %s", *wopts_.mode, tmp_path_));
  if (wopts_.owner_uid.has_value() &&
      fchown(buffered_fd_, *wopts_.owner_uid, static_cast<gid_t>(-1)) != 0 &&
      errno != EPERM)
    return ErrnoToStatus(
        errno, absl::StrFormat("fchown %d %s", *wopts_.owner_uid, tmp_path_));
  return absl::OkStatus();
}

absl::Status LocalReader::Open() {
  auto [dir, name] = internal::SplitKey(key_);
  CKPT_ASSIGN_OR_RETURN(internal::ScopedFd parent,
                        backend_->OpenDir(dir, /*create=*/false));
  CKPT_RETURN_IF_ERROR(OpenPair(parent.get(), std::string(name), path_,
                                O_RDONLY, backend_->options().direct_io,
                                &direct_fd_, &buffered_fd_));
  struct stat st;
  if (fstat(buffered_fd_, &st) != 0)
    return ErrnoToStatus(errno, absl::StrCat("fstat ", path_));
  size_ = static_cast<uint64_t>(st.st_size);
  return absl::OkStatus();
}

absl::Status LocalReader::ReadAt(uint64_t offset, void* dst, uint64_t len) {
  if (offset > size_ || len > size_ - offset)
    return absl::DataLossError(absl::StrFormat(
        "%s: object has %d bytes, read of [%d, %d) is past its end", path_,
        size_, offset, offset + len));
  if (len == 0) return absl::OkStatus();
  std::unique_ptr<IoQueue> q = backend_->NewQueue(IoOp::kRead, path_);
  absl::Status s =
      q->Add(direct_fd_, buffered_fd_, static_cast<char*>(dst), offset, len);
  absl::Status f = q->Finish();
  if (s.ok()) s = f;
  if (s.ok()) backend_->CountRead(len);
  return s;
}

absl::Status LocalWriter::WriteAt(uint64_t offset, const void* data,
                                  uint64_t len) {
  if (done_)
    return absl::FailedPreconditionError(
        absl::StrCat(key_, ": writer already committed or aborted"));
  if (offset > size_ || len > size_ - offset)
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: write of [%d, %d) is outside the object's %d bytes", key_, offset,
        offset + len, size_));
  bytes_ += len;
  return queue_->Add(direct_fd_, buffered_fd_,
                     const_cast<char*>(static_cast<const char*>(data)), offset,
                     len);
}

absl::Status LocalWriter::Durable() {
  CKPT_RETURN_IF_ERROR(queue_->Finish());
  queue_.reset();
  if (backend_->options().sync && fsync(buffered_fd_) != 0)
    return ErrnoToStatus(errno, absl::StrCat("fsync ", tmp_path_));
  CloseFd(&direct_fd_);
  if (close(buffered_fd_) != 0) {
    buffered_fd_ = -1;
    return ErrnoToStatus(errno, absl::StrCat("close ", tmp_path_));
  }
  buffered_fd_ = -1;
  if (renameat(dir_.get(), tmp_name_.c_str(), dir_.get(), name_.c_str()) != 0)
    return ErrnoToStatus(errno,
                         absl::StrFormat("rename %s to %s", tmp_path_, path_));
  if (backend_->options().sync) {
    absl::Status s =
        internal::SyncFd(dir_.get(), path_.substr(0, path_.rfind('/')));
    if (!s.ok()) {
      // Not durable: withdraw the object rather than leave it half-committed.
      unlinkat(dir_.get(), name_.c_str(), 0);
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status LocalWriter::Commit() {
  if (done_)
    return absl::FailedPreconditionError(
        absl::StrCat(key_, ": writer already committed or aborted"));
  absl::Status s = Durable();
  if (!s.ok()) {
    Abort();
    return s;
  }
  done_ = true;
  backend_->CountCommit(bytes_);
  return absl::OkStatus();
}

void LocalWriter::Abort() {
  if (done_) return;
  done_ = true;
  queue_.reset();  // waits for writes in flight before the fds close
  CloseFd(&direct_fd_);
  CloseFd(&buffered_fd_);
  if (dir_.get() >= 0) unlinkat(dir_.get(), tmp_name_.c_str(), 0);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> NewLocalBackend(
    LocalBackendOptions options) {
  auto backend = std::make_unique<LocalBackend>(std::move(options));
  CKPT_RETURN_IF_ERROR(backend->Init());
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace ckpt::storage
