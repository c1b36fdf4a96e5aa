// A multi-node cluster on one machine for the recovery tests and the
// recovery benchmark: a real ckpt-coordinator on loopback, and nodes that
// are each a real ckptd (own socket, root and shared-memory prefix, all
// sharing one shared root) plus a real ckptrun running cluster_trainer.
// Everything is a child process that tests kill with real signals; each
// writes its output to a log file in the cluster's directory.
// Not thread-safe: one test thread drives it.
#ifndef CKPT_TESTS_CLUSTER_HARNESS_H_
#define CKPT_TESTS_CLUSTER_HARNESS_H_

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "coordinator.grpc.pb.h"

namespace ckpt::testing {

// A child process (dies with its parent), output to `log`.
class Proc {
 public:
  static std::unique_ptr<Proc> Spawn(const std::vector<std::string>& argv,
                                     const std::string& log,
                                     const std::vector<std::string>& env = {});
  ~Proc();  // SIGKILL and reap if still running
  pid_t pid() const { return pid_; }
  void Signal(int sig);
  // Reaps if exited; returns the wait status, or nullopt while running.
  std::optional<int> Poll();
  // Waits up to `timeout`; nullopt if still running.
  std::optional<int> Wait(std::chrono::milliseconds timeout);
  void Kill();  // SIGKILL and reap

 private:
  pid_t pid_ = -1;
  std::optional<int> status_;
};

struct ClusterOptions {
  std::string dir;  // everything goes under it
  std::string job = "job";
  uint32_t world_size = 4;
  uint32_t nproc_per_node = 2;
  uint64_t bytes_per_rank = 8 << 20;
  uint64_t last_step =
      60;  // long enough that survivors still run when a failure is seen
  int step_ms = 100;
  // > 0: a restored trainer stops after step restore+N (before last_step):
  // the test's tail after its last recovery is N steps, not the run to
  // last_step. 0: every trainer runs to last_step.
  uint64_t steps_after_restore = 0;
  bool hold = false;  // trainers sleep after the last step instead of exiting
  // The trainers join through links to rank 0 (MASTER_ADDR/MASTER_PORT,
  // a free port) and meet at a barrier every step, a collective: a trainer
  // whose link breaks names the lost peer in $CKPT_PEER_LOST_FILE and
  // exits 6 (cluster_trainer.cc).
  bool links = false;
  int heartbeat_timeout_ms = 2000;      // generous: a loaded 2-core CI machine
  std::vector<std::string> ckptd_args;  // extra flags for every ckptd
  // Extra flags for one node's ckptd, by node id.
  std::map<std::string, std::vector<std::string>> node_ckptd_args;
  // Extra environment ("NAME=value") for one node's ckptd, by node id.
  std::map<std::string, std::vector<std::string>> node_ckptd_env;
  // Extra environment ("K=V") of one node's ckptrun and so its trainers,
  // by node id (CLUSTER_TRAINER_SLOW=F: a slow node).
  std::map<std::string, std::vector<std::string>> node_launcher_env;
  // Runs each trainer through this command (e.g. setpriv --reuid 1000 ...,
  // a trainer that is not root); the trainers' log directory is then
  // world-writable.
  std::vector<std::string> trainer_prefix;
  // More ckptrun flags for every node (e.g. {"--warm", "1"}).
  std::vector<std::string> launcher_args;
  // Set: ckptrun runs this command instead of cluster_trainer (e.g.
  // ckpt-worker; its output goes to the node's ckptrun.log, TrainerLog
  // stays empty), with a free --master-port base for its rendezvous.
  std::vector<std::string> trainer_command;
  // Set: the shared root is this object store URL ("s3://bucket/prefix",
  // endpoint and credentials from the environment) and the nodes share no
  // directory.
  std::string shared_root_url;
  // HA: the coordinator's --state (default: a RocksDB dir in `dir`) and how
  // many ckpt-coordinator replicas share it (etcd://: one leads). Nodes and
  // launchers get every replica's address.
  std::string coordinator_state;
  int coordinator_replicas = 1;
  std::vector<std::string> coordinator_args;  // extra flags for every replica
  // true: each node's --shared-root is a directory of its own (no node
  // reads another's stored shards: a cluster without a shared root).
  bool separate_roots = false;
  // A node's --capacity other than nproc_per_node, by node id.
  std::map<std::string, uint32_t> node_capacity;
  // false: StartNode starts no ckptrun; the test registers the job and
  // starts trainers itself (a job launched without ckptrun, e.g. torchrun).
  bool launcher = true;
};

// One line of a rank's cluster_trainer log, parsed.
struct TrainerLine {
  std::string kind;  // start, restored, saved, done, restore_failed, mismatch,
                     // save_failed
  std::map<std::string, std::string> fields;
};

class Cluster {
 public:
  explicit Cluster(ClusterOptions options);
  ~Cluster();

  const ClusterOptions& options() const { return options_; }
  std::string shared_root() const {
    return options_.shared_root_url.empty() ? options_.dir + "/shared"
                                            : options_.shared_root_url;
  }
  int coordinator_port() const { return port_; }

  void StartCoordinator();                  // every replica
  void KillCoordinator(int sig = SIGKILL);  // every replica
  // HA: one replica.
  int replicas() const { return static_cast<int>(ports_.size()); }
  void StartReplica(int i);
  void SignalReplica(int i, int sig);
  std::optional<int> WaitReplica(int i, std::chrono::milliseconds timeout);
  std::string ReplicaAddress(int i) const {
    return "127.0.0.1:" + std::to_string(ports_.at(i));
  }
  std::string CoordinatorAddresses() const;  // "A:P,B:P,..."
  // The replica that answers GetCluster (the leader), or -1.
  int LeaderReplica() const;
  // Starts a node's ckptd and waits until it serves; then its ckptrun.
  void StartNode(const std::string& id, bool spare = false);
  // SIGKILLs the node's ckptrun, trainers and ckptd, and removes its
  // shared memory: the node is gone with everything it held.
  void KillNode(const std::string& id);
  void SignalDaemon(const std::string& id, int sig);
  // ckptrun's exit status once it exited.
  std::optional<int> LauncherStatus(const std::string& id);
  std::optional<int> WaitLauncher(const std::string& id,
                                  std::chrono::milliseconds timeout);

  std::unique_ptr<coord::v1::Coordinator::Stub> Stub() const;  // replica 0
  std::unique_ptr<coord::v1::Coordinator::Stub> Stub(int replica) const;
  // These follow the leader among the replicas.
  std::optional<coord::v1::GetClusterResponse> GetCluster() const;
  std::vector<coord::v1::Event> Events() const;
  std::optional<coord::v1::JobRecord> Job() const;

  std::vector<TrainerLine> TrainerLog(uint32_t rank) const;
  // The pid of the rank's current trainer (last "start" line), or -1.
  pid_t TrainerPid(uint32_t rank) const;
  // With trainer_command ckpt-worker (which logs no pid): the pid of the
  // ckpt-worker that node `id`'s ckptrun started as `rank` (its RANK and
  // the node's TMPDIR in its environment), or -1. A warm process placed
  // later has no RANK there and is not found.
  pid_t WorkerPid(uint32_t rank, const std::string& id) const;
  // Polls cond every 20 ms until true or timeout.
  static bool WaitUntil(const std::function<bool()>& cond,
                        std::chrono::milliseconds timeout);
  // Every log of the cluster, for a failing test's output.
  std::string DumpLogs() const;
  // The node's ckptrun.log (with trainer_command: its trainers' output).
  std::string LauncherLog(const std::string& id) const;
  std::string LauncherLogPath(const std::string& id) const {
    return NodeDir(id) + "/ckptrun.log";
  }
  // The node's TMPDIR (its ckptrun's and trainers'), inside dir: what a
  // SIGKILLed ckptrun leaves there goes with the test's directory, not
  // into /tmp.
  std::string NodeTmpDir(const std::string& id) const {
    return NodeDir(id) + "/tmp";
  }
  // The node's ckptd socket (a trainer's CKPT_SOCKET).
  std::string Socket(const std::string& id) const {
    return NodeDir(id) + "/ckptd.sock";
  }

 private:
  struct Node {
    std::string dir;
    std::string shm_prefix;
    std::unique_ptr<Proc> daemon;
    std::unique_ptr<Proc> launcher;
  };
  std::string NodeDir(const std::string& id) const {
    return options_.dir + "/node-" + id;
  }

  const ClusterOptions options_;
  int port_ = 0;            // replica 0
  std::vector<int> ports_;  // every replica
  int master_port_ = 0;     // trainer_command: ckptrun's --master-port
  std::vector<std::unique_ptr<Proc>> coordinators_;
  std::map<std::string, Node> nodes_;
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_CLUSTER_HARNESS_H_
