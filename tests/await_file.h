// AwaitFile: returns once a file exists, woken by inotify on its directory
// (a create or a rename into it) rather than by polling. Test-only.
#ifndef CKPT_TESTS_AWAIT_FILE_H_
#define CKPT_TESTS_AWAIT_FILE_H_

#include <sys/inotify.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace ckpt::testing {

// Whether `path` exists now or appears later; false only when its
// directory cannot be watched and it does not exist.
inline bool AwaitFile(const std::string& path) {
  const int fd = inotify_init1(IN_CLOEXEC);
  if (fd < 0) return std::filesystem::exists(path);
  const std::string dir = std::filesystem::path(path).parent_path();
  // Watched before the check: a file that appears in between is an event.
  const bool watched =
      inotify_add_watch(fd, dir.c_str(), IN_CREATE | IN_MOVED_TO) >= 0;
  bool found = std::filesystem::exists(path);
  alignas(inotify_event) char events[4096];
  while (!found && watched && read(fd, events, sizeof events) > 0)
    found = std::filesystem::exists(path);
  close(fd);
  return found;
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_AWAIT_FILE_H_
