// Launcher: the evidence of a hang (see ckptrun.h, stack_capture.h).
#include <fcntl.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "coordinator/client/channel.h"
#include "tools/ckptrun.h"
#include "tools/stack_capture.h"
#include "util/retry.h"

namespace ckpt::tools {
namespace {

namespace cv1 = ::ckpt::coord::v1;
constexpr std::chrono::seconds kStacksRpcTimeout{10};
constexpr int kStacksSendTries = 3;

}  // namespace

std::string Launcher::LauncherDir() {
  if (stacks_dir_.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ =
        absl::StrCat(tmp && *tmp ? tmp : "/tmp", "/ckptrun-stacks-XXXXXX");
    if (::mkdtemp(templ.data()) == nullptr) return "";
    ::chmod(templ.c_str(), 0755);  // trainers may run as another uid
    stacks_dir_ = templ;
    // A note written here wakes the loop (NoteWatchLoop). Only writes:
    // ckptrun's own opens without one (RankFile) wake nothing.
    if (note_fd_ >= 0)
      inotify_add_watch(note_fd_, stacks_dir_.c_str(), IN_MODIFY);
  }
  return stacks_dir_;
}

std::string Launcher::RankFile(uint32_t rank, const char* suffix,
                               bool truncate) {
  return LauncherFile(absl::StrCat("rank-", rank, suffix), truncate);
}

std::string Launcher::LauncherFile(const std::string& name, bool truncate) {
  if (LauncherDir().empty()) return "";
  std::string path = absl::StrCat(stacks_dir_, "/", name);
  // Write-only for others: a trainer of another uid writes to it, nobody
  // else reads it.
  int fd = ::open(
      path.c_str(),
      O_CREAT | O_WRONLY | O_CLOEXEC | O_NOFOLLOW | (truncate ? O_TRUNC : 0),
      0622);
  if (fd < 0) return "";
  ::fchmod(fd, 0622);
  ::close(fd);
  return path;
}

std::string Launcher::PythonStacksFile(uint32_t rank) {
  return RankFile(rank, ".pystacks", /*truncate=*/false);
}

void Launcher::CaptureStacks(uint64_t generation) {
  std::map<uint32_t, pid_t> running = trainers_.Running();
  Log(absl::StrCat("generation ", generation,
                   ": hang detected; capturing the stacks of ", running.size(),
                   " trainer(s) before stopping them"));
  std::vector<CapturedStacks> captured(running.size());
  std::vector<std::thread> threads;
  size_t i = 0;
  for (const auto& [rank, pid] : running) {
    CaptureOptions o;
    if (!stacks_dir_.empty())
      o.py_file = absl::StrCat(stacks_dir_, "/rank-", rank, ".pystacks");
    threads.emplace_back([&captured, i, rank = rank, pid = pid, o] {
      captured[i] = tools::CaptureStacks(rank, pid, o);
    });
    ++i;
  }
  for (auto& t : threads) t.join();
  cv1::ReportStacksRequest req;
  req.set_node_id(opts_.node_id);
  req.set_job(opts_.job);
  req.set_generation(generation);
  for (const CapturedStacks& c : captured) {
    Log(absl::StrCat("generation ", generation, ": rank ", c.rank, " (pid ",
                     c.pid, "): ", c.text.size(), " bytes of stacks (", c.tool,
                     ")"));
    cv1::RankStacks* r = req.add_ranks();
    r->set_rank(c.rank);
    r->set_pid(static_cast<uint32_t>(c.pid));
    r->set_tool(c.tool);
    r->set_text(c.text);
  }
  for (int attempt = 1; attempt <= kStacksSendTries; ++attempt) {
    cv1::ReportStacksResponse resp;
    absl::Status s = coordinator::CoordStatus(
        client_->Call(&cv1::Coordinator::Stub::ReportStacks, req, &resp,
                      kStacksRpcTimeout),
        "ReportStacks", client_->current());
    if (s.ok()) {
      Log(absl::StrCat("generation ", generation,
                       ": stacks sent: ckptctl stacks --job ", opts_.job,
                       " --generation ", generation));
      return;
    }
    Log(absl::StrCat("generation ", generation, ": stacks not sent (try ",
                     attempt, "): ", s.message()));
    if (!IsUnreachable(s)) break;
  }
  // Kept in the log at least: nobody else will have them.
  for (const CapturedStacks& c : captured)
    Log(absl::StrCat("generation ", generation, ": rank ", c.rank, " stacks:\n",
                     c.text));
}

}  // namespace ckpt::tools
