#include "util/log.h"

#include <errno.h>  // program_invocation_short_name

#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>

namespace ckpt {
namespace {

void Log(const char* level, std::string_view msg) {
  static std::mutex mu;
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const int ms =
      static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                           now.time_since_epoch())
                           .count() %
                       1000);
  std::tm tm;
  gmtime_r(&t, &tm);
  char ts[32];
  std::strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "%s.%03dZ %s %s: %.*s\n", ts, ms,
               program_invocation_short_name, level,
               static_cast<int>(msg.size()), msg.data());
}

}  // namespace

void LogInfo(std::string_view msg) { Log("info", msg); }
void LogWarning(std::string_view msg) { Log("warning", msg); }

}  // namespace ckpt
