#include "daemon/core/peer_creds.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace ckpt::daemon {

int64_t BootClockMs() {
  timespec ts{};
  clock_gettime(CLOCK_BOOTTIME, &ts);
  return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
}

int64_t ProcessStartMs(pid_t pid) {
  if (pid <= 0) return 0;  // SO_PEERCRED's answer for a peer we cannot see
  int fd =
      open(absl::StrCat("/proc/", pid, "/stat").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[4096];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so
  // the fields are counted from its last ')'. starttime is field 22, the
  // 20th after it (state is field 3).
  absl::string_view stat(buf, static_cast<size_t>(n));
  size_t at = stat.rfind(')');
  if (at == absl::string_view::npos) return 0;
  std::vector<absl::string_view> fields =
      absl::StrSplit(stat.substr(at + 1), ' ', absl::SkipEmpty());
  uint64_t ticks = 0;
  const long hz = sysconf(_SC_CLK_TCK);
  if (fields.size() < 20 || hz <= 0 || !absl::SimpleAtoi(fields[19], &ticks))
    return 0;
  return static_cast<int64_t>(ticks * 1000 / static_cast<uint64_t>(hz));
}

}  // namespace ckpt::daemon
