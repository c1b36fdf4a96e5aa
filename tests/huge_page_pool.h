// Huge pages for a test: a hugetlbfs mount of 2 MiB pages on a fresh
// directory, and (optionally) pages reserved in the kernel's pool by
// raising /proc/sys/vm/nr_hugepages by the number asked for. Both are
// undone by the destructor: the mount detached, nr_hugepages set back to
// what it was (CI runs as root on a shared 24 GiB VM; a test reserves a
// few MiB). Root only: where the kernel refuses (no CAP_SYS_ADMIN, memory
// too fragmented for the pages), skip() says why and the test skips.
// One pool at a time on the machine (a lock file, waited for): two tests
// in parallel would each set nr_hugepages back to what they read, and the
// first to finish would take the pages from under the other.
#ifndef CKPT_TESTS_HUGE_PAGE_POOL_H_
#define CKPT_TESTS_HUGE_PAGE_POOL_H_

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace ckpt::testing {

class HugePagePool {
 public:
  // Mounts a hugetlbfs; with `pages` > 0, makes that many more 2 MiB
  // pages free in the pool first.
  explicit HugePagePool(long pages) {
    if (::geteuid() != 0) {
      skip_ = "not root: cannot reserve huge pages or mount hugetlbfs";
      return;
    }
    lock_fd_ = ::open("/tmp/ckpt_huge_page_pool.lock",
                      O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    if (lock_fd_ < 0 || ::flock(lock_fd_, LOCK_EX) != 0) {
      skip_ = std::string("lock /tmp/ckpt_huge_page_pool.lock: ") +
              std::strerror(errno);
      return;
    }
    if (pages > 0) {
      old_total_ = ReadLong("/proc/sys/vm/nr_hugepages");
      const long free_before = MeminfoLong("HugePages_Free:");
      if (old_total_ < 0 || free_before < 0 ||
          !WriteLong("/proc/sys/vm/nr_hugepages", old_total_ + pages)) {
        skip_ = "cannot write /proc/sys/vm/nr_hugepages";
        old_total_ = -1;
        return;
      }
      if (MeminfoLong("HugePages_Free:") < free_before + pages) {
        skip_ = "the kernel found fewer than " + std::to_string(pages) +
                " free 2 MiB pages (memory fragmented)";
        return;
      }
    }
    char tmpl[] = "/tmp/ckpt_hugetlbfs.XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      skip_ = std::string("mkdtemp: ") + std::strerror(errno);
      return;
    }
    dir_ = tmpl;
    if (::mount("none", dir_.c_str(), "hugetlbfs", 0,
                "pagesize=2M,mode=0755") != 0) {
      skip_ = std::string("mount hugetlbfs: ") + std::strerror(errno);
      return;
    }
    mounted_ = true;
  }
  ~HugePagePool() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
    if (!dir_.empty()) ::rmdir(dir_.c_str());
    if (old_total_ >= 0) WriteLong("/proc/sys/vm/nr_hugepages", old_total_);
    if (lock_fd_ >= 0) ::close(lock_fd_);  // the lock goes with it
  }
  HugePagePool(const HugePagePool&) = delete;
  HugePagePool& operator=(const HugePagePool&) = delete;

  // Non-empty: why the pool is not there (skip the test).
  const std::string& skip() const { return skip_; }
  // The mount point, "/tmp/ckpt_hugetlbfs.XXXXXX".
  const std::string& dir() const { return dir_; }
  static long FreePages() { return MeminfoLong("HugePages_Free:"); }

 private:
  static long ReadLong(const char* path) {
    FILE* f = std::fopen(path, "r");
    if (f == nullptr) return -1;
    long v = -1;
    if (std::fscanf(f, "%ld", &v) != 1) v = -1;
    std::fclose(f);
    return v;
  }
  static bool WriteLong(const char* path, long v) {
    FILE* f = std::fopen(path, "w");
    if (f == nullptr) return false;
    const bool ok = std::fprintf(f, "%ld\n", v) > 0;
    return std::fclose(f) == 0 && ok;
  }
  static long MeminfoLong(const char* field) {
    FILE* f = std::fopen("/proc/meminfo", "r");
    if (f == nullptr) return -1;
    char line[256];
    long v = -1;
    const size_t n = std::strlen(field);
    while (std::fgets(line, sizeof line, f) != nullptr)
      if (std::strncmp(line, field, n) == 0)
        v = std::strtol(line + n, nullptr, 10);
    std::fclose(f);
    return v;
  }
  std::string skip_, dir_;
  long old_total_ = -1;
  bool mounted_ = false;
  int lock_fd_ = -1;
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_HUGE_PAGE_POOL_H_
