// ckptrun: the per-node launcher of a coordinated job (in the spirit of
// torchrun). It registers the job with the coordinator (saying how many
// trainers it runs per node, so placement puts no more on any node), then
// watches its view of the job (a WatchJob server stream: the coordinator
// pushes each durable change; nothing polls the cluster) and every poll
// interval makes this node's trainers match the newest view:
// the ranks the coordinator placed here (none while the node is not alive),
// in the job's current generation, started only once the generation's plan
// is acknowledged by every node (prefetches done). A trainer that exits on
// its own is reported to the coordinator (queued while it is unreachable;
// the trainers keep running; refused for this node's epoch, it waits for
// the view's next epoch and is sent again). Trainers it stops itself are
// not reported. A trainer's exit (SIGCHLD), a new view and a note written
// in the launcher's directory (inotify) wake the loop at once; the poll
// interval is the longest it sleeps otherwise.
// In-process restart (ckptrun_restart.cc): each trainer process gets its
// own $CKPT_RESTART_DIR, with the `plan` of its generation. On a new
// generation, a trainer that said it can restart in its process
// (`capable`, its pid checked) and whose rank stays on this node is kept:
// not stopped, its `plan` rewritten when the new generation's trainers may
// start; it is stopped and started anew if it has not `joined` within
// --restart-timeout. A kept trainer's word that it lost peers is reported
// while it runs (ReportTrainerExitRequest.process_kept).
// Warm processes (--warm N, ckptrun_warm.cc): N more processes of the
// trainer command, started ahead with CKPT_WARM=1 and no rank, do their
// imports and wait for a `plan`; a rank to start anew goes to a ready one
// (its plan written at the gate of the kept trainers' plans), and another
// is started to take its place.
//
// Rendezvous (ckptrun_rendezvous.h): with --rendezvous worker|torch (auto:
// worker for ckpt-worker) ckptrun serves every generation's store from its
// start and trainers are only its clients ($CKPT_RENDEZVOUS=launcher).
//
// Exit status: 0 once every rank of the current generation on this node
// exited 0 and the coordinator says every rank of the job did (a failure
// found elsewhere meanwhile plans ranks here again: they are started; at
// most --finish-wait-s of waiting, and not at all with an older
// coordinator that does not say); 2 on a usage error or a refused
// RegisterJob; 128+N after signal N (SIGTERM/SIGINT), with every trainer
// stopped.
// Not thread-safe: one Launcher per process, run from the main thread.
#ifndef CKPT_TOOLS_CKPTRUN_H_
#define CKPT_TOOLS_CKPTRUN_H_

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "client/restart_plan.h"
#include "coordinator.grpc.pb.h"
#include "coordinator/client/leader_channel.h"
#include "tools/ckptrun_rendezvous.h"
#include "tools/ckptrun_trainers.h"

namespace ckpt::tools {

struct RunOptions {
  std::string coordinator;  // HOST:PORT[,HOST:PORT...] (HA replicas: the leader
                            // is followed)
  coordinator::TlsFiles tls;
  std::string node_id;
  uint32_t nproc_per_node = 0;
  uint32_t nnodes = 1;
  uint32_t world_size = 0;  // 0: nproc_per_node * nnodes
  // Elastic continuation (sent at RegisterJob): the least world size the
  // job shrinks to and the multiple it keeps; unset: the coordinator's.
  std::optional<uint32_t> min_world_size;
  std::optional<uint32_t> world_size_multiple;
  std::string job;          // default $CKPT_JOB
  std::string socket;       // default $CKPT_SOCKET
  std::string master_addr;  // empty: the host of rank 0's node
  uint32_t master_port = 29500;
  // Who serves the rendezvous store (ckptrun_rendezvous.h); served by
  // ckptrun, MASTER_PORT is master_port in every generation, else
  // master_port + G % 1000.
  RendezvousKind rendezvous = RendezvousKind::kTrainer;
  std::string rendezvous_python;  // kTorch: python3, resolved
  std::chrono::milliseconds poll{100};
  std::chrono::milliseconds grace{3000};
  // How long a kept trainer has to join a new generation; 0: no trainer
  // is kept (every one is stopped and started anew, as before).
  std::chrono::milliseconds restart_timeout{30000};
  // Trainer processes kept started ahead on this node, waiting for a rank
  // (ckptrun_warm.cc); 0: none.
  uint32_t warm = 0;
  // Once every rank of this node finished: how long to wait for the
  // coordinator to say the whole job did (or for a newer generation, which
  // starts ranks here again) before leaving anyway.
  std::chrono::milliseconds finish_wait{60000};
  std::vector<std::string> command;  // CMD ARGS...
  std::string program;               // command[0] resolved through $PATH
};

// Parses and validates argv ("ckptrun [flags] -- CMD ARGS..."). Errors name
// the flag. kCancelled with the usage text in *help for --help.
[[nodiscard]] absl::StatusOr<RunOptions> ParseRunOptions(int argc, char** argv,
                                                         std::string* help);

// The signal the watch thread sends the launcher's thread when a new view
// arrives, so the loop acts on it at once instead of at the next poll
// (SIGRTMIN: nothing else sends it; blocked with the stop signals).
int ViewSignal();

// Whether `kv` ("NAME=value") is a variable ckptrun sets for a trainer
// or a warm process, and so never passes on from its own environment.
bool LauncherSetsVariable(std::string_view kv);

// A plan that restores a step saved at another world size
// (JobView.restore_world_size): the saved rank `rank` restores
// ($CKPT_RESTORE_RANK); nullopt otherwise.
std::optional<uint32_t> SavedRankOf(const coord::v1::JobView& view,
                                    uint32_t rank);

class Launcher {
 public:
  // `stop_signals` are blocked in every thread of the process (SIGCHLD and
  // ViewSignal() with them, to wake the loop when a trainer exits or a view
  // arrives); Run() takes them with sigtimedwait.
  Launcher(RunOptions options, const sigset_t& stop_signals);
  ~Launcher();
  int Run();

 private:
  // Each call to the coordinator.
  static constexpr std::chrono::seconds kRpcTimeout{5};

  // A trainer's word that its collective lost peers (the ranks, when it
  // knows them; CKPT_PEER_LOST_FILE).
  struct PeerLost {
    bool said = false;
    std::vector<uint32_t> ranks;
  };

  struct PendingReport {
    TrainerExit exit;
    PeerLost peers;           // what the trainer said of its peers
    uint64_t generation = 0;  // of the trainer
    uint64_t epoch = 0;       // of this node when the trainer exited
    bool logged_queued = false;
    // Refused once at `epoch` (FAILED_PRECONDITION: a stale epoch, the
    // view not yet showing the node's new one): sent again, once, when the
    // view shows another epoch; dropped if its generation is replaced.
    bool awaiting_epoch = false;
    bool epoch_retried = false;
    // Not an exit: a kept trainer's word that it lost peers, sent while it
    // runs (exit is {rank, 0, 0}).
    bool process_kept = false;
    // The ranks the trainer named, where some were this node's own and
    // were replaced by what those said (ResolveLocalPeers).
    std::vector<uint32_t> named = {};
    // Since when it waits for a rank of this node it named to say more.
    std::optional<std::chrono::steady_clock::time_point> held_since = {};
  };

  // A trainer process this launcher started, for its in-process restart.
  struct Proc {
    pid_t pid = 0;
    std::string dir;              // its $CKPT_RESTART_DIR; "" without one
    uint64_t generation = 0;      // it runs in: started in it, or joined it
    std::optional<bool> capable;  // its `capable` once read
    std::optional<uint64_t> kept_for;  // kept for it, not joined yet
    // When kept_for's plan was written: its --restart-timeout runs.
    std::optional<std::chrono::steady_clock::time_point> plan_at;
    bool peer_lost_reported = false;  // in `generation`
    std::string bad_joined;           // the last bad `joined` logged
    // Files removed with it (a warm process's own notes, hard-linked to
    // the rank's names when it was placed).
    std::vector<std::string> own_files;
  };

  // A warm process: started ahead, no rank yet.
  struct WarmProc {
    pid_t pid = 0;
    std::string dir;          // its $CKPT_RESTART_DIR
    std::string peer_lost;    // its $CKPT_PEER_LOST_FILE
    std::string stacks;       // its $CKPT_STACKS_FILE
    bool ready = false;       // it wrote `capable` with its pid
    std::string bad_capable;  // the last bad `capable` logged
  };

  // Waits up to `d` for a signal; false when a stop signal arrived.
  bool Wait(std::chrono::milliseconds d);
  // Retries while the coordinator is unreachable or short of nodes.
  std::optional<int> RegisterJob();
  // One round: take the newest view, reap, report, make trainers match.
  void Poll();
  // Every rank of this node finished: whether ckptrun may leave now (the
  // coordinator says the job finished, it is an older one that does not
  // say, or opts_.finish_wait passed); a failure found elsewhere after
  // they finished plans ranks here again, and needs this launcher.
  bool MayLeave();
  // The watch thread: keeps a WatchJob stream open (reconnecting with
  // backoff) and stores each view it gets.
  void WatchLoop();
  // The note thread: wakes the loop (ViewSignal) as soon as a file in the
  // launcher's directory is written (a trainer's peer-lost note), so the
  // note is reported now instead of at the next poll. Inotify on
  // stacks_dir_ (watched once LauncherDir() makes it); without inotify
  // the notes are still read at each poll.
  void NoteWatchLoop();
  void Reconcile(const coord::v1::JobView& view);
  // The view's generation may start: sets generation_ and started_ to
  // `ranks`, writes the plans of the kept trainers, starts the others.
  void StartTrainers(const coord::v1::JobView& view,
                     const std::vector<uint32_t>& ranks);
  // Starts new processes for `ranks` of generation_ (each in started_).
  void StartRanks(const coord::v1::JobView& view,
                  const std::vector<uint32_t>& ranks);
  void StopTrainers(const std::string& why);
  // Stops the trainers of `ranks` (not reported) and forgets them.
  void StopRanks(const std::vector<uint32_t>& ranks, const std::string& why);
  // ckptrun_restart.cc: in-process restart (see the top of this file).
  // The view's generation replaces the trainers' (or kept ones wait for
  // it): keeps the capable trainers whose rank stays in `desired`, stops
  // the others.
  void KeepOrStop(const coord::v1::JobView& view,
                  const std::set<uint32_t>& desired, const std::string& why);
  // Once generation_'s trainers may start: takes the kept trainers'
  // `joined`, restarts those past --restart-timeout or gone.
  void TendKept(const coord::v1::JobView& view);
  // Queues a report for each live capable trainer that wrote its
  // peer-lost note (once per generation it runs in).
  void ReportPeerLostOfLiveTrainers();
  // Whether rank's trainer wrote a valid `capable` with its pid (a bad
  // one is logged once, naming the file).
  bool Capable(uint32_t rank, Proc& proc);
  // The generation rank's kept trainer says it joined, if it did.
  std::optional<uint64_t> Joined(uint32_t rank, Proc& proc);
  RestartPlan PlanFor(const coord::v1::JobView& view, uint32_t rank) const;
  // A new $CKPT_RESTART_DIR (0700), "" if it could not be made.
  std::string NewRestartDir();
  // ckptrun_warm.cc. Takes the warm processes' exits, notes which are
  // ready, starts new ones up to --warm (with back-off; none after
  // kMaxWarmDeaths deaths in a row, none ready between).
  void TendWarm();
  // Hands `rank` of generation_ to a ready warm process; false if none.
  bool PlaceWarm(const coord::v1::JobView& view, uint32_t rank);
  void StartWarm();
  void StopWarm();
  // Removes rank's Proc and its directory: its process is gone.
  void ForgetProc(uint32_t rank);
  // The launcher's directory (stacks, peer-lost notes, restart
  // directories), made on first use; "" if it could not be made.
  std::string LauncherDir();
  // ckptrun_stacks.cc: a hang was detected in `generation` (the view's
  // capture_stacks_generation): captures the stacks of every running
  // trainer (stack_capture.h) and sends them to the coordinator
  // (ReportStacks), before they are stopped.
  void CaptureStacks(uint64_t generation);
  // Where rank `rank`'s trainer writes its Python stacks
  // ($CKPT_STACKS_FILE), created writable for the trainer; "" if the
  // directory could not be made.
  std::string PythonStacksFile(uint32_t rank);
  // A file of rank `rank` in the launcher's directory (made on first use),
  // writable by the trainer; "" if it could not be made.
  std::string RankFile(uint32_t rank, const char* suffix, bool truncate);
  // The same for any name in that directory.
  std::string LauncherFile(const std::string& name, bool truncate);
  // ckptrun_peer_lost.cc: where rank `rank`'s trainer says that its
  // collective failed because peers are gone ($CKPT_PEER_LOST_FILE),
  // emptied for a new start; and, once it exited, what it said (read and
  // emptied).
  std::string PeerLostFile(uint32_t rank);
  PeerLost TakePeerLost(uint32_t rank, uint32_t world_size);
  // A failure travels through survivors: a rank's collective may break on
  // another rank of this node that left (or is leaving) because it lost a
  // peer elsewhere. A named rank of this node is replaced by the ranks it
  // named itself (transitively); while it still runs and has said nothing,
  // the report waits for it, at most kLocalPeerWait. False: wait.
  bool ResolveLocalPeers(PendingReport& r);
  // What `rank` said it lost in `generation` (a report pending or sent);
  // nullptr when it said nothing.
  const std::vector<uint32_t>* SaidLost(uint32_t rank,
                                        uint64_t generation) const;
  static constexpr std::chrono::seconds kLocalPeerWait{2};
  void FlushReports();
  // ckptrun_node_check.cc: a trainer outlived SIGKILL (StopAll): this node
  // is reported unhealthy (check "trainer_unkillable"), sent by
  // FlushNodeCheck once the coordinator is reachable.
  void NoteUnkillable(const std::vector<Unkillable>& stuck);
  void FlushNodeCheck();
  void SetReachable(bool reachable, const absl::Status& why);
  void Log(const std::string& line) const;
  std::string GenerationPrefix() const;

  RunOptions opts_;
  sigset_t signals_;
  int stop_signal_ = 0;
  std::unique_ptr<coordinator::CoordinatorClient> client_;
  std::thread watcher_;
  std::thread note_watcher_;
  int note_fd_ = -1;       // inotify on stacks_dir_; -1: none
  int note_stop_fd_ = -1;  // eventfd: the destructor stops note_watcher_
  pthread_t loop_thread_;  // Run()'s: the one ViewSignal() wakes
  std::mutex watch_mu_;    // guards the four below
  std::optional<coord::v1::JobView> view_;
  absl::Status watch_status_;
  grpc::ClientContext* watch_ctx_ = nullptr;
  bool watch_stopping_ = false;
  std::string last_watch_error_;  // the last refusal logged (Poll's thread)
  TrainerSet trainers_;
  std::unique_ptr<RendezvousKeeper> rendezvous_;
  std::optional<uint64_t> generation_;  // of the trainers started, if any
  std::set<uint32_t> started_;          // ranks started in generation_
  std::set<uint32_t> finished_;         // of those, exited 0
  // Since when every rank of this node has finished (MayLeave).
  std::optional<std::chrono::steady_clock::time_point> all_finished_since_;
  std::map<uint32_t, Proc> procs_;   // by rank, each running trainer
  std::set<uint32_t> restart_anew_;  // kept ones of generation_ to start
  uint64_t procs_made_ = 0;          // restart directories made
  std::deque<PendingReport> reports_;
  // By rank: the generation and ranks of its last peer-lost word sent.
  std::map<uint32_t, std::pair<uint64_t, std::vector<uint32_t>>> said_lost_;
  uint64_t known_generation_ = 0;  // newest generation the coordinator told us
  uint64_t epoch_ = 0;             // this node's epoch, last seen
  uint32_t world_size_ = 0;        // the job's, from the view
  bool reachable_ = true;
  std::string waiting_for_;     // last "waiting" line logged, to log it once
  std::string stacks_dir_;      // made on first use, removed by the destructor
  std::string unkillable_;      // the reason not yet delivered, if any
  std::vector<WarmProc> warm_;  // oldest first
  uint64_t warm_made_ = 0;      // warm processes started
  uint32_t warm_deaths_ = 0;    // in a row, none ready between
  bool warm_given_up_ = false;
  std::chrono::steady_clock::time_point warm_next_{};  // no start before
};

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_CKPTRUN_H_
