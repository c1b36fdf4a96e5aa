#include "util/program.h"

#include <pthread.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstring>

namespace ckpt {

bool PrintedVersion(int argc, char** argv, const char* program,
                    const char* version) {
  for (int i = 1; i < argc && std::strcmp(argv[i], "--") != 0; ++i) {
    if (std::strcmp(argv[i], "--version") == 0) {
      std::printf("%s %s\n", program, version);
      return true;
    }
  }
  return false;
}

bool PrintedHelp(int argc, char** argv, const char* usage) {
  for (int i = 1; i < argc && std::strcmp(argv[i], "--") != 0; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 ||
        std::strcmp(argv[i], "-h") == 0) {
      std::printf("%s\n", usage);
      return true;
    }
  }
  return false;
}

sigset_t BlockSignals(std::initializer_list<int> signals) {
  sigset_t set;
  sigemptyset(&set);
  for (int s : signals) sigaddset(&set, s);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

uint64_t RaiseDescriptorLimit() {
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) != 0) return 0;
  if (nofile.rlim_cur < nofile.rlim_max) {
    rlimit raised = nofile;
    raised.rlim_cur = nofile.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) nofile = raised;
  }
  return static_cast<uint64_t>(nofile.rlim_cur);
}

}  // namespace ckpt
