#include "tests/cluster_harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
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
#include <string_view>
#include <thread>

#include "coordinator/client/leader_channel.h"
#include "tests/harness.h"
#include "tests/test_util.h"

namespace ckpt::testing {

namespace cv1 = ::ckpt::coord::v1;

std::unique_ptr<Proc> Proc::Spawn(const std::vector<std::string>& argv,
                                  const std::string& log,
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
  if (options_.shared_root_url.empty())
    std::filesystem::create_directories(shared_root());
  std::filesystem::create_directories(options_.dir + "/trainers");
  if (!options_.trainer_prefix.empty())
    std::filesystem::permissions(options_.dir + "/trainers",
                                 std::filesystem::perms::all);
  ports_ = FreeLoopbackPorts(std::max(1, options_.coordinator_replicas));
  port_ = ports_[0];
  coordinators_.resize(ports_.size());
}

Cluster::~Cluster() {
  for (auto& [id, n] : nodes_) {
    if (n.launcher) n.launcher->Kill();
    if (n.daemon) n.daemon->Kill();
    UnlinkArenas(n.shm_prefix);
  }
  for (auto& c : coordinators_)
    if (c) c->Kill();
}

void Cluster::StartCoordinator() {
  for (int i = 0; i < replicas(); ++i) StartReplica(i);
  WaitUntil([&] { return GetCluster().has_value(); }, std::chrono::seconds(20));
}

void Cluster::StartReplica(int i) {
  std::vector<std::string> argv = {
      COORDINATOR_BINARY,
      "--listen",
      ReplicaAddress(i),
      "--state",
      options_.coordinator_state.empty() ? options_.dir + "/coordinator"
                                         : options_.coordinator_state,
      "--shared-root",
      shared_root(),
      "--heartbeat-timeout-ms",
      std::to_string(options_.heartbeat_timeout_ms)};
  bool tls = false, ratio = false;
  for (const auto& a : options_.coordinator_args) {
    argv.push_back(a);
    tls = tls || a == "--tls-cert";
    ratio = ratio || a == "--health-min-ratio";
  }
  if (!tls) argv.push_back("--insecure");  // plaintext must be asked for
  // Every simulated node shares this machine's memory and loopback: one
  // measured while the others' processes (or a parallel build) ran is not a
  // slow node. Tests of the bandwidth comparison ask for a ratio.
  if (!ratio) {
    argv.push_back("--health-min-ratio");
    argv.push_back("0");
  }
  std::string log =
      options_.dir + (i == 0 ? "/coordinator.log"
                             : "/coordinator-" + std::to_string(i) + ".log");
  coordinators_.at(i) = Proc::Spawn(argv, log);
}

void Cluster::KillCoordinator(int sig) {
  for (int i = 0; i < replicas(); ++i) SignalReplica(i, sig);
  for (auto& c : coordinators_) {
    if (!c) continue;
    c->Wait(std::chrono::seconds(10));
    c.reset();
  }
}

void Cluster::SignalReplica(int i, int sig) {
  if (coordinators_.at(i)) coordinators_[i]->Signal(sig);
}

std::optional<int> Cluster::WaitReplica(int i,
                                        std::chrono::milliseconds timeout) {
  if (!coordinators_.at(i)) return std::nullopt;
  return coordinators_[i]->Wait(timeout);
}

std::string Cluster::CoordinatorAddresses() const {
  std::string out;
  for (int i = 0; i < replicas(); ++i)
    out += (i ? "," : "") + ReplicaAddress(i);
  return out;
}

int Cluster::LeaderReplica() const {
  for (int i = 0; i < replicas(); ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(1));
    cv1::GetClusterResponse resp;
    if (Stub(i)->GetCluster(&ctx, cv1::GetClusterRequest(), &resp).ok())
      return i;
  }
  return -1;
}

void Cluster::StartNode(const std::string& id, bool spare) {
  Node& n = nodes_[id];
  n.dir = NodeDir(id);
  n.shm_prefix = UniqueShmPrefix();
  std::filesystem::create_directories(n.dir);
  const std::string socket = n.dir + "/ckptd.sock";
  std::vector<std::string> argv = {
      CKPTD_BINARY,
      "--socket",
      socket,
      "--root",
      n.dir + "/root",
      "--shared-root",
      options_.separate_roots ? n.dir + "/stored" : shared_root(),
      "--coordinator",
      CoordinatorAddresses(),
      "--node-id",
      id,
      "--advertise-addr",
      "127.0.0.1",
      "--capacity",
      std::to_string(options_.node_capacity.count(id)
                         ? options_.node_capacity.at(id)
                         : options_.nproc_per_node),
      "--shm-prefix",
      n.shm_prefix,
      "--health-memcpy-mib",
      "4"};
  if (options_.separate_roots)
    std::filesystem::create_directories(n.dir + "/stored");
  if (spare) argv.push_back("--spare");
  for (const auto& a : options_.ckptd_args) argv.push_back(a);
  if (auto it = options_.node_ckptd_args.find(id);
      it != options_.node_ckptd_args.end())
    argv.insert(argv.end(), it->second.begin(), it->second.end());
  auto env = options_.node_ckptd_env.find(id);
  n.daemon = Proc::Spawn(argv, n.dir + "/ckptd.log",
                         env == options_.node_ckptd_env.end()
                             ? std::vector<std::string>()
                             : env->second);
  WaitUntil([&] { return Connectable(socket); }, std::chrono::seconds(20));
  if (!options_.launcher) return;
  std::vector<std::string> run = {CKPTRUN_BINARY,
                                  "--coordinator",
                                  CoordinatorAddresses(),
                                  "--node-id",
                                  id,
                                  "--nproc-per-node",
                                  std::to_string(options_.nproc_per_node),
                                  "--world-size",
                                  std::to_string(options_.world_size),
                                  "--job",
                                  options_.job,
                                  "--socket",
                                  socket,
                                  "--poll-ms",
                                  "50",
                                  "--grace-ms",
                                  "1000"};
  run.insert(run.end(), options_.launcher_args.begin(),
             options_.launcher_args.end());
  run.push_back("--");
  if (!options_.trainer_command.empty() || options_.links) {
    if (master_port_ == 0) master_port_ = FreeLoopbackPorts(1)[0];
    run.insert(run.end() - 1, {"--master-port", std::to_string(master_port_)});
  }
  run.insert(run.end(), options_.trainer_prefix.begin(),
             options_.trainer_prefix.end());
  if (!options_.trainer_command.empty()) {
    run.insert(run.end(), options_.trainer_command.begin(),
               options_.trainer_command.end());
  } else {
    run.insert(run.end(),
               {CLUSTER_TRAINER_BINARY, std::to_string(options_.bytes_per_rank),
                std::to_string(options_.last_step),
                std::to_string(options_.step_ms), options_.dir + "/trainers"});
    if (options_.hold) run.push_back("hold");
  }
  // Like /tmp (trainers may run as another uid), but the test's own.
  const std::string tmp = NodeTmpDir(id);
  std::filesystem::create_directories(tmp);
  std::filesystem::permissions(
      tmp, std::filesystem::perms::all | std::filesystem::perms::sticky_bit);
  std::vector<std::string> launcher_env = {"TMPDIR=" + tmp};
  if (auto e = options_.node_launcher_env.find(id);
      e != options_.node_launcher_env.end())
    launcher_env.insert(launcher_env.end(), e->second.begin(), e->second.end());
  if (options_.links) launcher_env.push_back("CLUSTER_TRAINER_LINKS=1");
  if (options_.steps_after_restore > 0)
    launcher_env.push_back("CLUSTER_TRAINER_STEPS_AFTER_RESTORE=" +
                           std::to_string(options_.steps_after_restore));
  n.launcher = Proc::Spawn(run, n.dir + "/ckptrun.log", launcher_env);
}

void Cluster::KillNode(const std::string& id) {
  Node& n = nodes_.at(id);
  // Every process of the node gets its SIGKILL before any is reaped, the
  // daemon first: the node dies at once, as a machine does (a peer that
  // sees a trainer's link break finds its ckptd gone too).
  if (n.daemon) n.daemon->Signal(SIGKILL);
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

void Cluster::SignalDaemon(const std::string& id, int sig) {
  nodes_.at(id).daemon->Signal(sig);
}

std::optional<int> Cluster::LauncherStatus(const std::string& id) {
  return nodes_.at(id).launcher->Poll();
}

std::optional<int> Cluster::WaitLauncher(const std::string& id,
                                         std::chrono::milliseconds timeout) {
  return nodes_.at(id).launcher->Wait(timeout);
}

std::unique_ptr<cv1::Coordinator::Stub> Cluster::Stub() const {
  return Stub(0);
}

std::unique_ptr<cv1::Coordinator::Stub> Cluster::Stub(int replica) const {
  return cv1::Coordinator::NewStub(grpc::CreateChannel(
      ReplicaAddress(replica), grpc::InsecureChannelCredentials()));
}

std::optional<cv1::GetClusterResponse> Cluster::GetCluster() const {
  auto client =
      coordinator::CoordinatorClient::Create(CoordinatorAddresses(), {});
  cv1::GetClusterResponse resp;
  if (!client.ok() ||
      !(*client)
           ->Call(&cv1::Coordinator::Stub::GetCluster, cv1::GetClusterRequest{},
                  &resp, std::chrono::seconds(2))
           .ok())
    return std::nullopt;
  return resp;
}

std::vector<cv1::Event> Cluster::Events() const {
  auto client =
      coordinator::CoordinatorClient::Create(CoordinatorAddresses(), {});
  cv1::EventsResponse resp;
  if (!client.ok() ||
      !(*client)
           ->Call(&cv1::Coordinator::Stub::Events, cv1::EventsRequest{}, &resp,
                  std::chrono::seconds(2))
           .ok())
    return {};
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
  std::ifstream in(options_.dir + "/trainers/rank-" + std::to_string(rank) +
                   ".log");
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

pid_t Cluster::WorkerPid(uint32_t rank, const std::string& id) const {
  const std::string want_rank = "RANK=" + std::to_string(rank);
  const std::string want_tmp = "TMPDIR=" + NodeTmpDir(id);
  pid_t found = -1;
  DIR* d = opendir("/proc");
  if (d == nullptr) return -1;
  while (dirent* e = readdir(d)) {
    const pid_t pid = std::atoi(e->d_name);
    if (pid <= 0) continue;
    const std::string proc = "/proc/" + std::to_string(pid);
    if (ReadFileToString(proc + "/comm").rfind("ckpt-worker", 0) != 0) continue;
    const std::string env = ReadFileToString(proc + "/environ");
    bool rank_ok = false, tmp_ok = false;
    for (size_t at = 0; at < env.size();) {
      size_t end = env.find('\0', at);
      if (end == std::string::npos) end = env.size();
      const std::string_view kv(env.data() + at, end - at);
      rank_ok = rank_ok || kv == want_rank;
      tmp_ok = tmp_ok || kv == want_tmp;
      at = end + 1;
    }
    if (rank_ok && tmp_ok) found = pid;
  }
  closedir(d);
  return found;
}

bool Cluster::WaitUntil(const std::function<bool()>& cond,
                        std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

std::string Cluster::LauncherLog(const std::string& id) const {
  std::ifstream in(LauncherLogPath(id));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Cluster::DumpLogs() const {
  std::string out;
  for (const auto& entry :
       std::filesystem::recursive_directory_iterator(options_.dir)) {
    if (entry.path().extension() != ".log" ||
        entry.path().string().find("/db/") != std::string::npos ||
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
