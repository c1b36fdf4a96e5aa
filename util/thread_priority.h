// Background threads that must not slow training down: the replica
// sender and the holder's receive-and-verify run at nice 19 and carry a
// name that `top -H`, `ps -L` and /proc/PID/task/TID/comm show. Nice only
// weighs CPU contention: on an idle core such a thread runs at full speed;
// where training's threads want the core (a CPU-offloaded optimizer, a
// node with few cores per GPU) they get about 98% of it (weights 1024 to
// 15). A recovery's fetch is never made background. Functions; each acts
// on the calling thread only.
#ifndef CKPT_UTIL_THREAD_PRIORITY_H_
#define CKPT_UTIL_THREAD_PRIORITY_H_

#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <string>

namespace ckpt {

inline constexpr int kBackgroundNice = 19;

// The calling thread at nice kBackgroundNice (best effort: a failure
// leaves it at its priority), named `name` (cut to the kernel's 15 bytes).
inline void RunThisThreadInBackground(const std::string& name) {
  (void)pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
  (void)setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), kBackgroundNice);
}

}  // namespace ckpt

#endif  // CKPT_UTIL_THREAD_PRIORITY_H_
