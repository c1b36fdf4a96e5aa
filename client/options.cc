// ClientOptions::ResolveFromEnvironment and ResolveRank: the one place
// libckpt reads its environment (CKPT_SOCKET, CKPT_JOB, RANK, WORLD_SIZE,
// LOCAL_RANK, CKPT_GENERATION), and the one place any front end (C++, C,
// Python) decides the launcher rule.
#include <sys/un.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "ckpt/client.h"
#include "shm/arena.h"
#include "util/validate.h"

namespace ckpt {

namespace {

const char* Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// Fills *value from $var when it is still `unset`; the error names the
// field and the variable.
absl::Status IntFromEnv(int* value, const char* field, const char* var) {
  if (*value != -1) return absl::OkStatus();
  const char* text = Env(var);
  if (text == nullptr)
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": not set, and $", var, " is not set"));
  int parsed = 0;
  if (!absl::SimpleAtoi(text, &parsed))
    return absl::InvalidArgumentError(
        absl::StrCat("$", var, ": ", QuotePrefix(text), " is not an integer"));
  if (parsed < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("$", var, ": ", parsed, " is negative"));
  *value = parsed;
  return absl::OkStatus();
}

}  // namespace

absl::Status ResolveRank(int* rank, int* world_size, int* local_rank) {
  int r = *rank, w = *world_size, local = -1;
  if (r < -1)
    return absl::InvalidArgumentError(
        absl::StrCat("rank: ", r, " is negative"));
  if (w < -1 || w == 0)
    return absl::InvalidArgumentError(
        absl::StrCat("world_size: ", w, " is not positive"));
  const bool rank_from_env = r == -1, world_from_env = w == -1;
  // Neither given nor set by a launcher: a process on its own.
  if (rank_from_env && world_from_env && Env("RANK") == nullptr &&
      Env("WORLD_SIZE") == nullptr) {
    r = 0;
    w = 1;
  }
  if (absl::Status s = IntFromEnv(&r, "rank", "RANK"); !s.ok()) return s;
  if (absl::Status s = IntFromEnv(&w, "world_size", "WORLD_SIZE"); !s.ok())
    return s;
  if (w == 0)
    return absl::InvalidArgumentError(
        "world_size: 0 (from $WORLD_SIZE) is not positive");
  if (r >= w)
    return absl::InvalidArgumentError(absl::StrCat(
        rank_from_env ? "$RANK" : "rank", ": ", r, " is not in [0, ",
        world_from_env ? "$WORLD_SIZE " : "world_size ", w, ")"));
  if (Env("LOCAL_RANK") != nullptr) {
    if (absl::Status s = IntFromEnv(&local, "local_rank", "LOCAL_RANK");
        !s.ok())
      return s;
  }
  *rank = r;
  *world_size = w;
  if (local_rank != nullptr) *local_rank = local;
  return absl::OkStatus();
}

absl::Status ClientOptions::ResolveFromEnvironment() {
  bool socket_from_env = false;
  if (socket_path.empty()) {
    const char* v = Env("CKPT_SOCKET");
    if (v == nullptr)
      return absl::InvalidArgumentError(
          "socket_path: not set, and $CKPT_SOCKET is not set");
    socket_path = v;
    socket_from_env = true;
  }
  const char* socket_field = socket_from_env ? "$CKPT_SOCKET" : "socket_path";
  if (socket_path.size() >= sizeof(sockaddr_un{}.sun_path))
    return absl::InvalidArgumentError(absl::StrCat(
        socket_field, ": \"", socket_path, "\" is ", socket_path.size(),
        " bytes, at most ", sizeof(sockaddr_un{}.sun_path) - 1,
        " fit a Unix socket address"));
  if (socket_path.find('\0') != std::string::npos)
    return absl::InvalidArgumentError(
        absl::StrCat(socket_field, ": contains a NUL byte"));

  bool job_from_env = false;
  if (job.empty()) {
    const char* v = Env("CKPT_JOB");
    if (v == nullptr)
      return absl::InvalidArgumentError(
          "job: not set, and $CKPT_JOB is not set");
    job = v;
    job_from_env = true;
  }
  if (absl::Status s = ValidateJobName(job, job_from_env ? "$CKPT_JOB" : "job");
      !s.ok())
    return s;

  if (absl::Status s = ResolveRank(&rank, &world_size, nullptr); !s.ok())
    return s;

  if (!generation) {
    if (const char* text = Env("CKPT_GENERATION")) {
      uint64_t parsed = 0;
      if (!absl::SimpleAtoi(text, &parsed))
        return absl::InvalidArgumentError(
            absl::StrCat("$CKPT_GENERATION: \"",
                         std::string(std::string_view(text).substr(0, 64)),
                         "\" is not a non-negative integer"));
      generation = parsed;
    }
  }

  if (num_slots < 2 || num_slots > static_cast<int>(shm::kMaxSlots))
    return absl::InvalidArgumentError(absl::StrCat(
        "num_slots: ", num_slots, " is not in [2, ", shm::kMaxSlots, "]"));
  if (!std::isfinite(slot_headroom) || slot_headroom < 0 || slot_headroom > 16)
    return absl::InvalidArgumentError(
        absl::StrCat("slot_headroom: ", slot_headroom, " is not in [0, 16]"));
  if (slot_bytes > (uint64_t{1} << 48))
    return absl::InvalidArgumentError(
        absl::StrCat("slot_bytes: ", slot_bytes, " exceeds 2^48"));
  // The RPC carries the timeout as uint32 milliseconds (about 49 days).
  if (busy_timeout.count() < 0 ||
      busy_timeout.count() > std::numeric_limits<uint32_t>::max())
    return absl::InvalidArgumentError(absl::StrCat(
        "busy_timeout: ", busy_timeout.count(), " ms is not in [0, 2^32) ms"));
  if (copy_threads < 0 || copy_threads > 1024)
    return absl::InvalidArgumentError(
        absl::StrCat("copy_threads: ", copy_threads, " is not in [0, 1024]"));
  return absl::OkStatus();
}

}  // namespace ckpt
