#include "util/retry.h"

#include <algorithm>
#include <charconv>
#include <random>

namespace ckpt {

int RetryAfterMs(absl::StatusCode code, std::string_view message) {
  if (code != absl::StatusCode::kResourceExhausted) return -1;
  constexpr std::string_view kSays = "retry after ";
  const size_t at = message.rfind(kSays);
  if (at == std::string_view::npos) return -1;
  std::string_view rest = message.substr(at + kSays.size());
  int ms = -1;
  auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), ms);
  if (ec != std::errc() || ms < 0 ||
      std::string_view(end, rest.data() + rest.size()).rfind(" ms", 0) != 0)
    return -1;
  return std::min(ms, 60000);
}

std::chrono::milliseconds JitterMs(int64_t lo_ms, int64_t hi_ms) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  if (hi_ms <= lo_ms) return std::chrono::milliseconds(lo_ms);
  return std::chrono::milliseconds(
      std::uniform_int_distribution<int64_t>(lo_ms, hi_ms)(rng));
}

std::chrono::milliseconds FullJitterBackoff(int64_t base_ms, int64_t max_ms,
                                            unsigned attempt) {
  const int64_t ceiling =
      std::min<int64_t>(max_ms, base_ms << std::min(attempt, 20u));
  return JitterMs(0, ceiling);
}

bool IsUnreachable(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable ||
         code == absl::StatusCode::kDeadlineExceeded;
}

bool IsTransient(absl::StatusCode code) {
  return IsUnreachable(code) || code == absl::StatusCode::kResourceExhausted;
}

}  // namespace ckpt
