// Waiting in a test for a condition a test cannot be told of (a daemon's
// state seen through its RPCs, a file another process writes): polled
// every 10 ms. The bound only marks a failure; a wait whose event may
// take minutes on a loaded machine says so with a longer one.
#ifndef CKPT_TESTS_EVENTUALLY_H_
#define CKPT_TESTS_EVENTUALLY_H_

#include <chrono>
#include <functional>
#include <thread>

namespace ckpt::testing {

// Whether `cond` holds within `bound`.
inline bool Eventually(
    const std::function<bool()>& cond,
    std::chrono::steady_clock::duration bound = std::chrono::seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + bound;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_EVENTUALLY_H_
