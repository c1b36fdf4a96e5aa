#include "bench/daemon_process.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "ckpt.grpc.pb.h"
#include "util/status.h"

extern char** environ;

namespace ckpt::bench {
namespace {

absl::StatusOr<v1::StatusResponse> QueryStatus(const std::string& socket,
                                               int timeout_ms) {
  auto channel =
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
  auto stub = v1::Ckptd::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(timeout_ms));
  v1::StatusResponse resp;
  grpc::Status s = stub->Status(&ctx, v1::StatusRequest(), &resp);
  if (!s.ok())
    return absl::UnavailableError(
        absl::StrCat("Status via ", socket, ": ", s.error_message()));
  return resp;
}

}  // namespace

std::string DefaultCkptdPath() {
  std::error_code ec;
  std::filesystem::path self =
      std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "ckptd";
  return (self.parent_path() / ".." / "daemon" / "ckptd")
      .lexically_normal()
      .string();
}

DaemonProcess::~DaemonProcess() {
  // A destructor cannot report: a failed stop leaves nothing to act on.
  if (pid_ > 0) (void)Stop();
}

absl::Status DaemonProcess::Start() {
  if (pid_ > 0) return absl::FailedPreconditionError("ckptd already running");
  if (access(config_.binary.c_str(), X_OK) != 0)
    return ErrnoToStatus(
        errno, "ckptd binary " + config_.binary + " (use --ckptd PATH)");
  std::vector<std::string> args = {
      config_.binary, "--socket",     config_.socket,    "--root",
      config_.root,   "--shm-prefix", config_.shm_prefix};
  args.insert(args.end(), config_.extra_args.begin(), config_.extra_args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO,
                                   config_.log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid;
  int err = posix_spawn(&pid, config_.binary.c_str(), &actions, nullptr,
                        argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) return ErrnoToStatus(err, "spawn " + config_.binary);
  pid_ = pid;

  auto deadline = std::chrono::steady_clock::now() + config_.start_timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    int status;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::InternalError(
          absl::StrCat("ckptd exited during start-up (status ", status,
                       "); see ", config_.log_path));
    }
    if (std::filesystem::exists(config_.socket) &&
        QueryStatus(config_.socket, 500).ok())
      return absl::OkStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  (void)Stop();  // the timeout is the error to report, not how the stop went
  return absl::DeadlineExceededError(
      absl::StrCat("ckptd did not answer on ", config_.socket,
                   " within the start timeout; see ", config_.log_path));
}

absl::Status DaemonProcess::Stop() {
  if (pid_ <= 0) return absl::OkStatus();
  if (kill(pid_, SIGTERM) != 0 && errno != ESRCH)
    return ErrnoToStatus(errno, "kill ckptd");
  int status = 0;
  pid_t r;
  do r = waitpid(pid_, &status, 0);
  while (r < 0 && errno == EINTR);
  pid_ = -1;
  if (r < 0) return ErrnoToStatus(errno, "waitpid ckptd");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return absl::InternalError(absl::StrCat("ckptd exited with status ", status,
                                            "; see ", config_.log_path));
  return absl::OkStatus();
}

absl::StatusOr<DaemonProcess::State> DaemonProcess::Query() const {
  auto st = QueryStatus(config_.socket, 5000);
  if (!st.ok()) return st.status();
  State state;
  state.backend = st->backend();
  for (const auto& a : st->arenas()) state.arenas.push_back(a.shm_name());
  state.persist_queue = st->persist_queue();
  state.bytes_in_flight = st->bytes_in_flight();
  state.upload_backlog_shards = st->upload_backlog_shards();
  state.last_upload_error = st->last_upload_error();
  return state;
}

}  // namespace ckpt::bench
