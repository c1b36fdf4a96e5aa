#include "shm/huge_pages.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ckpt::shm {
namespace {

std::string ReadSmallFile(const char* path) {
  std::string out;
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[8192];
  for (ssize_t n;
       (n = ::read(fd, buf, sizeof buf)) > 0 && out.size() < (1 << 22);)
    out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

// The pieces of `text` between `sep`s (empty ones included).
std::vector<std::string_view> Split(std::string_view text, char sep) {
  std::vector<std::string_view> out;
  for (size_t at = 0;;) {
    const size_t next = text.find(sep, at);
    out.push_back(text.substr(at, next - at));
    if (next == std::string_view::npos) return out;
    at = next + 1;
  }
}

}  // namespace

std::string ShmHugePages(std::string_view mountinfo,
                         std::string_view shmem_enabled, std::string_view dir) {
  // The mount holding `dir`: the longest mount point that is `dir` or a
  // parent of it; of equal ones the last (it covers the others).
  std::string_view best_point, best_type, best_options;
  bool found = false;
  for (std::string_view line : Split(mountinfo, '\n')) {
    // id parent major:minor root mount-point options [optional...] -
    // fstype source super-options
    const std::vector<std::string_view> f = Split(line, ' ');
    auto dash = std::find(f.begin(), f.end(), "-");
    if (f.size() < 5 || dash == f.end() || f.end() - dash < 4) continue;
    const std::string_view point = f[4];
    const bool covers = dir == point || point == "/" ||
                        (dir.substr(0, point.size()) == point &&
                         dir.size() > point.size() && dir[point.size()] == '/');
    if (!covers || point.size() < best_point.size()) continue;
    best_point = point;
    best_type = dash[1];
    best_options = dash[3];
    found = true;
  }
  if (!found || best_type != "tmpfs") return "unknown";
  std::string mode = "never";  // tmpfs shows huge= only when it is not
  for (std::string_view o : Split(best_options, ','))
    if (o.substr(0, 5) == "huge=") mode = std::string(o.substr(5));
  if (shmem_enabled.find("[deny]") != std::string_view::npos)
    return "off: shmem_enabled is deny, huge=" + mode;
  if (shmem_enabled.find("[force]") != std::string_view::npos)
    return "on: shmem_enabled is force";
  if (mode == "never")
    return "off: " + std::string(best_point) + " is mounted huge=" + mode;
  return "on: huge=" + mode;
}

std::string ShmHugePagesOf(const std::string& dir) {
  return ShmHugePages(
      ReadSmallFile("/proc/self/mountinfo"),
      ReadSmallFile("/sys/kernel/mm/transparent_hugepage/shmem_enabled"), dir);
}

std::string FindHugetlbfs(std::string_view mountinfo, bool default_2m) {
  for (std::string_view line : Split(mountinfo, '\n')) {
    const std::vector<std::string_view> f = Split(line, ' ');
    auto dash = std::find(f.begin(), f.end(), "-");
    if (f.size() < 5 || dash == f.end() || f.end() - dash < 4) continue;
    if (dash[1] != "hugetlbfs") continue;
    bool two_mib = default_2m;
    for (std::string_view o : Split(dash[3], ','))
      if (o.substr(0, 9) == "pagesize=") two_mib = o.substr(9) == "2M";
    // Mount points with spaces are escaped (\040): not ours to guess.
    if (two_mib && f[4].find('\\') == std::string_view::npos)
      return std::string(f[4]);
  }
  return "";
}

std::string FindHugetlbfsOf() {
  const std::string meminfo = ReadSmallFile("/proc/meminfo");
  return FindHugetlbfs(
      ReadSmallFile("/proc/self/mountinfo"),
      meminfo.find("Hugepagesize:       2048 kB") != std::string::npos);
}

absl::Status CheckHugetlbfsDir(const std::string& dir) {
  struct statfs fs {};
  struct stat st {};
  if (dir.empty() || dir[0] != '/' || ::stat(dir.c_str(), &st) != 0 ||
      !S_ISDIR(st.st_mode) || ::statfs(dir.c_str(), &fs) != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("hugetlbfs directory \"", dir,
                     "\": not an absolute path to a directory"));
  if (static_cast<uint64_t>(fs.f_type) != HUGETLBFS_MAGIC ||
      fs.f_bsize != (2 << 20))
    return absl::InvalidArgumentError(
        absl::StrCat("hugetlbfs directory \"", dir,
                     "\": not on a hugetlbfs of 2 MiB pages (mount -t "
                     "hugetlbfs -o pagesize=2M none DIR)"));
  return absl::OkStatus();
}

void* MapHugeAnonymous(uint64_t bytes) {
  constexpr uint64_t kHuge = 2ull << 20;
  const uint64_t keep = (bytes + 4095) & ~uint64_t{4095};
  void* got = mmap(nullptr, keep + kHuge, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (got == MAP_FAILED) return MAP_FAILED;
  char* raw = static_cast<char*>(got);
  char* base = reinterpret_cast<char*>(
      (reinterpret_cast<uintptr_t>(raw) + kHuge - 1) & ~uintptr_t{kHuge - 1});
  // Trim to [base, base + bytes): what the caller unmaps.
  if (base > raw) munmap(raw, static_cast<size_t>(base - raw));
  if (char* end = raw + keep + kHuge; end > base + keep)
    munmap(base + keep, static_cast<size_t>(end - (base + keep)));
  (void)madvise(base, bytes, MADV_HUGEPAGE);  // advice: ignored without THP
  return base;
}

}  // namespace ckpt::shm
