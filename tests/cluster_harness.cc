#include "tests/cluster_harness.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "tests/harness.h"

namespace ckpt::testing {

namespace cv1 = ::ckpt::coord::v1;

std::unique_ptr<Proc> Proc::Spawn(const std::vector<std::string>& argv, const std::string& log,
                                  const std::vector<std::string>& env) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  auto p = std::unique_ptr<Proc>(new Proc);
  pid_t parent = getpid();
  p->pid_ = fork();
  if (p->pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a crashed test
    if (getppid() != parent) _exit(126);
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    setpgid(0, 0);  // signals to the group reach its children too
    for (const auto& e : env) putenv(const_cast<char*>(e.c_str()));
    execv(args[0], args.data());
    _exit(127);
  }
  return p;
}

Proc::~Proc() { Kill(); }

void Proc::Signal(int sig) {
  if (pid_ > 0 && !status_) kill(pid_, sig);
}

std::optional<int> Proc::Poll() {
  if (status_ || pid_ <= 0) return status_;
  int st = 0;
  if (waitpid(pid_, &st, WNOHANG) == pid_) status_ = st;
  return status_;
}

std::optional<int> Proc::Wait(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!Poll() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return status_;
}

void Proc::Kill() {
  if (pid_ <= 0 || status_) return;
  kill(pid_, SIGKILL);
  int st = 0;
  if (waitpid(pid_, &st, 0) == pid_) status_ = st;
}

namespace {

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

bool Connectable(const std::string& socket_path) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", socket_path.c_str());
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  close(fd);
  return ok;
}

}  // namespace

Cluster::Cluster(ClusterOptions options) : options_(std::move(options)) {
  std::filesystem::create_directories(shared_root());
  std::filesystem::create_directories(options_.dir + "/trainers");
  port_ = FreePort();
}

Cluster::~Cluster() {
  for (auto& [id, n] : nodes_) {
    if (n.launcher) n.launcher->Kill();
    if (n.daemon) n.daemon->Kill();
    UnlinkArenas(n.shm_prefix);
  }
  if (coordinator_) coordinator_->Kill();
}

void Cluster::StartCoordinator() {
  coordinator_ = Proc::Spawn(
      {COORDINATOR_BINARY, "--listen", "127.0.0.1:" + std::to_string(port_), "--state",
       options_.dir + "/coordinator", "--shared-root", shared_root(), "--heartbeat-timeout-ms",
       std::to_string(options_.heartbeat_timeout_ms)},
      options_.dir + "/coordinator.log");
  WaitUntil([&] { return GetCluster().has_value(); }, std::chrono::seconds(20));
}

void Cluster::KillCoordinator(int sig) {
  if (!coordinator_) return;
  coordinator_->Signal(sig);
  coordinator_->Wait(std::chrono::seconds(10));
  coordinator_.reset();
}

void Cluster::StartNode(const std::string& id, bool spare) {
  Node& n = nodes_[id];
  n.dir = NodeDir(id);
  n.shm_prefix = UniqueShmPrefix();
  std::filesystem::create_directories(n.dir);
  const std::string socket = n.dir + "/ckptd.sock";
  std::vector<std::string> argv = {
      CKPTD_BINARY, "--socket", socket, "--root", n.dir + "/root", "--shared-root", shared_root(),
      "--coordinator", "127.0.0.1:" + std::to_string(port_), "--node-id", id, "--advertise-addr",
      "127.0.0.1", "--capacity", std::to_string(options_.nproc_per_node), "--shm-prefix",
      n.shm_prefix};
  if (spare) argv.push_back("--spare");
  for (const auto& a : options_.ckptd_args) argv.push_back(a);
  n.daemon = Proc::Spawn(argv, n.dir + "/ckptd.log");
  WaitUntil([&] { return Connectable(socket); }, std::chrono::seconds(20));
  std::vector<std::string> run = {CKPTRUN_BINARY, "--coordinator", "127.0.0.1:" + std::to_string(port_), "--node-id", id,
       "--nproc-per-node", std::to_string(options_.nproc_per_node), "--world-size",
       std::to_string(options_.world_size), "--job", options_.job, "--socket", socket,
       "--poll-ms", "50", "--grace-ms", "1000", "--", CLUSTER_TRAINER_BINARY,
       std::to_string(options_.bytes_per_rank), std::to_string(options_.last_step),
       std::to_string(options_.step_ms), options_.dir + "/trainers"};
  if (options_.hold) run.push_back("hold");
  n.launcher = Proc::Spawn(run, n.dir + "/ckptrun.log");
}

void Cluster::KillNode(const std::string& id) {
  Node& n = nodes_.at(id);
  // The trainers are in ckptrun's process groups; they die with it
  // (PDEATHSIG) or with their group.
  if (n.launcher) {
    n.launcher->Signal(SIGKILL);
    kill(-n.launcher->pid(), SIGKILL);
  }
  if (n.daemon) n.daemon->Kill();
  if (n.launcher) n.launcher->Kill();
  UnlinkArenas(n.shm_prefix);
}

void Cluster::SignalDaemon(const std::string& id, int sig) { nodes_.at(id).daemon->Signal(sig); }

std::optional<int> Cluster::LauncherStatus(const std::string& id) {
  return nodes_.at(id).launcher->Poll();
}

std::optional<int> Cluster::WaitLauncher(const std::string& id, std::chrono::milliseconds timeout) {
  return nodes_.at(id).launcher->Wait(timeout);
}

std::unique_ptr<cv1::Coordinator::Stub> Cluster::Stub() const {
  return cv1::Coordinator::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(port_), grpc::InsecureChannelCredentials()));
}

std::optional<cv1::GetClusterResponse> Cluster::GetCluster() const {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  cv1::GetClusterResponse resp;
  if (!Stub()->GetCluster(&ctx, cv1::GetClusterRequest(), &resp).ok()) return std::nullopt;
  return resp;
}

std::vector<cv1::Event> Cluster::Events() const {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  cv1::EventsResponse resp;
  if (!Stub()->Events(&ctx, cv1::EventsRequest(), &resp).ok()) return {};
  return {resp.events().begin(), resp.events().end()};
}

std::optional<cv1::JobRecord> Cluster::Job() const {
  auto c = GetCluster();
  if (!c) return std::nullopt;
  for (const auto& j : c->jobs())
    if (j.job() == options_.job) return j;
  return std::nullopt;
}

std::vector<TrainerLine> Cluster::TrainerLog(uint32_t rank) const {
  std::vector<TrainerLine> out;
  std::ifstream in(options_.dir + "/trainers/rank-" + std::to_string(rank) + ".log");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    TrainerLine t;
    words >> t.kind;
    std::string w;
    while (words >> w) {
      size_t eq = w.find('=');
      if (eq != std::string::npos) t.fields[w.substr(0, eq)] = w.substr(eq + 1);
    }
    out.push_back(std::move(t));
  }
  return out;
}

pid_t Cluster::TrainerPid(uint32_t rank) const {
  pid_t pid = -1;
  for (const auto& l : TrainerLog(rank))
    if (l.kind == "start") pid = std::atoi(l.fields.at("pid").c_str());
  return pid;
}

bool Cluster::WaitUntil(const std::function<bool()>& cond, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

std::string Cluster::DumpLogs() const {
  std::string out;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(options_.dir)) {
    if (entry.path().extension() != ".log" || entry.path().string().find("/db/") != std::string::npos ||
        entry.path().string().find("/.catalog/") != std::string::npos)
      continue;
    std::ifstream in(entry.path());
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    if (text.size() > 6000) text = "...\n" + text.substr(text.size() - 6000);
    out += "==== " + entry.path().string() + "\n" + text + "\n";
  }
  return out;
}

}  // namespace ckpt::testing
