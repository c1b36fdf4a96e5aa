#include "bench/storage_throttle.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ckpt::bench {
namespace {

namespace fs = std::filesystem;

absl::Status Refused(const std::string& why) {
  return absl::FailedPreconditionError(why);
}

// One write(2), so that the kernel's refusal (EINVAL, EBUSY, EACCES) is
// the errno reported.
absl::Status WriteFile(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  const ssize_t n = fd < 0 ? -1 : ::write(fd, text.data(), text.size());
  const int err = errno;
  if (fd >= 0) ::close(fd);
  if (n != static_cast<ssize_t>(text.size()))
    return Refused(absl::StrCat("cannot write '", text, "' to ", path, ": ",
                                n < 0 ? std::strerror(err) : "short write"));
  return absl::OkStatus();
}

std::string ReadLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// The disk ("major:minor") that holds `dir`: a partition's parent disk.
absl::StatusOr<std::string> DiskOf(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0)
    return Refused(absl::StrCat("stat ", dir, ": ", std::strerror(errno)));
  const std::string dev = absl::StrCat(major(st.st_dev), ":", minor(st.st_dev));
  const fs::path sys = fs::path("/sys/dev/block") / dev;
  std::error_code ec;
  if (!fs::exists(sys, ec))
    return Refused(
        absl::StrCat(dir, " is not on a block device (device ", dev, ")"));
  if (!fs::exists(sys / "partition", ec)) return dev;
  const fs::path disk = fs::canonical(sys, ec).parent_path() / "dev";
  std::string parent = ReadLine(disk.string());
  if (ec || parent.empty())
    return Refused(absl::StrCat("the disk of partition ", dev, " not found"));
  return parent;
}

// The process's cgroup directory in the hierarchy that has the block
// controller, and whether that hierarchy is cgroup v2.
struct Hierarchy {
  std::string dir;  // the process's cgroup now
  bool v2 = false;
};

absl::StatusOr<Hierarchy> BlockHierarchy() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  std::optional<std::string> v2_path;  // the "0::" line's, when there is one
  while (std::getline(in, line)) {
    std::vector<std::string> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    for (absl::string_view c : absl::StrSplit(f[1], ','))
      if (c == "blkio")
        return Hierarchy{absl::StrCat("/sys/fs/cgroup/blkio", f[2]), false};
    if (f[0] == "0") v2_path = f[2];
  }
  if (v2_path) {
    for (const char* mount : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}) {
      const std::string dir = absl::StrCat(mount, *v2_path);
      const std::string controllers = ReadLine(dir + "/cgroup.controllers");
      for (absl::string_view c : absl::StrSplit(controllers, ' '))
        if (c == "io") return Hierarchy{dir, true};
    }
  }
  return Refused(
      "no cgroup hierarchy with the block I/O controller "
      "(blkio or io) for this process");
}

}  // namespace

StorageThrottle::~StorageThrottle() { Stop(); }

absl::Status StorageThrottle::Start(const std::string& dir, double gbit) {
  if (!cgroup_.empty()) return Refused("already throttling");
  if (::geteuid() != 0) return Refused("needs root (cgroup block throttling)");
  absl::StatusOr<std::string> disk = DiskOf(dir);
  if (!disk.ok()) return disk.status();
  absl::StatusOr<Hierarchy> h = BlockHierarchy();
  if (!h.ok()) return h.status();
  const auto bps = static_cast<uint64_t>(gbit * 1e9 / 8);
  if (h->v2) {
    // The child may use the io controller only if its parent hands it out.
    absl::Status on = WriteFile(h->dir + "/cgroup.subtree_control", "+io");
    if (!on.ok()) return on;
  }
  const std::string cg =
      absl::StrCat(h->dir, "/ckpt-recovery-bench-", ::getpid());
  std::error_code ec;
  fs::create_directory(cg, ec);
  if (ec) return Refused(absl::StrCat("mkdir ", cg, ": ", ec.message()));
  absl::Status s =
      h->v2 ? WriteFile(cg + "/io.max", absl::StrCat(*disk, " rbps=", bps))
            : WriteFile(cg + "/blkio.throttle.read_bps_device",
                        absl::StrCat(*disk, " ", bps));
  if (s.ok()) s = WriteFile(cg + "/cgroup.procs", std::to_string(::getpid()));
  if (!s.ok()) {
    fs::remove(cg, ec);
    return s;
  }
  cgroup_ = cg;
  parent_ = h->dir;
  device_ = *disk;
  return absl::OkStatus();
}

void StorageThrottle::Stop() {
  if (cgroup_.empty()) return;
  (void)WriteFile(parent_ + "/cgroup.procs", std::to_string(::getpid()));
  std::error_code ec;
  fs::remove(cgroup_, ec);  // fails while a child is still in it: left empty
  cgroup_.clear();
}

}  // namespace ckpt::bench
