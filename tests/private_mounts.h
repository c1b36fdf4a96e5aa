// Runs a test body in a forked child with its own mount namespace, so that
// it can mount tmpfs file systems (over /dev/shm, say) without touching the
// machine's: the mounts go when the child exits. Root only; where the
// kernel refuses (no CAP_SYS_ADMIN, a container), the result says why and
// the caller skips.
#ifndef CKPT_TESTS_PRIVATE_MOUNTS_H_
#define CKPT_TESTS_PRIVATE_MOUNTS_H_

#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace ckpt::testing {

struct ChildResult {
  bool skipped = false;  // the namespace or a mount was refused: text says
  bool exited = false;   // false: killed by a signal (or fork failed)
  int code = -1;
  std::string text;  // what the body returned, or why it was skipped
};

// A tmpfs to mount in the child: where, and its options ("huge=advise").
struct TmpfsMount {
  std::string at;
  std::string options;
};

// Forks; the child enters a private mount namespace, mounts `mounts`, runs
// `body` and exits with its code, handing its text to the parent.
inline ChildResult RunWithPrivateMounts(
    const std::vector<TmpfsMount>& mounts,
    const std::function<std::pair<int, std::string>()>& body) {
  constexpr int kSkip = 77;
  int fds[2];
  if (::pipe(fds) != 0) return {};
  const pid_t child = ::fork();
  if (child < 0) return {};
  if (child == 0) {
    ::close(fds[0]);
    auto finish = [&](int code, const std::string& text) {
      (void)!::write(fds[1], text.data(), text.size());
      ::_exit(code);
    };
    if (::unshare(CLONE_NEWNS) != 0 ||
        ::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
      finish(kSkip,
             std::string("a private mount namespace: ") + std::strerror(errno));
    for (const TmpfsMount& m : mounts)
      if (::mount("tmpfs", m.at.c_str(), "tmpfs", 0, m.options.c_str()) != 0)
        finish(kSkip, "tmpfs on " + m.at + " (" + m.options +
                          "): " + std::strerror(errno));
    auto [code, text] = body();
    finish(code, text);
  }
  ::close(fds[1]);
  ChildResult r;
  char buf[1024];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;)
    r.text.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  if (::waitpid(child, &status, 0) != child || !WIFEXITED(status)) return r;
  r.exited = true;
  r.code = WEXITSTATUS(status);
  r.skipped = r.code == kSkip;
  return r;
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_PRIVATE_MOUNTS_H_
