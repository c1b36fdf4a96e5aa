// Launcher: the reconcile loop of ckptrun (see ckptrun.h).
#include "tools/ckptrun.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/client/channel.h"
#include "util/retry.h"

namespace ckpt::tools {
namespace {

namespace cv1 = ::ckpt::coord::v1;
}  // namespace

int ViewSignal() { return SIGRTMIN; }

Launcher::Launcher(RunOptions options, const sigset_t& stop_signals)
    : opts_(std::move(options)),
      signals_(stop_signals),
      // ParseRunOptions already created one with these options.
      client_(
          coordinator::CoordinatorClient::Create(opts_.coordinator, opts_.tls)
              .value()),
      rendezvous_(std::make_unique<RendezvousKeeper>(
          opts_.rendezvous, opts_.master_port, opts_.rendezvous_python,
          absl::StrCat("ckptrun[", opts_.node_id, "]: "))) {}

Launcher::~Launcher() {
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    watch_stopping_ = true;
    if (watch_ctx_) watch_ctx_->TryCancel();
  }
  if (watcher_.joinable()) watcher_.join();
  if (note_stop_fd_ >= 0) {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(note_stop_fd_, &one, sizeof(one));
  }
  if (note_watcher_.joinable()) note_watcher_.join();
  if (note_fd_ >= 0) ::close(note_fd_);
  if (note_stop_fd_ >= 0) ::close(note_stop_fd_);
  if (!stacks_dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(stacks_dir_, ec);
  }
}

// The stream follows the leader: when it ends UNAVAILABLE (a replica down,
// or a standby's / deposed leader's "not leader; leader is X") the client
// moves to X or the next address and the stream is reopened there.
void Launcher::WatchLoop() {
  auto backoff = std::chrono::milliseconds(100);
  for (;;) {
    grpc::ClientContext ctx;
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      if (watch_stopping_) return;
      watch_ctx_ = &ctx;
    }
    cv1::WatchJobRequest req;
    req.set_job(opts_.job);
    req.set_node_id(opts_.node_id);
    size_t idx = 0;
    const std::string addr = client_->current();
    std::unique_ptr<grpc::ClientReader<cv1::JobView>> reader =
        client_->watch_stub(&idx)->WatchJob(&ctx, req);
    cv1::JobView view;
    while (reader->Read(&view)) {
      {
        std::lock_guard<std::mutex> lock(watch_mu_);
        view_ = view;
        watch_status_ = absl::OkStatus();
        backoff = std::chrono::milliseconds(100);
      }
      pthread_kill(loop_thread_, ViewSignal());  // act on it now
    }
    grpc::Status ended = reader->Finish();
    const bool moved =
        !ended.ok() && !coordinator::LeaderHint(ended, ctx).empty();
    absl::Status s = coordinator::CoordStatus(
        client_->StreamEnded(ended, idx, &ctx), "WatchJob", addr);
    std::unique_lock<std::mutex> lock(watch_mu_);
    watch_ctx_ = nullptr;
    if (watch_stopping_) return;
    if (s.ok())
      s = absl::UnavailableError("WatchJob to coordinator " + addr +
                                 ": stream ended");
    watch_status_ = s;
    lock.unlock();
    if (moved && client_->current() != addr)
      continue;  // the leader is named: go there now
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
  }
}

void Launcher::NoteWatchLoop() {
  pollfd fds[2] = {{note_stop_fd_, POLLIN, 0}, {note_fd_, POLLIN, 0}};
  alignas(inotify_event) char buf[4096];
  for (;;) {
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) return;
    if (fds[0].revents != 0) return;  // the destructor
    if (fds[1].revents == 0) continue;
    while (::read(note_fd_, buf, sizeof(buf)) > 0) {
    }
    pthread_kill(loop_thread_, ViewSignal());  // read the notes now
  }
}

void Launcher::Log(const std::string& line) const {
  std::fprintf(stderr, "ckptrun[%s]: %s\n", opts_.node_id.c_str(),
               line.c_str());
  std::fflush(stderr);
}

std::string Launcher::GenerationPrefix() const {
  return generation_ ? absl::StrCat("generation ", *generation_, ": ") : "";
}

bool Launcher::Wait(std::chrono::milliseconds d) {
  auto deadline = std::chrono::steady_clock::now() + d;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return true;
    struct timespec ts = {static_cast<time_t>(left.count() / 1000000000),
                          static_cast<long>(left.count() % 1000000000)};
    int sig = sigtimedwait(&signals_, nullptr, &ts);
    // A trainer exited, or a view arrived: act on it now.
    if (sig == SIGCHLD || sig == ViewSignal()) return true;
    if (sig > 0) {
      stop_signal_ = sig;
      return false;
    }
    if (errno == EAGAIN) return true;
  }
}

std::optional<int> Launcher::RegisterJob() {
  std::string last_error;
  for (;;) {
    cv1::RegisterJobRequest req;
    req.set_job(opts_.job);
    req.set_world_size(opts_.world_size);
    req.set_nproc_per_node(opts_.nproc_per_node);
    if (opts_.min_world_size) req.set_min_world_size(*opts_.min_world_size);
    if (opts_.world_size_multiple)
      req.set_world_size_multiple(*opts_.world_size_multiple);
    cv1::RegisterJobResponse resp;
    absl::Status s = coordinator::CoordStatus(
        client_->Call(&cv1::Coordinator::Stub::RegisterJob, req, &resp,
                      kRpcTimeout),
        "RegisterJob", client_->current());
    if (s.ok()) {
      Log(absl::StrCat("job ", opts_.job, " registered, world size ",
                       resp.job().world_size(), ", generation ",
                       resp.job().generation()));
      return std::nullopt;
    }
    if (!IsUnreachable(s) &&
        s.code() != absl::StatusCode::kFailedPrecondition) {
      Log(std::string(s.message()));
      return 2;
    }
    if (std::string(s.message()) != last_error) {
      last_error = std::string(s.message());
      Log(absl::StrCat("waiting: ", last_error));
    }
    if (!Wait(opts_.poll)) return 128 + stop_signal_;
  }
}

int Launcher::Run() {
  // Up before any trainer of any generation needs it.
  rendezvous_->Tend(opts_.poll);
  if (std::optional<int> rc = RegisterJob()) return *rc;
  loop_thread_ = pthread_self();
  watcher_ = std::thread([this] { WatchLoop(); });
  note_fd_ = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  note_stop_fd_ = note_fd_ >= 0 ? eventfd(0, EFD_CLOEXEC) : -1;
  if (note_fd_ >= 0 && note_stop_fd_ >= 0) {
    if (!stacks_dir_.empty())  // made before: watched now
      inotify_add_watch(note_fd_, stacks_dir_.c_str(), IN_MODIFY);
    note_watcher_ = std::thread([this] { NoteWatchLoop(); });
  } else {
    Log(absl::StrCat("no inotify (", std::strerror(errno),
                     "): peer-lost notes are read at each poll"));
  }
  for (;;) {
    Poll();
    if (generation_ && !started_.empty() && finished_ == started_) {
      if (MayLeave()) break;
    } else {
      all_finished_since_.reset();
    }
    if (!Wait(opts_.poll)) {
      Log(absl::StrCat("signal ", stop_signal_, ": stopping ranks ",
                       absl::StrJoin(trainers_.RunningRanks(), ",")));
      trainers_.StopAll(opts_.grace);
      StopWarm();
      return 128 + stop_signal_;
    }
  }
  Log(absl::StrCat(GenerationPrefix(), "every rank on this node finished"));
  StopWarm();
  // The finish reports are worth a short wait, not a hang.
  auto deadline = std::chrono::steady_clock::now() +
                  std::max(opts_.grace, std::chrono::milliseconds(5000));
  while (!reports_.empty() && std::chrono::steady_clock::now() < deadline) {
    FlushReports();
    if (!reports_.empty() && !Wait(opts_.poll)) return 128 + stop_signal_;
  }
  if (!reports_.empty())
    Log(absl::StrCat(reports_.size(), " exit report(s) not delivered"));
  return 0;
}

bool Launcher::MayLeave() {
  const auto now = std::chrono::steady_clock::now();
  const bool first = !all_finished_since_.has_value();
  if (first) all_finished_since_ = now;
  std::optional<cv1::JobView> view;
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    view = view_;
  }
  const bool told = reports_.empty();  // this node's exits are known
  if (told && view && view->registered() && !view->finish_tracked())
    return true;  // an older coordinator: leave as before
  if (told && view && view->job_finished() &&
      view->generation() == generation_.value_or(0))
    return true;
  if (now - *all_finished_since_ >= opts_.finish_wait) {
    Log(absl::StrCat(GenerationPrefix(), "the job's other ranks did not all ",
                     "finish within --finish-wait-s ",
                     opts_.finish_wait.count() / 1000.0, "; leaving"));
    return true;
  }
  if (first)
    Log(absl::StrCat(GenerationPrefix(),
                     "every rank on this node finished; waiting for the "
                     "job's other ranks (a failure among them restarts "
                     "ranks here)"));
  return false;
}

void Launcher::SetReachable(bool reachable, const absl::Status& why) {
  if (reachable == reachable_) return;
  reachable_ = reachable;
  Log(reachable
          ? "coordinator reachable again"
          : absl::StrCat("coordinator unreachable, trainers keep running: ",
                         why.message()));
}

void Launcher::Poll() {
  std::optional<cv1::JobView> view;
  absl::Status s;
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    view = view_;
    s = watch_status_;
  }
  if (s.ok()) {
    SetReachable(true, s);
    last_watch_error_.clear();
  } else if (IsUnreachable(s)) {
    SetReachable(false, s);
  } else if (s.message() !=
             last_watch_error_) {  // refused (e.g. PERMISSION_DENIED): say so
                                   // once
    last_watch_error_ = std::string(s.message());
    Log(last_watch_error_);
  }
  if (view && view->registered()) {
    known_generation_ = std::max(known_generation_, view->generation());
    if (view->node_health() != cv1::NODE_HEALTH_UNSPECIFIED)
      epoch_ = view->node_epoch();
  }
  if (view && view->registered()) world_size_ = view->world_size();
  for (const TrainerExit& e : trainers_.Reap()) {
    uint64_t generation = generation_.value_or(0);
    bool kept = false;
    if (auto p = procs_.find(e.rank); p != procs_.end()) {
      generation = p->second.generation;
      kept = p->second.kept_for.has_value();
      // A kept trainer gone before it joined is of the old generation (its
      // report is dropped below): started anew in the current one.
      if (kept && generation_ && *p->second.kept_for == *generation_)
        restart_anew_.insert(e.rank);
      ForgetProc(e.rank);
    }
    if (e.clean() && !kept) finished_.insert(e.rank);
    PeerLost peers = TakePeerLost(e.rank, world_size_);
    if (e.clean()) peers = {};
    reports_.push_back({e, std::move(peers), generation, epoch_, false});
  }
  TendWarm();
  rendezvous_->Tend(opts_.poll);
  ReportPeerLostOfLiveTrainers();
  FlushReports();
  FlushNodeCheck();
  if (view && view->registered()) Reconcile(*view);
}

void Launcher::FlushReports() {
  while (!reports_.empty()) {
    PendingReport& r = reports_.front();
    if (r.generation >= known_generation_ && !ResolveLocalPeers(r))
      return;  // a rank of this node it named has not said what it lost
    std::string what = absl::StrCat(
        "generation ", r.generation, ": rank ", r.exit.rank, " ",
        r.process_kept ? std::string("still running") : DescribeExit(r.exit),
        !r.peers.said ? ""
        : r.peers.ranks.empty()
            ? " (it lost peers)"
            : absl::StrCat(
                  " (it lost peer ranks ", absl::StrJoin(r.peers.ranks, ","),
                  r.named.empty()
                      ? ""
                      : absl::StrCat("; it named ", absl::StrJoin(r.named, ","),
                                     ", of this node, which lost them"),
                  ")"));
    if (r.generation < known_generation_) {
      // Its generation is already replaced; reporting it would only plan again.
      Log(absl::StrCat(what, "; not reported (generation ", known_generation_,
                       " is current)"));
      reports_.pop_front();
      continue;
    }
    if (r.awaiting_epoch) {
      if (epoch_ == r.epoch)
        return;  // the view has not shown the new epoch yet
      r.awaiting_epoch = false;
      r.epoch_retried = true;
      r.epoch = epoch_;
    }
    cv1::ReportTrainerExitRequest req;
    req.set_node_id(opts_.node_id);
    req.set_epoch(r.epoch);
    req.set_job(opts_.job);
    req.set_rank(r.exit.rank);
    req.set_exit_code(r.exit.exit_code);
    req.set_term_signal(r.exit.term_signal);
    // The coordinator plans only for an exit of the current generation: a
    // retry of a report it did take (its answer lost) plans nothing again.
    req.set_generation(r.generation);
    // Maybe a symptom of a peer's death: the coordinator probes the
    // peers' nodes before it plans.
    req.set_peer_lost(r.peers.said);
    for (uint32_t p : r.peers.ranks) req.add_lost_peer_ranks(p);
    req.set_process_kept(r.process_kept);
    cv1::ReportTrainerExitResponse resp;
    absl::Status s = coordinator::CoordStatus(
        client_->Call(&cv1::Coordinator::Stub::ReportTrainerExit, req, &resp,
                      kRpcTimeout),
        "ReportTrainerExit", client_->current());
    if (IsUnreachable(s)) {
      SetReachable(false, s);
      if (!r.logged_queued)
        Log(absl::StrCat(what,
                         "; report queued until the coordinator is back"));
      r.logged_queued = true;
      return;
    }
    if (s.ok()) {
      SetReachable(true, s);
      if (r.peers.said) said_lost_[r.exit.rank] = {r.generation, r.peers.ranks};
      known_generation_ = std::max(known_generation_, resp.generation());
      Log(absl::StrCat(what, resp.held() ? "; reported (held: its peers' "
                                           "nodes are probed)"
                                         : "; reported"));
    } else if (s.code() == absl::StatusCode::kFailedPrecondition &&
               !r.epoch_retried) {
      // epoch_ comes from the view, asynchronously: the node may have
      // registered again (a new epoch) before the view said so. A failure
      // dropped here would never be reported.
      Log(absl::StrCat(
          what, "; report refused at epoch ", r.epoch, ": ", s.message(),
          "; sending it again once this node's epoch is refreshed"));
      r.awaiting_epoch = true;
      return;
    } else {
      Log(absl::StrCat(what, "; report refused: ", s.message()));
    }
    reports_.pop_front();
  }
}

void Launcher::StopRanks(const std::vector<uint32_t>& ranks,
                         const std::string& why) {
  if (ranks.empty()) return;
  Log(absl::StrCat(GenerationPrefix(), "stopping ranks ",
                   absl::StrJoin(ranks, ","), " (", why, ")"));
  NoteUnkillable(trainers_.Stop(ranks, opts_.grace));
  for (uint32_t rank : ranks) ForgetProc(rank);
}

void Launcher::StopTrainers(const std::string& why) {
  StopRanks(trainers_.RunningRanks(), why);
  generation_.reset();
  started_.clear();
  finished_.clear();
  restart_anew_.clear();
}

void Launcher::Reconcile(const cv1::JobView& job) {
  std::set<uint32_t> desired;
  if (job.node_health() == cv1::ALIVE)
    desired.insert(job.ranks().begin(), job.ranks().end());
  if (generation_ && *generation_ != job.generation() &&
      job.has_capture_stacks_generation() &&
      job.capture_stacks_generation() == *generation_ &&
      !trainers_.RunningRanks().empty())
    CaptureStacks(*generation_);  // a hang: the evidence before the kill
  if (generation_ && *generation_ != job.generation())
    KeepOrStop(
        job, desired,
        absl::StrCat("generation ", *generation_, " -> ", job.generation()));
  else if (generation_ && desired != started_)
    StopTrainers(desired.empty() ? "this node is not alive or hosts no ranks"
                                 : "the ranks of this node changed");
  else if (!generation_ && !trainers_.RunningRanks().empty())
    KeepOrStop(job, desired,  // kept trainers wait for the generation
               absl::StrCat("generation ", job.generation()));
  if (generation_) TendKept(job);
  if (generation_ || desired.empty()) return;
  // A plan's trainers may start while its prefetches run (ckptd's restore
  // waits for a fetch in flight): the coordinator says when.
  if (job.plan_state() != cv1::PLAN_NONE &&
      job.plan_state() != cv1::PLAN_ACKNOWLEDGED && !job.trainers_may_start()) {
    std::string waiting =
        job.plan_state() == cv1::PLAN_HELD
            ? absl::StrCat("generation ", job.generation(),
                           ": the job is held (its plans since the last "
                           "commit all failed); its trainers start when an "
                           "operator resumes it (ckptctl resume)")
            : absl::StrCat("generation ", job.generation(),
                           ": waiting for the plan (",
                           cv1::PlanState_Name(job.plan_state()), ")");
    if (waiting != waiting_for_) Log(waiting);
    waiting_for_ = waiting;
    return;
  }
  waiting_for_.clear();
  StartTrainers(job, std::vector<uint32_t>(desired.begin(), desired.end()));
}

}  // namespace ckpt::tools
