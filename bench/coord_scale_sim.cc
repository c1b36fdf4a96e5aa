#include "bench/coord_scale_sim.h"

#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <queue>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "bench/timers.h"
#include "coordinator.grpc.pb.h"
#include "tests/coordinator_process.h"
#include "tests/temp_dir.h"

namespace ckpt::bench {
namespace {

namespace v1 = ::ckpt::coord::v1;
double ProcCpuSeconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), {});
  size_t close = s.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream in(s.substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return double(utime + stime) / sysconf(_SC_CLK_TCK);
}

uint64_t ProcStatusKb(pid_t pid, const std::string& key) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key + ":", 0) == 0)
      return std::stoull(line.substr(key.size() + 1)) * 1024;
  return 0;
}

double LoadAvg() {
  std::ifstream f("/proc/loadavg");
  double l = 0;
  f >> l;
  return l;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  size_t i =
      std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

// The coordinator's jittered "come back in" for a refusal, in seconds; -1
// when it sent none (an older coordinator).
double RetryAfter(const grpc::ClientContext& ctx) {
  const auto& md = ctx.GetServerTrailingMetadata();
  auto it = md.find("ckpt-retry-after-ms");
  if (it == md.end()) return -1;
  try {
    return std::stod(std::string(it->second.data(), it->second.size())) / 1000;
  } catch (...) {
    return -1;
  }
}

bool Retryable(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ||
         s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

constexpr char kJob[] = "bench";

class Sim {
 public:
  Sim(const Args& a, int port) : a_(a), rng_(42) {
    for (int c = 0; c < a.channels; ++c) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL,
                  1);  // one connection per channel
      args.SetInt("ckpt.bench_channel", c);
      stubs_.push_back(v1::Coordinator::NewStub(
          grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port),
                                    grpc::InsecureChannelCredentials(), args)));
    }
    watch_stub_ = v1::CoordinatorWatch::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                            grpc::InsecureChannelCredentials()));
    nodes_.resize(a.nodes + 1);
    for (int i = 0; i <= a.nodes; ++i) {
      char id[32];
      std::snprintf(id, sizeof id, "n%05d", i);
      nodes_[i].id = i == a.nodes ? std::string("spare") : std::string(id);
      nodes_[i].spare = i == a.nodes;
    }
  }

  bool Setup(pid_t coord) {
    start_ = Now();
    cpu_start_ = ProcCpuSeconds(coord);
    std::atomic<int> left{static_cast<int>(nodes_.size())};
    for (size_t i = 0; i < nodes_.size(); ++i)
      Register(static_cast<int>(i), &left);
    // Each node heartbeats from its registration's answer on (Register),
    // as the agent does: issuing thousands of first calls (each on a new
    // connection) takes seconds here, and a node answered early would
    // otherwise be silent that long, really dead for the coordinator.
    auto deadline = Now() + 120;
    while (left > 0 && Now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    registration_s_ = Now() - start_;
    if (left > 0)
      return std::fprintf(
                 stderr,
                 "coord_scale_bench: registration timed out after %.0f s: "
                 "%d of %zu registered; refused %llu registrations, %llu "
                 "heartbeats (%llu more timed out or unreachable); %d false "
                 "deaths; the simulator sent %llu heartbeats more than "
                 "timeout/2 late (max %.1f s)\n",
                 registration_s_, static_cast<int>(nodes_.size()) - left.load(),
                 nodes_.size(),
                 static_cast<unsigned long long>(refused_register_.load()),
                 static_cast<unsigned long long>(refused_heartbeat_.load()),
                 static_cast<unsigned long long>(hb_timed_out_),
                 false_deaths_.load(),
                 static_cast<unsigned long long>(sim_late_sends_),
                 sim_late_max_),
             false;
    v1::RegisterJobRequest req;
    req.set_job(kJob);
    req.set_world_size(a_.nodes * a_.ranks_per_node);
    req.set_nproc_per_node(a_.ranks_per_node);
    v1::RegisterJobResponse resp;
    grpc::Status s;
    for (auto until = Now() + 60;;) {  // an admin call may be shed too
      grpc::ClientContext ctx;
      s = stubs_[0]->RegisterJob(&ctx, req, &resp);
      if (!Retryable(s) || Now() > until) break;
      ++refused_job_;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    if (!s.ok()) {
      std::fprintf(stderr, "coord_scale_bench: RegisterJob: %s\n",
                   s.error_message().c_str());
      SayWhyNodesDied();
      return false;
    }
    gen0_ = resp.job().generation();
    watcher_ = std::thread([this] { Watch(); });
    return true;
  }

  // Why the coordinator declared nodes dead (its reasons, by kind) and how
  // long its heartbeat answers took, so that a failed setup says why.
  void SayWhyNodesDied() {
    grpc::ClientContext ctx;
    v1::GetClusterRequest req;
    v1::GetClusterResponse resp;
    if (!stubs_[0]->GetCluster(&ctx, req, &resp).ok()) return;
    std::map<std::string, int> reasons;
    for (const auto& n : resp.nodes()) {
      if (n.health() != v1::DEAD) continue;
      // "no heartbeat for 3012 ms": the kind, without the figure.
      const std::string& why = n.dead_reason();
      ++reasons[why.substr(0, why.find_first_of("0123456789"))];
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [why, count] : reasons)
      std::fprintf(stderr, "coord_scale_bench: %d nodes dead: %s...\n", count,
                   why.c_str());
    std::fprintf(
        stderr,
        "coord_scale_bench: heartbeat answers p50 %.2f s, p99 %.2f s, max "
        "%.2f s; %d false deaths; the simulator sent %llu heartbeats more "
        "than timeout/2 late (max %.1f s)\n",
        Percentile(hb_latency_, 0.5), Percentile(hb_latency_, 0.99),
        hb_latency_.empty()
            ? -1.0
            : *std::max_element(hb_latency_.begin(), hb_latency_.end()),
        false_deaths_.load(), static_cast<unsigned long long>(sim_late_sends_),
        sim_late_max_);
  }

  // After a failed Setup: no call may land on a destroyed Sim.
  void Abort() {
    stopping_ = true;
    timers_.Stop();
    while (inflight_ > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }

  void Run(Result* r, pid_t coord) {
    std::this_thread::sleep_for(
        std::chrono::milliseconds(a_.heartbeat_ms * 2));  // assignments known
    const double t0 = Now();
    const double cpu0 = ProcCpuSeconds(coord);
    const uint64_t hb0 = hb_ok_;
    const uint64_t rpcs0 = rpcs_;
    struct rusage ru0;
    getrusage(RUSAGE_SELF, &ru0);
    r->load_before = LoadAvg();
    uint64_t step = 0;
    bool killed = false;
    for (double next = t0; Now() < t0 + a_.duration_s;) {
      if (!killed && Now() >= t0 + a_.kill_at_s) {
        killed = true;
        std::lock_guard<std::mutex> lock(mu_);
        nodes_[0].dead = true;
        kill_time_ = Now();
      }
      if (Now() >= next) {
        step += 10;
        StartStep(step);
        next += a_.interval_s;
      }
      if (killed && detect_event_ms_ < 0) PollEvents();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const double t1 = Now();
    const double cpu1 = ProcCpuSeconds(coord);
    struct rusage ru1;
    getrusage(RUSAGE_SELF, &ru1);
    r->load_after = LoadAvg();
    r->rss = ProcStatusKb(coord, "VmRSS");
    r->rss_peak = ProcStatusKb(coord, "VmHWM");
    if (detect_event_ms_ < 0) PollEvents();
    stopping_ = true;
    timers_.Stop();
    while (inflight_ > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    watch_ctx_.TryCancel();
    watcher_.join();

    auto tv = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
    r->bench_cpu_cores = (tv(ru1.ru_utime) + tv(ru1.ru_stime) -
                          tv(ru0.ru_utime) - tv(ru0.ru_stime)) /
                         (t1 - t0);
    r->cpu_cores = (cpu1 - cpu0) / (t1 - t0);
    r->nodes = a_.nodes;
    r->ranks = a_.nodes * a_.ranks_per_node;
    r->interval_s = a_.interval_s;
    r->duration_s = a_.duration_s;
    r->reports_per_s = reports_ok_ / (t1 - t0);
    r->rpcs_per_s = static_cast<double>(rpcs_ - rpcs0) / (t1 - t0);
    r->heartbeats_per_s = static_cast<double>(hb_ok_ - hb0) / (t1 - t0);
    r->refused = refused_;
    r->report_errors = report_errors_;
    r->false_deaths = false_deaths_;
    r->refused_register = refused_register_;
    r->refused_heartbeat = refused_heartbeat_;
    r->hb_timed_out = hb_timed_out_;
    r->sim_late_max_s = sim_late_max_;
    r->sim_late_sends = sim_late_sends_;
    r->refused_job = refused_job_;
    r->told_heartbeat_ms = told_hb_ms_;
    r->reregistrations = reregistered_calls_;
    r->registration_s = registration_s_;
    r->cpu_total_s = cpu1 - cpu_start_;
    r->wall_total_s = t1 - start_;
    r->cpus = static_cast<int>(std::thread::hardware_concurrency());
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<double> lat;
    r->steps_started = static_cast<int>(steps_.size());
    for (const auto& [n, st] : steps_)
      if (st.committed > 0)
        lat.push_back(std::max(0.0, st.committed - st.last_durable_send));
    r->steps_committed = static_cast<int>(lat.size());
    r->commit_p50 = Percentile(lat, 0.5);
    r->commit_p99 = Percentile(lat, 0.99);
    r->commit_max =
        lat.empty() ? -1 : *std::max_element(lat.begin(), lat.end());
    if (detect_event_ms_ >= 0)
      r->detect_s = detect_event_ms_ / 1000.0 - nodes_[0].last_hb_ok_sent;
    if (detect_event_ms_ >= 0 && plan_event_ms_ >= 0)
      r->plan_compute_s = (plan_event_ms_ - detect_event_ms_) / 1000.0;
    if (detect_event_ms_ >= 0 && plan_seen_ > 0)
      r->plan_s = plan_seen_ - detect_event_ms_ / 1000.0;
    r->plan_orders = static_cast<int>(plan_orders_.size());
    r->hb_p99 = Percentile(hb_latency_, 0.99);
    r->hb_max = hb_latency_.empty()
                    ? -1
                    : *std::max_element(hb_latency_.begin(), hb_latency_.end());
    r->hb_errors = hb_errors_;
  }

 private:
  struct Node {
    std::string id;
    bool spare = false;
    bool dead = false;
    uint64_t epoch = 0;
    std::vector<uint32_t> ranks;
    std::vector<uint64_t> acks;
    std::set<uint64_t> seen;
    double last_hb_ok_sent = 0;
    uint64_t fenced_epoch = 0;  // the last epoch the coordinator fenced
    bool beating = false;       // its heartbeats started
    // The interval the coordinator told (0: none yet, --heartbeat-ms).
    int hb_ms = 0;
  };
  // As the node agent: the coordinator's interval once told, else ours.
  double HeartbeatS(int i) {
    std::lock_guard<std::mutex> lock(mu_);
    return (nodes_[i].hb_ms > 0 ? nodes_[i].hb_ms : a_.heartbeat_ms) / 1000.0;
  }
  struct StepStat {
    double last_durable_send = 0;
    double committed = -1;
  };
  template <typename Req, typename Resp>
  struct Call {
    grpc::ClientContext ctx;
    Req req;
    Resp resp;
  };

  v1::Coordinator::Stub* StubFor(int i) {
    return stubs_[i % stubs_.size()].get();
  }

  void Register(int i, std::atomic<int>* left) {
    if (stopping_) return;
    auto* c = new Call<v1::RegisterNodeRequest, v1::RegisterNodeResponse>;
    c->req.set_node_id(nodes_[i].id);
    c->req.set_address(nodes_[i].id + ":29500");
    c->req.set_capacity(static_cast<uint32_t>(a_.ranks_per_node));
    c->req.set_spare(nodes_[i].spare);
    ++inflight_;
    StubFor(i)->async()->RegisterNode(
        &c->ctx, &c->req, &c->resp, [this, c, i, left](grpc::Status s) {
          if (s.ok()) {
            bool first = false;
            {
              std::lock_guard<std::mutex> lock(mu_);
              nodes_[i].epoch = c->resp.epoch();
              nodes_[i].hb_ms =
                  static_cast<int>(c->resp.heartbeat_interval_ms());
              first = !std::exchange(nodes_[i].beating, true);
              --*left;
            }
            // The first heartbeat at once (a fenced node's heartbeats go on
            // from where they were).
            const double due = Now();
            if (first) timers_.At(due, [this, i, due] { Heartbeat(i, due); });
          } else {
            // As the node agent does: the coordinator's retry-after, else
            // its registration interval with jitter.
            if (Retryable(s)) ++refused_register_;
            double after = RetryAfter(c->ctx);
            if (after < 0) after = 0.25 * (0.5 + (i % 100) / 100.0);
            timers_.At(Now() + after, [this, i, left] { Register(i, left); });
          }
          delete c;
          --inflight_;
        });
  }

  void Heartbeat(int i, double due) {
    if (stopping_) return;
    {
      // How late the simulator itself sends (a starved simulator's nodes
      // are silent for the coordinator, whatever it does).
      const double late = Now() - due;
      std::lock_guard<std::mutex> lock(mu_);
      sim_late_max_ = std::max(sim_late_max_, late);
      if (late > a_.timeout_ms / 2000.0) ++sim_late_sends_;
    }
    auto* c = new Call<v1::HeartbeatRequest, v1::HeartbeatResponse>;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (nodes_[i].dead) {
        delete c;
        return;
      }
      if (nodes_[i].epoch == 0) {  // not registered yet
        delete c;
        const double due =
            Now() +
            (nodes_[i].hb_ms > 0 ? nodes_[i].hb_ms : a_.heartbeat_ms) / 1000.0;
        timers_.At(due, [this, i, due] { Heartbeat(i, due); });
        return;
      }
      c->req.set_node_id(nodes_[i].id);
      c->req.set_epoch(nodes_[i].epoch);
      *c->req.mutable_acked_order_ids() = {nodes_[i].acks.begin(),
                                           nodes_[i].acks.end()};
      // As the agent: every hosted rank's progress (its beacon), so each
      // heartbeat carries the per-rank items a real one does.
      for (uint32_t r : nodes_[i].ranks) {
        v1::RankProgress* p = c->req.add_progress();
        p->set_job(kJob);
        p->set_rank(r);
        p->set_has_step(true);
        p->set_step(1);
        p->set_ms_since_advance(100);
        p->set_step_ms_p50(1000);
        p->set_step_ms_p99(1100);
        p->set_step_samples(8);
      }
    }
    const double sent = Now();
    c->ctx.set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(a_.timeout_ms));
    ++inflight_;
    ++rpcs_;
    StubFor(i)->async()->Heartbeat(
        &c->ctx, &c->req, &c->resp, [this, c, i, sent](grpc::Status s) {
          bool fenced = false;
          {
            std::lock_guard<std::mutex> lock(mu_);
            Node& n = nodes_[i];
            if (s.ok() || Retryable(s)) hb_latency_.push_back(Now() - sent);
            if (!s.ok()) ++hb_errors_;
            if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED)
              ++refused_heartbeat_;
            if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
                s.error_code() == grpc::StatusCode::UNAVAILABLE)
              ++hb_timed_out_;
            if (s.ok()) {
              n.last_hb_ok_sent = sent;
              ++hb_ok_;
              if (c->resp.heartbeat_interval_ms() > 0)
                n.hb_ms = static_cast<int>(c->resp.heartbeat_interval_ms());
              told_hb_ms_ = std::max(told_hb_ms_, n.hb_ms);
              for (uint64_t id : c->req.acked_order_ids())
                std::erase(n.acks, id);
              n.ranks.clear();
              for (const auto& as : c->resp.assignments())
                if (as.job() == kJob)
                  n.ranks.assign(as.ranks().begin(), as.ranks().end());
              for (const auto& o : c->resp.orders()) {
                if (o.generation() > gen0_) plan_orders_.insert(o.id());
                if (n.seen.insert(o.id()).second) n.acks.push_back(o.id());
              }
            } else if (s.error_code() ==
                           grpc::StatusCode::FAILED_PRECONDITION &&
                       n.fenced_epoch != c->req.epoch()) {
              n.fenced_epoch = c->req.epoch();
              fenced = true;
              if (!n.dead) ++false_deaths_;  // fenced while alive
            }
          }
          if (fenced) {
            // As the node agent does: register again (once) for a new
            // epoch.
            ++reregistered_calls_;
            Register(i, &reregistered_);
            const double due = Now() + HeartbeatS(i);
            timers_.At(due, [this, i, due] { Heartbeat(i, due); });
          } else if (s.ok() || Retryable(s) ||
                     s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
            const double due = sent + HeartbeatS(i);
            timers_.At(due, [this, i, due] { Heartbeat(i, due); });
          }
          delete c;
          --inflight_;
        });
  }

  void StartStep(uint64_t step) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      steps_[step];
    }
    std::uniform_real_distribution<double> jitter(0, 0.05);
    for (size_t i = 0; i < nodes_.size(); ++i) {
      double when = Now() + jitter(rng_);
      timers_.At(when, [this, i, step] {
        Report(static_cast<int>(i), step, false, 0);
      });
    }
  }

  void Report(int i, uint64_t step, bool durable, int attempt) {
    if (stopping_) return;
    auto* c = new Call<v1::ReportShardsRequest, v1::ReportShardsResponse>;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const Node& n = nodes_[i];
      if (n.dead || n.ranks.empty()) {
        delete c;
        return;
      }
      c->req.set_node_id(n.id);
      c->req.set_epoch(n.epoch);
      for (uint32_t rank : n.ranks) {
        v1::ShardReport* r = c->req.add_reports();
        r->set_job(kJob);
        r->set_step(step);
        r->set_rank(rank);
        r->set_state(durable ? v1::DURABLE : v1::STAGED);
        r->set_bytes(1 << 30);
        r->set_checksum_digest(0x1234 + rank);
        if (durable)
          r->set_key(std::string(kJob) + "/step-" + std::to_string(step) +
                     "/rank-" + std::to_string(rank));
      }
    }
    const double sent = Now();
    ++inflight_;
    ++rpcs_;
    StubFor(i)->async()->ReportShards(
        &c->ctx, &c->req, &c->resp,
        [this, c, i, step, durable, attempt, sent](grpc::Status s) {
          if (Retryable(s)) {
            ++refused_;
            double backoff = std::min(2.0, 0.02 * (1 << std::min(attempt, 7)));
            backoff *= 0.5 + (i % 100) / 100.0;
            if (double after = RetryAfter(c->ctx); after >= 0) backoff = after;
            timers_.At(Now() + backoff, [this, i, step, durable, attempt] {
              Report(i, step, durable, attempt + 1);
            });
          } else if (!s.ok()) {
            ++report_errors_;
          } else {
            bool committed = false;
            int ok = 0;
            for (const auto& r : c->resp.results()) {
              if (r.code() == 0)
                ++ok;
              else
                ++report_errors_;
              committed = committed || r.durable_everywhere();
            }
            reports_ok_ += ok;
            std::lock_guard<std::mutex> lock(mu_);
            StepStat& st = steps_[step];
            if (durable && ok > 0)
              st.last_durable_send = std::max(st.last_durable_send, sent);
            if (committed && st.committed < 0) st.committed = Now();
            if (!durable && ok > 0) {
              double when = Now() + a_.persist_ms / 1000.0 *
                                        (0.8 + 0.4 * (i % 97) / 97.0);
              timers_.At(when, [this, i, step] { Report(i, step, true, 0); });
            }
          }
          delete c;
          --inflight_;
        });
  }

  void PollEvents() {
    v1::EventsRequest req;
    req.set_job(kJob);
    req.set_after_seq(event_seq_);
    v1::EventsResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(5));
    if (!stubs_[0]->Events(&ctx, req, &resp).ok()) return;
    for (const auto& e : resp.events()) {
      event_seq_ = std::max(event_seq_, e.seq());
      if (e.kind() == v1::FAILURE_DETECTED && e.node_id() == nodes_[0].id &&
          detect_event_ms_ < 0)
        detect_event_ms_ = e.time_ms();
      if (e.kind() == v1::PLAN_MADE && detect_event_ms_ >= 0 &&
          plan_event_ms_ < 0)
        plan_event_ms_ = e.time_ms();
    }
  }

  void Watch() {
    v1::WatchJobRequest req;
    req.set_job(kJob);
    req.set_node_id(nodes_[1].id);
    auto reader = watch_stub_->WatchJob(&watch_ctx_, req);
    v1::JobView v;
    while (reader->Read(&v)) {
      std::lock_guard<std::mutex> lock(mu_);
      if (v.generation() > gen0_ && plan_seen_ < 0) plan_seen_ = Now();
    }
    reader->Finish().ok();
  }

  const Args a_;
  std::mt19937 rng_;
  std::vector<std::unique_ptr<v1::Coordinator::Stub>> stubs_;
  std::unique_ptr<v1::CoordinatorWatch::Stub> watch_stub_;
  grpc::ClientContext watch_ctx_;
  std::thread watcher_;
  Timers timers_;
  std::mutex mu_;
  std::vector<Node> nodes_;
  std::map<uint64_t, StepStat> steps_;
  std::set<uint64_t> plan_orders_;
  std::vector<double> hb_latency_;
  uint64_t hb_errors_ = 0;
  uint64_t gen0_ = 0;
  double kill_time_ = 0;
  double plan_seen_ = -1;
  int64_t detect_event_ms_ = -1, plan_event_ms_ = -1;
  uint64_t event_seq_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> inflight_{0};
  std::atomic<uint64_t> hb_ok_{0};
  int told_hb_ms_ = 0;  // under mu_: the largest interval told
  std::atomic<uint64_t> reports_ok_{0}, rpcs_{0}, refused_{0},
      report_errors_{0};
  std::atomic<int> false_deaths_{0};
  std::atomic<int> reregistered_{0};
  std::atomic<int> reregistered_calls_{0};
  std::atomic<uint64_t> refused_register_{0}, refused_heartbeat_{0},
      refused_job_{0};
  double start_ = 0, cpu_start_ = 0, registration_s_ = -1;
  double sim_late_max_ = 0;
  uint64_t sim_late_sends_ = 0, hb_timed_out_ = 0;
};

}  // namespace

bool RunOnce(const Args& a, Result* r) {
  testing::TempDir dir;
  testing::CoordinatorProcess coord(dir.path() + "/state",
                                    dir.path() + "/shared", a.timeout_ms,
                                    /*port=*/0, a.binary);
  if (coord.port() <= 0) {
    std::fprintf(stderr, "coord_scale_bench: %s did not start\n",
                 a.binary.c_str());
    return false;
  }
  Sim sim(a, coord.port());
  if (!sim.Setup(coord.pid())) {
    sim.Abort();
    return false;
  }
  sim.Run(r, coord.pid());
  return true;
}

}  // namespace ckpt::bench
