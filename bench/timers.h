// Timers: one thread that runs tasks at their due times (seconds of the
// steady clock, Now()), in due order; equal times run in the order given.
// At() is thread-safe; tasks run on the timer thread, one at a time. Used
// by coord_scale_bench's simulated nodes.
#ifndef CKPT_BENCH_TIMERS_H_
#define CKPT_BENCH_TIMERS_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <queue>
#include <thread>
#include <vector>

namespace ckpt::bench {

inline double Now() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class Timers {
 public:
  Timers() : thread_([this] { Loop(); }) {}
  ~Timers() { Stop(); }
  void At(double when, std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    q_.push({when, seq_++, std::move(fn)});
    cv_.notify_one();
  }
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct Task {
    double when;
    uint64_t seq;
    std::function<void()> fn;
    bool operator>(const Task& o) const {
      return when != o.when ? when > o.when : seq > o.seq;
    }
  };
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      if (q_.empty()) {
        cv_.wait(lock);
        continue;
      }
      double wait = q_.top().when - Now();
      if (wait > 0) {
        cv_.wait_for(lock, std::chrono::duration<double>(wait));
        continue;
      }
      Task t = q_.top();
      q_.pop();
      lock.unlock();
      t.fn();
      lock.lock();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::priority_queue<Task, std::vector<Task>, std::greater<Task>> q_;
  uint64_t seq_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace ckpt::bench

#endif  // CKPT_BENCH_TIMERS_H_
