#include "worker/worker_process.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

extern char** environ;

namespace ckpt::worker::testing {

namespace {

bool Inherited(const std::string& key) {
  static const char* const kOwn[] = {"RANK",        "WORLD_SIZE",
                                     "LOCAL_RANK",  "MASTER_ADDR",
                                     "MASTER_PORT", "GLOO_SOCKET_IFNAME"};
  if (key.rfind("CKPT_", 0) == 0) return false;
  for (const char* k : kOwn) {
    if (key == k) return false;
  }
  return true;
}

}  // namespace

bool WorkerRun::exited_ok() const { return exit_code() == 0; }
int WorkerRun::exit_code() const {
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}
bool WorkerRun::killed() const {
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

std::string WorkerRun::Digest() const {
  size_t at = output.rfind("params_digest=");
  return at == std::string::npos ? "" : output.substr(at + 14, 16);
}

std::optional<float> WorkerRun::LossAt(int64_t step) const {
  std::string key = "step " + std::to_string(step) + " loss ";
  for (size_t at = output.find(key); at != std::string::npos;
       at = output.find(key, at + 1)) {
    if (at == 0 || output[at - 1] == '\n')
      return std::strtof(output.c_str() + at + key.size(), nullptr);
  }
  return std::nullopt;
}

std::unique_ptr<WorkerProcess> WorkerProcess::Start(
    const std::vector<std::string>& flag_list,
    const std::map<std::string, std::string>& env,
    std::optional<std::string> kill_on_line) {
  std::map<std::string, std::string> flags = {
      {"--vocab", "64"},   {"--dim", "32"}, {"--seq", "16"},
      {"--batch", "8"},    {"--seed", "5"}, {"--lr", "0.01"},
      {"--log-every", "1"}};
  for (size_t i = 0; i + 1 < flag_list.size(); i += 2)
    flags[flag_list[i]] = flag_list[i + 1];
  std::vector<std::string> argv = {CKPT_WORKER_BINARY};
  for (const auto& [flag, value] : flags) {
    argv.push_back(flag);
    if (!value.empty()) argv.push_back(value);  // "": a flag without a value
  }
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string kv = *e;
    if (Inherited(kv.substr(0, kv.find('=')))) envs.push_back(kv);
  }
  for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
  std::vector<char*> cargv, cenv;
  for (std::string& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  for (std::string& e : envs) cenv.push_back(e.data());
  cenv.push_back(nullptr);

  int fds[2];
  if (pipe(fds) != 0) std::abort();
  std::unique_ptr<WorkerProcess> p(new WorkerProcess);
  p->pid_ = fork();
  if (p->pid_ == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    execve(cargv[0], cargv.data(), cenv.data());
    _exit(127);
  }
  close(fds[1]);
  p->reader_ = std::thread([proc = p.get(), fd = fds[0], kill_on_line] {
    FILE* out = fdopen(fd, "r");
    char line[4096];
    bool killed = false;
    while (std::fgets(line, sizeof(line), out) != nullptr) {
      {
        std::lock_guard<std::mutex> lock(proc->mu_);
        proc->run_.output += line;
      }
      proc->cv_.notify_all();
      if (kill_on_line && !killed &&
          std::strncmp(line, kill_on_line->c_str(), kill_on_line->size()) ==
              0) {
        kill(proc->pid_, SIGKILL);
        killed = true;
      }
    }
    std::fclose(out);
    {
      std::lock_guard<std::mutex> lock(proc->mu_);
      proc->eof_ = true;
    }
    proc->cv_.notify_all();
  });
  return p;
}

std::optional<std::string> WorkerProcess::WaitForLine(
    const std::string& prefix) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    const std::string& out = run_.output;
    // Whole lines only: the reader appends a line at a time.
    for (size_t at = seen_; at < out.size();) {
      size_t end = out.find('\n', at);
      if (end == std::string::npos) break;
      if (out.compare(at, prefix.size(), prefix) == 0) {
        seen_ = end + 1;
        return out.substr(at, end - at);
      }
      at = end + 1;
    }
    if (eof_) return std::nullopt;
    cv_.wait(lock);
  }
}

std::string WorkerProcess::Output() {
  std::lock_guard<std::mutex> lock(mu_);
  return run_.output;
}

WorkerRun WorkerProcess::Wait() {
  if (reader_.joinable()) reader_.join();
  if (pid_ > 0) {
    waitpid(pid_, &run_.status, 0);
    pid_ = -1;
  }
  return run_;
}

WorkerProcess::~WorkerProcess() {
  if (pid_ > 0) kill(pid_, SIGKILL);
  Wait();
}

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

}  // namespace ckpt::worker::testing
