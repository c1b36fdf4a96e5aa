// RendezvousKeeper (see ckptrun_rendezvous.h).
#include "tools/ckptrun_rendezvous.h"

#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/rendezvous_server.h"

extern char** environ;

namespace ckpt::tools {

absl::StatusOr<RendezvousKind> ParseRendezvous(const std::string& value,
                                               const std::string& program) {
  if (value == "trainer") return RendezvousKind::kTrainer;
  if (value == "worker") return RendezvousKind::kWorker;
  if (value == "torch") return RendezvousKind::kTorch;
  if (value == "auto") {
    size_t slash = program.rfind('/');
    std::string base =
        slash == std::string::npos ? program : program.substr(slash + 1);
    return base == "ckpt-worker" ? RendezvousKind::kWorker
                                 : RendezvousKind::kTrainer;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--rendezvous: \"", value.substr(0, 32),
                   "\" is not one of auto, trainer, worker, torch"));
}

const char* RendezvousName(RendezvousKind kind) {
  switch (kind) {
    case RendezvousKind::kTrainer:
      return "trainer";
    case RendezvousKind::kWorker:
      return "worker";
    case RendezvousKind::kTorch:
      return "torch";
  }
  return "?";
}

RendezvousKeeper::RendezvousKeeper(RendezvousKind kind, uint32_t port,
                                   std::string python, std::string log)
    : kind_(kind),
      port_(port),
      python_(std::move(python)),
      log_(std::move(log)) {}

RendezvousKeeper::~RendezvousKeeper() {
  server_.reset();
  if (child_ > 0 && ChildAlive()) {
    kill(child_, SIGKILL);
    waitpid(child_, nullptr, 0);
  }
  if (child_fd_ >= 0) close(child_fd_);
}

void RendezvousKeeper::Log(const std::string& line) const {
  std::fprintf(stderr, "%s%s\n", log_.c_str(), line.c_str());
  std::fflush(stderr);
}

void RendezvousKeeper::Tend(std::chrono::milliseconds retry) {
  if (!serves()) return;
  if (server_ != nullptr) return;
  if (child_ > 0 && ChildAlive()) return;
  auto now = std::chrono::steady_clock::now();
  if (now < next_try_) return;
  // A child that dies at once (no torch, say) is not restarted in a loop,
  // and a port another ckptrun holds is not tried at every poll.
  const auto floor =
      std::chrono::milliseconds(kind_ == RendezvousKind::kTorch ? 1000 : 200);
  next_try_ = now + std::max(retry, floor);
  if (kind_ == RendezvousKind::kWorker)
    TendWorker();
  else
    TendTorch();
}

namespace {

// Whether a listener could bind `port` on every interface now (IPv6
// dual-stack, else IPv4): a port another ckptrun of this host serves is
// skipped quietly, where a failed gRPC server logs an error each time.
bool PortFree(uint32_t port) {
  for (int family : {AF_INET6, AF_INET}) {
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_storage a{};
    socklen_t len = 0;
    if (family == AF_INET6) {
      auto* a6 = reinterpret_cast<sockaddr_in6*>(&a);
      a6->sin6_family = AF_INET6;
      a6->sin6_port = htons(static_cast<uint16_t>(port));
      a6->sin6_addr = in6addr_any;
      len = sizeof(*a6);
    } else {
      auto* a4 = reinterpret_cast<sockaddr_in*>(&a);
      a4->sin_family = AF_INET;
      a4->sin_port = htons(static_cast<uint16_t>(port));
      a4->sin_addr.s_addr = htonl(INADDR_ANY);
      len = sizeof(*a4);
    }
    bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), len) == 0;
    close(fd);
    if (ok) return true;
  }
  return false;
}

}  // namespace

void RendezvousKeeper::TendWorker() {
  if (!PortFree(port_)) {
    const std::string error =
        absl::StrCat("port ", port_, " of the rendezvous store is in use");
    if (error != last_error_)
      Log(absl::StrCat(error,
                       "; retrying (another ckptrun on this host may serve "
                       "it)"));
    last_error_ = error;
    return;
  }
  // Every interface: the trainers of other nodes connect to this host.
  absl::StatusOr<std::unique_ptr<worker::StoreServer>> server =
      worker::StoreServer::Start("::", static_cast<int>(port_));
  if (server.ok()) {
    server_ = std::move(*server);
    last_error_.clear();
    Log(absl::StrCat("serving the rendezvous store (worker) on port ", port_,
                     " for every generation"));
    return;
  }
  std::string error(server.status().message());
  if (error != last_error_)
    Log(absl::StrCat(error,
                     "; retrying (another ckptrun on this host may serve it)"));
  last_error_ = error;
}

bool RendezvousKeeper::ChildAlive() const {
  if (child_fd_ >= 0) {
    pollfd p = {child_fd_, POLLIN, 0};
    return poll(&p, 1, 0) == 0;  // readable once the process ended
  }
  return child_ > 0 && kill(child_, 0) == 0;
}

void RendezvousKeeper::TendTorch() {
  if (child_ > 0) {
    Log(absl::StrCat("the rendezvous store server (pid ", child_,
                     ") exited; starting another"));
    waitpid(child_, nullptr, WNOHANG);  // unless TrainerSet reaped it
    if (child_fd_ >= 0) close(child_fd_);
    child_ = 0;
    child_fd_ = -1;
  }
  const std::string port = std::to_string(port_);
  std::vector<std::string> args = {python_, "-m", "ckpt.torch.store_server",
                                   "--port", port};
  // Built before fork: only async-signal-safe calls in the child.
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    Log(absl::StrCat("fork for the rendezvous store server: ",
                     std::strerror(errno), "; retrying"));
    return;
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // gone with ckptrun, even SIGKILLed
    if (getppid() != parent) _exit(1);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execve(python_.c_str(), argv.data(), environ);
    _exit(127);
  }
  child_ = pid;
#ifdef SYS_pidfd_open
  child_fd_ = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#endif
  Log(absl::StrCat("serving the rendezvous store (torch) on port ", port_,
                   " for every generation: ", python_,
                   " -m ckpt.torch.store_server, pid ", pid));
}

}  // namespace ckpt::tools
