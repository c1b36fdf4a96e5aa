#include "daemon/health/health.h"

#include <dirent.h>
#include <fcntl.h>
#include <google/protobuf/util/json_util.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <memory>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "shm/huge_pages.h"
#include "storage/open_backend.h"
#include "util/status.h"

namespace ckpt::daemon {
namespace {

using Clock = std::chrono::steady_clock;
using Outcome = HealthCheckResult::Outcome;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

HealthCheckResult Failed(const std::string& name, const std::string& reason) {
  return {name, Outcome::kFailed, reason, 0, "", 0};
}

HealthCheckResult CheckMemcpy(uint64_t bytes) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  // Touch both first so page faults are not measured; then copy for at
  // least 0.2 s (or 8 rounds) and take the best round.
  std::memcpy(dst.data(), src.data(), bytes);
  double best = 1e30;
  const auto start = Clock::now();
  for (int round = 0; round < 8 || SecondsSince(start) < 0.2; ++round) {
    src[round % bytes] = static_cast<char>(round);
    const auto t = Clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    best = std::min(best, SecondsSince(t));
    if (round > 1000) break;
  }
  if (dst[0] != src[0]) return Failed("memcpy", "copy does not match");
  const double gbps = best > 0 ? static_cast<double>(bytes) / best / 1e9 : 0;
  if (gbps <= 0) return Failed("memcpy", "measured no bandwidth");
  return {"memcpy", Outcome::kPassed, "", gbps, "GB/s", 0};
}

// Bytes the files "<prefix>.*" in `dir` hold (the daemon's own arenas).
uint64_t HeldBytes(const std::string& dir, const std::string& prefix) {
  if (prefix.empty()) return 0;
  DIR* d = opendir(dir.c_str());
  if (!d) return 0;
  uint64_t held = 0;
  const std::string lead = prefix + ".";
  while (dirent* e = readdir(d)) {
    if (std::string_view(e->d_name).substr(0, lead.size()) != lead) continue;
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISREG(st.st_mode))
      held += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  closedir(d);
  return held;
}

HealthCheckResult CheckShm(const std::string& dir, uint64_t need,
                           const std::string& prefix) {
  struct statvfs vfs;
  if (statvfs(dir.c_str(), &vfs) != 0)
    return Failed("shm", ErrnoToStatus(errno, "statvfs " + dir).ToString());
  const uint64_t free_bytes =
      static_cast<uint64_t>(vfs.f_bavail) * static_cast<uint64_t>(vfs.f_frsize);
  const double free_gib = static_cast<double>(free_bytes) / (1ull << 30);
  HealthCheckResult r{"shm", Outcome::kPassed, "", free_gib, "GiB free", 0};
  const uint64_t held = need > free_bytes ? HeldBytes(dir, prefix) : 0;
  if (free_bytes + held < need) {
    r.outcome = Outcome::kFailed;
    r.reason = absl::StrFormat(
        "%s has %.2f GiB free, the configured capacity needs %.2f GiB", dir,
        free_gib, static_cast<double>(need) / (1ull << 30));
    return r;
  }
  // A tmpfs mounted read-only or full to the last page fails here.
  const std::string probe = absl::StrCat(dir, "/ckptd-health-probe-", getpid());
  int fd = open(probe.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0)
    return Failed("shm", ErrnoToStatus(errno, "create " + probe).ToString());
  const std::string page(4096, 'h');
  const bool wrote =
      write(fd, page.data(), page.size()) == static_cast<ssize_t>(page.size());
  const int err = errno;
  close(fd);
  unlink(probe.c_str());
  if (!wrote)
    return Failed("shm", ErrnoToStatus(err, "write " + probe).ToString());
  // Not a failure (the node works), but the operator should know.
  const std::string huge = shm::ShmHugePagesOf(dir);
  if (huge.rfind("off: ", 0) == 0)
    r.reason = absl::StrCat("no huge pages (", huge.substr(5),
                            "): each new mapping of an arena fills a page "
                            "table entry per 4 KiB (doc/operations.md)");
  return r;
}

// Write + fsync + read back + delete of one probe object through the same
// backend the daemon uses (a directory or s3://).
HealthCheckResult CheckStorage(const std::string& name, const std::string& url,
                               const storage::ObjectStoreConfig& config,
                               uint64_t bytes) {
  storage::OpenBackendOptions o;
  o.field = name == "root" ? "--root" : "--shared-root";
  o.local.direct_io = false;
  o.local.use_io_uring = false;
  // The probe removes nothing but itself: another node's temp file on a
  // shared root, or the running daemon's on its root, is a write in flight.
  o.local.remove_tmp_files = false;
  o.object = config;
  o.relative_ok = true;
  auto backend = storage::OpenBackend(url, o);
  if (!backend.ok()) return Failed(name, backend.status().ToString());
  const std::string key = absl::StrCat(".health-probe-", getpid());
  std::string data(bytes, '\0');
  for (size_t i = 0; i < data.size(); ++i)
    data[i] = static_cast<char>(i * 131 + 7);
  const auto start = Clock::now();
  // PutSmallObject is durable on return: temp file, fsync, rename, fsync
  // of the directory (a PUT on s3://).
  absl::Status s = (*backend)->PutSmallObject(key, data);
  std::string back(bytes, '\0');
  if (s.ok()) s = (*backend)->ReadAt(key, 0, back.data(), back.size());
  if (s.ok() && back != data)
    s = absl::DataLossError(absl::StrCat("probe ", key, " read back differs"));
  absl::Status deleted = (*backend)->Delete(key);
  if (s.ok()) s = deleted;
  if (!s.ok()) return Failed(name, s.ToString());
  const double secs = SecondsSince(start);
  return {name,   Outcome::kPassed,
          "",     secs > 0 ? 2.0 * static_cast<double>(bytes) / secs / 1e6 : 0,
          "MB/s", 0};
}

}  // namespace

HealthCheckResult RunBounded(const std::string& name,
                             std::function<HealthCheckResult()> check,
                             std::chrono::milliseconds timeout) {
  const auto start = Clock::now();
  auto task = std::make_shared<std::packaged_task<HealthCheckResult()>>(
      std::move(check));
  std::future<HealthCheckResult> done = task->get_future();
  std::thread([task] { (*task)(); }).detach();
  HealthCheckResult r;
  if (done.wait_for(timeout) != std::future_status::ready) {
    r = Failed(name,
               absl::StrFormat("timed out after %.1f s",
                               static_cast<double>(timeout.count()) / 1e3));
  } else {
    r = done.get();
  }
  r.name = name;
  r.seconds = SecondsSince(start);
  return r;
}

std::vector<HealthCheckResult> RunHealthChecks(const HealthOptions& options) {
  std::vector<HealthCheckResult> out;
  // Each lambda holds copies: a timed-out check's thread outlives `options`.
  const uint64_t memcpy_bytes = std::max<uint64_t>(options.memcpy_bytes, 4096);
  out.push_back(RunBounded(
      "memcpy", [memcpy_bytes] { return CheckMemcpy(memcpy_bytes); },
      options.timeout));
  out.push_back(RunBounded(
      "shm",
      [dir = options.shm_dir, need = options.shm_need_bytes,
       prefix = options.shm_prefix] { return CheckShm(dir, need, prefix); },
      options.timeout));
  const auto config = options.object_config;
  const uint64_t probe = std::max<uint64_t>(options.probe_bytes, 1);
  out.push_back(RunBounded(
      "root",
      [url = options.root, config, probe] {
        return CheckStorage("root", url, config, probe);
      },
      options.timeout));
  if (options.shared_root.empty()) {
    out.push_back(
        {"shared_root", Outcome::kSkipped, "no --shared-root", 0, "", 0});
  } else {
    out.push_back(RunBounded(
        "shared_root",
        [url = options.shared_root, config, probe] {
          return CheckStorage("shared_root", url, config, probe);
        },
        options.timeout));
  }
  out.push_back(RunBounded(
      "cuda", [memcpy_bytes] { return CheckCuda(memcpy_bytes); },
      options.timeout));
  return out;
}

bool AllPassed(const std::vector<HealthCheckResult>& results) {
  return std::all_of(results.begin(), results.end(),
                     [](const HealthCheckResult& r) { return r.passed(); });
}

std::string HealthText(const std::vector<HealthCheckResult>& results) {
  std::string out;
  for (const auto& r : results) {
    const char* what = r.outcome == Outcome::kPassed   ? "ok"
                       : r.outcome == Outcome::kFailed ? "FAILED"
                                                       : "skipped";
    absl::StrAppend(&out, r.name, ": ", what);
    if (r.outcome == Outcome::kPassed && !r.unit.empty())
      absl::StrAppend(&out, absl::StrFormat(" %.2f %s", r.figure, r.unit));
    if (!r.reason.empty()) absl::StrAppend(&out, ": ", r.reason);
    absl::StrAppend(&out, absl::StrFormat(" (%.2f s)\n", r.seconds));
  }
  return out;
}

coord::v1::NodeHealthReport ToHealthProto(
    const std::vector<HealthCheckResult>& results) {
  coord::v1::NodeHealthReport report;
  for (const auto& r : results) {
    coord::v1::HealthCheck* c = report.add_checks();
    c->set_name(r.name);
    c->set_passed(r.passed());
    c->set_skipped(r.outcome == Outcome::kSkipped);
    // The coordinator bounds a reason's length; so does the node.
    c->set_reason(r.reason.substr(0, 400));
    c->set_figure(r.figure);
    c->set_unit(r.unit);
    c->set_seconds(r.seconds);
  }
  return report;
}

std::string HealthJson(const std::vector<HealthCheckResult>& results) {
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  std::string checks;
  if (!google::protobuf::util::MessageToJsonString(ToHealthProto(results),
                                                   &checks, o)
           .ok())
    checks = "{}";
  // {"healthy":...,"checks":[...]}: the report's object with one key added.
  return absl::StrCat("{\"healthy\":", AllPassed(results) ? "true" : "false",
                      checks.size() > 2 ? "," : "", checks.substr(1));
}

}  // namespace ckpt::daemon
