#include "bench/coord_scale_sim.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "bench/timers.h"
#include "coordinator.grpc.pb.h"
#include "coordinator/heartbeat_interval.h"
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

double SelfCpuSeconds() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  auto tv = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return tv(ru.ru_utime) + tv(ru.ru_stime);
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  size_t i =
      std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

// Durations in 100 µs buckets up to 60 s (the last bucket holds the
// rest), counted without a lock from any thread; the exact maximum aside.
// Children send theirs to the parent as "bucket:count,..." (Encode), which
// adds them up (Merge).
class Histogram {
 public:
  static constexpr size_t kBuckets = 600000;
  static constexpr double kBucketS = 1e-4;
  Histogram() : b_(kBuckets) {}
  void Add(double s) {
    const size_t i =
        s <= 0 ? 0 : std::min(kBuckets - 1, static_cast<size_t>(s / kBucketS));
    b_[i].fetch_add(1, std::memory_order_relaxed);
    n_.fetch_add(1, std::memory_order_relaxed);
    double m = max_.load(std::memory_order_relaxed);
    while (s > m && !max_.compare_exchange_weak(m, s)) {
    }
  }
  uint64_t Count() const { return n_.load(); }
  double Max() const { return max_.load(); }
  // The upper edge of the bucket holding the p-th fraction; -1 if empty.
  double Percentile(double p) const {
    const uint64_t n = Count();
    if (n == 0) return -1;
    const uint64_t want = std::max<uint64_t>(1, std::ceil(p * n));
    uint64_t seen = 0;
    for (size_t i = 0; i < kBuckets; ++i) {
      seen += b_[i].load(std::memory_order_relaxed);
      if (seen >= want) return std::min(Max(), (i + 1) * kBucketS);
    }
    return Max();
  }
  std::string Encode() const {
    std::string out = std::to_string(Max());
    for (size_t i = 0; i < kBuckets; ++i)
      if (uint32_t c = b_[i].load(std::memory_order_relaxed))
        out += " " + std::to_string(i) + ":" + std::to_string(c);
    return out;
  }
  // False on a malformed line (a broken child).
  bool Merge(const std::string& line) {
    std::istringstream in(line);
    double m = 0;
    if (!(in >> m)) return false;
    std::string item;
    while (in >> item) {
      size_t colon = item.find(':');
      if (colon == std::string::npos) return false;
      const size_t i = std::stoul(item.substr(0, colon));
      const uint32_t c = std::stoul(item.substr(colon + 1));
      if (i >= kBuckets) return false;
      b_[i].fetch_add(c);
      n_.fetch_add(c);
    }
    double cur = max_.load();
    while (m > cur && !max_.compare_exchange_weak(cur, m)) {
    }
    return true;
  }

 private:
  std::vector<std::atomic<uint32_t>> b_;
  std::atomic<uint64_t> n_{0};
  std::atomic<double> max_{0};
};

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

// What a ckptd registers with (daemon/health/health.cc's checks): memcpy
// and cuda figures that differ a little from node to node, the storage
// probes, no shared root. The coordinator judges every report against the
// cluster's medians, so a simulator without them would hide that cost.
v1::NodeHealthReport HealthReportOf(int k) {
  v1::NodeHealthReport r;
  auto add = [&r](const char* name, double figure, const char* unit) {
    v1::HealthCheck* c = r.add_checks();
    c->set_name(name);
    c->set_passed(true);
    c->set_figure(figure);
    c->set_unit(unit);
    c->set_seconds(0.05);
  };
  const double jitter = 1.0 + 0.01 * static_cast<double>(k % 11 - 5);
  add("memcpy", 12.0 * jitter, "GB/s");
  add("shm", 0, "");
  add("root", 0.002 * jitter, "s");
  v1::HealthCheck* shared = r.add_checks();
  shared->set_name("shared_root");
  shared->set_skipped(true);
  shared->set_passed(true);
  shared->set_reason("no --shared-root");
  add("cuda", 50.0 * jitter, "GB/s");
  return r;
}

std::string NodeId(int g, int nodes) {
  if (g == nodes) return "spare";
  char id[32];
  std::snprintf(id, sizeof id, "n%05d", g);
  return id;
}

// One simulator process's share of the nodes: [first, first + count) of
// the cluster (index `nodes` is the spare). Each node does what the node
// agent does, with its own messages: RegisterNode (again after a fence),
// one heartbeat at a time at the interval the coordinator tells, carrying
// its ranks' progress and its order acknowledgements, and per step one
// ReportShards call with all its ranks STAGED, then one DURABLE, honouring
// the coordinator's retry-after. Cheap per node: callback stubs (no thread
// per node or call), a node's heartbeat request built once and changed
// only when its epoch, ranks or acknowledgements change, its call state
// reused, a lock per node, lock-free counters. Heartbeats have timer
// threads of their own, apart from reports and registrations (as the
// agent's heartbeat thread is apart from its reports), and run them at a
// higher priority within the simulator (nice -10 where permitted): a
// step's burst of report calls does not make heartbeats late.
class NodeSim {
 public:
  NodeSim(const Args& a)
      : a_(a),
        relayed_(a.relay_nodes > 0),
        nodes_(new Node[a.count]),
        rng_(42 + a.first) {
    const int channels = std::max(1, a.channels);
    for (int c = 0; c < channels; ++c) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL,
                  1);  // one connection per channel
      args.SetInt("ckpt.bench_channel", c);
      stubs_.push_back(v1::Coordinator::NewStub(
          grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(a.port),
                                    grpc::InsecureChannelCredentials(), args)));
    }
    for (int k = 0; k < a.count; ++k) {
      const int g = a.first + k;
      nodes_[k].id = NodeId(g, a.nodes);
      nodes_[k].spare = g == a.nodes;
    }
    if (relayed_) {
      // One connection per relay, apart from the nodes' own (which only
      // register: that stays direct, per node).
      for (int r = 0; r < (a.count + a.relay_nodes - 1) / a.relay_nodes; ++r) {
        grpc::ChannelArguments args;
        args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
        args.SetInt("ckpt.bench_relay", r);
        relays_.push_back(std::make_unique<Relay>());
        relays_.back()->stub =
            v1::Coordinator::NewStub(grpc::CreateCustomChannel(
                "127.0.0.1:" + std::to_string(a.port),
                grpc::InsecureChannelCredentials(), args));
      }
    }
    for (int t = 0; t < kTimerThreads; ++t) {
      timers_.push_back(std::make_unique<Timers>());
      hb_timers_.push_back(std::make_unique<Timers>());
      // Linux: the calling thread's own nice value. Refused without the
      // privilege: the heartbeats then share the simulator's priority.
      hb_timers_.back()->At(0, [] { setpriority(PRIO_PROCESS, 0, -10); });
    }
  }

  // Registers every node; `done` runs once all are answered, with the
  // time the first was sent and the time the last was answered.
  void RegisterAll(std::function<void(double, double)> done) {
    done_ = std::move(done);
    left_ = a_.count;
    reg_first_sent_ = Now();
    for (int k = 0; k < a_.count; ++k) Register(k, true);
  }

  void SetGeneration(uint64_t gen0) { gen0_ = gen0; }

  void Kill(int g) {
    const int k = g - a_.first;
    if (k < 0 || k >= a_.count) return;
    std::lock_guard<std::mutex> lock(nodes_[k].mu);
    nodes_[k].dead = true;
  }

  void StartStep(uint64_t step) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      steps_[step];
    }
    std::uniform_real_distribution<double> jitter(0, 0.05);
    for (int k = 0; k < a_.count; ++k) {
      const double when = Now() + jitter(rng_);
      TimersFor(k).At(when, [this, k, step] { Report(k, step, false, 0); });
    }
  }

  // "count HEARTBEATS_OK RPCS REPORTS_OK CPU_S": for the parent's windows.
  std::string Count() const {
    char buf[160];
    std::snprintf(buf, sizeof buf, "count %llu %llu %llu %.3f",
                  static_cast<unsigned long long>(hb_ok_.load()),
                  static_cast<unsigned long long>(rpcs_.load()),
                  static_cast<unsigned long long>(reports_ok_.load()),
                  SelfCpuSeconds());
    return buf;
  }

  // Stops every node and waits for its calls; then the figures, one per
  // line ("r KEY VALUE", "step N LAST_DURABLE_SENT COMMITTED", "late ...",
  // "hblat ...", "orders ID...", "node0 LAST_OK_HEARTBEAT_SENT").
  std::string Stop() {
    stopping_ = true;
    for (auto& t : timers_) t->Stop();
    for (auto& t : hb_timers_) t->Stop();
    // What relays still gather goes now (their timers are stopped).
    for (size_t r = 0; r < relays_.size(); ++r) SendBatch(static_cast<int>(r));
    while (inflight_ > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::ostringstream out;
    auto r = [&](const char* key, auto v) {
      out << "r " << key << " " << v << "\n";
    };
    r("false_deaths", false_deaths_.load());
    r("refused_register", refused_register_.load());
    r("refused_heartbeat", refused_heartbeat_.load());
    r("refused_report", refused_.load());
    r("report_errors", report_errors_.load());
    r("hb_errors", hb_errors_.load());
    r("hb_timed_out", hb_timed_out_.load());
    r("sim_late_sends", sim_late_sends_.load());
    r("reregistrations", reregistered_calls_.load());
    r("told_hb_ms", told_hb_ms_.load());
    r("relay_batches", relay_batches_.load());
    r("relay_heartbeats", relay_heartbeats_.load());
    r("relay_reports", relay_reports_.load());
    r("relay_refused", relay_refused_.load());
    std::lock_guard<std::mutex> lock(mu_);
    out.precision(17);
    for (const auto& [n, st] : steps_)
      out << "step " << n << " " << st.last_durable_send << " " << st.committed
          << "\n";
    out << "late " << late_.Encode() << "\n";
    out << "hblat " << hb_latency_.Encode() << "\n";
    out << "orders";
    for (uint64_t id : plan_orders_) out << " " << id;
    out << "\n";
    if (a_.first == 0) {
      std::lock_guard<std::mutex> l0(nodes_[0].mu);
      out << "node0 " << nodes_[0].last_hb_ok_sent << "\n";
    }
    return out.str();
  }

 private:
  static constexpr int kTimerThreads = 2;

  struct Node {
    std::mutex mu;
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
    // The one heartbeat in flight (the agent sends one at a time): the
    // request is rebuilt only when `hb_dirty`.
    bool hb_dirty = true;
    v1::HeartbeatRequest hb_req;
    v1::HeartbeatResponse hb_resp;
    std::optional<grpc::ClientContext> hb_ctx;
    v1::RegisterNodeRequest reg_req;
    v1::RegisterNodeResponse reg_resp;
    std::optional<grpc::ClientContext> reg_ctx;
    bool registering = false;
  };
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

  v1::Coordinator::Stub* StubFor(int k) {
    return stubs_[k % stubs_.size()].get();
  }
  Timers& TimersFor(int k) { return *timers_[k % timers_.size()]; }
  Timers& HeartbeatTimersFor(int k) {
    return *hb_timers_[k % hb_timers_.size()];
  }
  // As the node agent: the coordinator's interval once told, else ours.
  double HeartbeatSLocked(const Node& n) const {
    return (n.hb_ms > 0 ? n.hb_ms : a_.heartbeat_ms) / 1000.0;
  }

  // `initial`: one of the first registrations (counted in `left_`), else
  // one after a fence. One registration per node at a time.
  void Register(int k, bool initial) {
    if (stopping_) return;
    Node& n = nodes_[k];
    {
      std::lock_guard<std::mutex> lock(n.mu);
      if (n.registering) return;
      n.registering = true;
      n.reg_req.set_node_id(n.id);
      n.reg_req.set_address(n.id + ":29500");
      n.reg_req.set_capacity(static_cast<uint32_t>(a_.ranks_per_node));
      n.reg_req.set_spare(n.spare);
      if (!n.reg_req.has_health_report())
        *n.reg_req.mutable_health_report() = HealthReportOf(k);
      n.reg_ctx.emplace();
    }
    ++inflight_;
    StubFor(k)->async()->RegisterNode(
        &*n.reg_ctx, &n.reg_req, &n.reg_resp,
        [this, k, initial](grpc::Status s) {
          Node& n = nodes_[k];
          bool first = false, last = false;
          double retry = -1;
          {
            std::lock_guard<std::mutex> lock(n.mu);
            n.registering = false;
            if (s.ok()) {
              n.epoch = n.reg_resp.epoch();
              n.hb_ms = static_cast<int>(n.reg_resp.heartbeat_interval_ms());
              n.hb_dirty = true;
              first = !std::exchange(n.beating, true);
              if (initial) last = --left_ == 0;
            } else {
              // As the node agent does: the coordinator's retry-after,
              // else its registration interval with jitter.
              if (Retryable(s)) ++refused_register_;
              retry = RetryAfter(*n.reg_ctx);
              if (retry < 0) retry = 0.25 * (0.5 + (k % 100) / 100.0);
            }
          }
          if (last && done_) done_(reg_first_sent_, Now());
          // The first heartbeat at once, from the answer on, as the agent
          // does (a fenced node's heartbeats go on from where they were).
          const double now = Now();
          if (first)
            HeartbeatTimersFor(k).At(now,
                                     [this, k, now] { Heartbeat(k, now); });
          if (retry >= 0)
            TimersFor(k).At(now + retry,
                            [this, k, initial] { Register(k, initial); });
          --inflight_;
        });
  }

  void BuildHeartbeatLocked(Node& n) {
    n.hb_req.Clear();
    n.hb_req.set_node_id(n.id);
    n.hb_req.set_epoch(n.epoch);
    *n.hb_req.mutable_acked_order_ids() = {n.acks.begin(), n.acks.end()};
    // As the agent: every hosted rank's progress (its beacon), so each
    // heartbeat carries the per-rank items a real one does.
    for (uint32_t r : n.ranks) {
      v1::RankProgress* p = n.hb_req.add_progress();
      p->set_job(kJob);
      p->set_rank(r);
      p->set_has_step(true);
      p->set_step(1);
      p->set_ms_since_advance(100);
      p->set_step_ms_p50(1000);
      p->set_step_ms_p99(1100);
      p->set_step_samples(8);
    }
    n.hb_dirty = false;
  }

  // `due`: when the node's schedule says this heartbeat goes (its last
  // one's send + the interval, or that one's answer if later).
  void Heartbeat(int k, double due) {
    if (stopping_) return;
    Node& n = nodes_[k];
    v1::HeartbeatRequest relayed;  // the node's own message, for its relay
    {
      std::lock_guard<std::mutex> lock(n.mu);
      if (n.dead) return;
      if (n.epoch == 0) {  // not registered yet
        const double next = Now() + HeartbeatSLocked(n);
        HeartbeatTimersFor(k).At(next, [this, k, next] { Heartbeat(k, next); });
        return;
      }
      // How late the simulator itself sends.
      const double late = Now() - due;
      late_.Add(late);
      if (late > a_.timeout_ms / 2000.0) ++sim_late_sends_;
      if (n.hb_dirty) BuildHeartbeatLocked(n);
      if (relayed_)
        relayed = n.hb_req;
      else {
        n.hb_ctx.emplace();
        n.hb_ctx->set_deadline(std::chrono::system_clock::now() +
                               std::chrono::milliseconds(a_.timeout_ms));
      }
    }
    const double sent = Now();
    ++inflight_;
    ++rpcs_;
    if (relayed_) {
      RelayItem item;
      item.k = k;
      item.sent = sent;
      Gather(k, std::move(relayed), nullptr, std::move(item));
      return;
    }
    StubFor(k)->async()->Heartbeat(&*n.hb_ctx, &n.hb_req, &n.hb_resp,
                                   [this, k, sent](grpc::Status s) {
                                     HeartbeatDone(k, sent, s);
                                     --inflight_;
                                   });
  }

  // A heartbeat's answer (in n.hb_resp when OK), direct or through the
  // node's relay: handled as the agent does.
  void HeartbeatDone(int k, double sent, const grpc::Status& s) {
    Node& n = nodes_[k];
    const double answered = Now();
    bool fenced = false, again = false;
    double interval = 0;
    if (s.ok() || Retryable(s)) hb_latency_.Add(answered - sent);
    if (!s.ok()) ++hb_errors_;
    if (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED)
      ++refused_heartbeat_;
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
        s.error_code() == grpc::StatusCode::UNAVAILABLE)
      ++hb_timed_out_;
    {
      std::lock_guard<std::mutex> lock(n.mu);
      if (s.ok()) {
        n.last_hb_ok_sent = sent;
        ++hb_ok_;
        const v1::HeartbeatResponse& resp = n.hb_resp;
        if (resp.heartbeat_interval_ms() > 0)
          n.hb_ms = static_cast<int>(resp.heartbeat_interval_ms());
        int told = told_hb_ms_.load();
        while (n.hb_ms > told &&
               !told_hb_ms_.compare_exchange_weak(told, n.hb_ms)) {
        }
        if (!n.acks.empty() && n.hb_req.acked_order_ids_size() > 0) {
          for (uint64_t id : n.hb_req.acked_order_ids()) std::erase(n.acks, id);
          n.hb_dirty = true;
        }
        std::vector<uint32_t> ranks;
        for (const auto& as : resp.assignments())
          if (as.job() == kJob)
            ranks.assign(as.ranks().begin(), as.ranks().end());
        if (ranks != n.ranks) {
          n.ranks = std::move(ranks);
          n.hb_dirty = true;
        }
        for (const auto& o : resp.orders()) {
          if (o.generation() > gen0_) {
            std::lock_guard<std::mutex> l(mu_);
            plan_orders_.insert(o.id());
          }
          if (n.seen.insert(o.id()).second) {
            n.acks.push_back(o.id());
            n.hb_dirty = true;
          }
        }
      } else if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION &&
                 n.fenced_epoch != n.hb_req.epoch()) {
        n.fenced_epoch = n.hb_req.epoch();
        fenced = true;
        if (!n.dead) ++false_deaths_;  // fenced while alive
      }
      again = fenced || s.ok() || Retryable(s) ||
              s.error_code() == grpc::StatusCode::FAILED_PRECONDITION;
      interval = HeartbeatSLocked(n);
    }
    if (fenced) {
      // As the node agent does: register again for a new epoch.
      ++reregistered_calls_;
      Register(k, false);
    }
    if (again) {
      const double due =
          fenced ? answered + interval : std::max(sent + interval, answered);
      HeartbeatTimersFor(k).At(due, [this, k, due] { Heartbeat(k, due); });
    }
  }

  void Report(int k, uint64_t step, bool durable, int attempt) {
    if (stopping_) return;
    auto* c = new Call<v1::ReportShardsRequest, v1::ReportShardsResponse>;
    {
      Node& n = nodes_[k];
      std::lock_guard<std::mutex> lock(n.mu);
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
    if (relayed_) {
      RelayItem item;
      item.k = k;
      item.sent = sent;
      item.step = step;
      item.durable = durable;
      item.attempt = attempt;
      Gather(k, {}, c, std::move(item));
      return;
    }
    StubFor(k)->async()->ReportShards(
        &c->ctx, &c->req, &c->resp,
        [this, c, k, step, durable, attempt, sent](grpc::Status s) {
          ReportDone(c, k, step, durable, attempt, sent, s, RetryAfter(c->ctx));
          --inflight_;
        });
  }

  // A report call's answer (in c->resp when OK; `retry_after` the
  // coordinator's, in seconds, or -1), direct or through the node's
  // relay; deletes c.
  void ReportDone(Call<v1::ReportShardsRequest, v1::ReportShardsResponse>* c,
                  int k, uint64_t step, bool durable, int attempt, double sent,
                  const grpc::Status& s, double retry_after) {
    if (Retryable(s)) {
      ++refused_;
      double backoff = std::min(2.0, 0.02 * (1 << std::min(attempt, 7)));
      backoff *= 0.5 + (k % 100) / 100.0;
      if (retry_after >= 0) backoff = retry_after;
      TimersFor(k).At(Now() + backoff, [this, k, step, durable, attempt] {
        Report(k, step, durable, attempt + 1);
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
      const double now = Now();
      {
        std::lock_guard<std::mutex> lock(mu_);
        StepStat& st = steps_[step];
        if (durable && ok > 0)
          st.last_durable_send = std::max(st.last_durable_send, sent);
        if (committed && st.committed < 0) st.committed = now;
      }
      if (!durable && ok > 0) {
        const double when =
            now + a_.persist_ms / 1000.0 * (0.8 + 0.4 * (k % 97) / 97.0);
        TimersFor(k).At(when, [this, k, step] { Report(k, step, true, 0); });
      }
    }
    delete c;
  }

  // Relays (--relay-nodes K): nodes k / K of this process share one; each
  // gathers its nodes' heartbeats and report calls for --relay-gather-ms
  // from the first, then sends them in one RelayBatch on its own
  // connection, and hands each node its own item's answer (the batch's
  // refusal, with its retry-after, when the whole batch was refused).
  struct RelayItem {
    int k = 0;
    double sent = 0;
    // A report call's (null for a heartbeat).
    Call<v1::ReportShardsRequest, v1::ReportShardsResponse>* call = nullptr;
    uint64_t step = 0;
    bool durable = false;
    int attempt = 0;
  };
  struct RelayBatchCall {
    grpc::ClientContext ctx;
    v1::RelayBatchRequest req;
    v1::RelayBatchResponse resp;
    std::vector<RelayItem> beats, reports;
  };
  struct Relay {
    std::mutex mu;
    std::unique_ptr<v1::Coordinator::Stub> stub;
    std::unique_ptr<RelayBatchCall> gathering;  // under mu
  };

  void Gather(int k, v1::HeartbeatRequest beat,
              Call<v1::ReportShardsRequest, v1::ReportShardsResponse>* report,
              RelayItem item) {
    const int r = k / a_.relay_nodes;
    Relay& relay = *relays_[r];
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(relay.mu);
      if (!relay.gathering) {
        relay.gathering = std::make_unique<RelayBatchCall>();
        relay.gathering->req.set_relay_id("sim-" + std::to_string(a_.first) +
                                          "-" + std::to_string(r));
        first = true;
      }
      RelayBatchCall& b = *relay.gathering;
      if (report) {
        item.call = report;
        *b.req.add_reports() = report->req;
        b.reports.push_back(item);
      } else {
        *b.req.add_heartbeats() = std::move(beat);
        b.beats.push_back(item);
      }
    }
    if (first)
      HeartbeatTimersFor(r).At(Now() + a_.relay_gather_ms / 1000.0,
                               [this, r] { SendBatch(r); });
  }

  void SendBatch(int r) {
    Relay& relay = *relays_[r];
    std::unique_ptr<RelayBatchCall> b;
    {
      std::lock_guard<std::mutex> lock(relay.mu);
      b = std::move(relay.gathering);
    }
    if (!b) return;
    ++relay_batches_;
    relay_heartbeats_ += b->beats.size();
    relay_reports_ += b->reports.size();
    b->ctx.set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(a_.timeout_ms));
    RelayBatchCall* call = b.release();
    relay.stub->async()->RelayBatch(
        &call->ctx, &call->req, &call->resp, [this, call](grpc::Status s) {
          std::unique_ptr<RelayBatchCall> done(call);
          const double batch_retry = s.ok() ? -1 : RetryAfter(call->ctx);
          if (s.ok() && (call->resp.heartbeats_size() !=
                             static_cast<int>(call->beats.size()) ||
                         call->resp.reports_size() !=
                             static_cast<int>(call->reports.size())))
            s = grpc::Status(grpc::StatusCode::INTERNAL,
                             "relay: answers do not match the items");
          if (!s.ok()) ++relay_refused_;
          auto item_status = [&](const v1::RelayedStatus& st, double* retry) {
            *retry =
                st.retry_after_ms() > 0 ? st.retry_after_ms() / 1000.0 : -1;
            return grpc::Status(static_cast<grpc::StatusCode>(st.code()),
                                st.message());
          };
          for (size_t i = 0; i < call->beats.size(); ++i) {
            const RelayItem& it = call->beats[i];
            grpc::Status is = s;
            if (s.ok()) {
              double unused = -1;
              const v1::RelayedHeartbeat& h = call->resp.heartbeats(i);
              is = item_status(h.status(), &unused);
              if (is.ok()) {
                Node& n = nodes_[it.k];
                std::lock_guard<std::mutex> lock(n.mu);
                n.hb_resp = h.response();
              }
            }
            HeartbeatDone(it.k, it.sent, is);
            --inflight_;
          }
          for (size_t i = 0; i < call->reports.size(); ++i) {
            const RelayItem& it = call->reports[i];
            grpc::Status is = s;
            double retry = batch_retry;
            if (s.ok()) {
              const v1::RelayedReports& rr = call->resp.reports(i);
              is = item_status(rr.status(), &retry);
              if (is.ok()) it.call->resp = rr.response();
            }
            ReportDone(it.call, it.k, it.step, it.durable, it.attempt, it.sent,
                       is, retry);
            --inflight_;
          }
        });
  }

  const Args a_;
  const bool relayed_;  // heartbeats and reports through relays
  std::vector<std::unique_ptr<Relay>> relays_;
  std::unique_ptr<Node[]> nodes_;
  std::mt19937 rng_;  // StartStep's, on the command thread
  std::vector<std::unique_ptr<v1::Coordinator::Stub>> stubs_;
  std::vector<std::unique_ptr<Timers>> timers_;     // reports, registrations
  std::vector<std::unique_ptr<Timers>> hb_timers_;  // heartbeats
  std::function<void(double, double)> done_;
  std::atomic<int> left_{0};
  double reg_first_sent_ = 0;
  std::atomic<uint64_t> gen0_{0};
  std::mutex mu_;  // steps_, plan_orders_
  std::map<uint64_t, StepStat> steps_;
  std::set<uint64_t> plan_orders_;
  Histogram late_, hb_latency_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> inflight_{0};
  std::atomic<int> told_hb_ms_{0};
  std::atomic<uint64_t> hb_ok_{0}, reports_ok_{0}, rpcs_{0}, refused_{0},
      report_errors_{0}, hb_errors_{0}, hb_timed_out_{0}, sim_late_sends_{0};
  std::atomic<int> false_deaths_{0}, reregistered_calls_{0};
  std::atomic<uint64_t> refused_register_{0}, refused_heartbeat_{0};
  std::atomic<uint64_t> relay_batches_{0}, relay_heartbeats_{0},
      relay_reports_{0}, relay_refused_{0};
};

// A simulator child as the parent sees it: its pid and the two ends of
// its pipes.
struct Child {
  pid_t pid = -1;
  int to = -1, from = -1;
  std::string buf;
  bool eof = false;
  int first = 0, count = 0;

  bool Send(const std::string& line) {
    std::string s = line + "\n";
    const char* p = s.data();
    size_t left = s.size();
    while (left > 0) {
      ssize_t w = write(to, p, left);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      p += w;
      left -= static_cast<size_t>(w);
    }
    return true;
  }
  // The next line, waiting until `deadline` (Now()); false at the
  // deadline or when the child is gone.
  bool ReadLine(std::string* line, double deadline) {
    for (;;) {
      size_t nl = buf.find('\n');
      if (nl != std::string::npos) {
        *line = buf.substr(0, nl);
        buf.erase(0, nl + 1);
        return true;
      }
      if (eof) return false;
      const double wait = deadline - Now();
      if (wait <= 0) return false;
      struct pollfd p = {from, POLLIN, 0};
      int n = poll(&p, 1, static_cast<int>(std::min(wait, 1.0) * 1000) + 1);
      if (n < 0 && errno != EINTR) return false;
      if (n <= 0) continue;
      char chunk[65536];
      ssize_t got = read(from, chunk, sizeof chunk);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        eof = true;
        continue;
      }
      buf.append(chunk, static_cast<size_t>(got));
    }
  }
  void Reap() {
    if (to >= 0) close(to);
    if (from >= 0) close(from);
    to = from = -1;
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    pid = -1;
  }
};

// Starts `a.processes` children of this binary, each a contiguous share of
// the nodes + the spare (index nodes). They stay in the bench's session
// while the coordinator has one of its own (RunOnce): with the kernel's
// autogroup the simulators together get the coordinator's CPU share, not
// one each (with a session each, four simulators had four shares to the
// coordinator's one on a loaded machine).
bool SpawnChildren(const Args& a, int port, std::vector<Child>* kids) {
  const int total = a.nodes + 1;
  const int p = std::max(1, std::min(a.processes, total));
  const int channels = std::max(1, (a.channels + p - 1) / p);
  for (int c = 0; c < p; ++c) {
    Child k;
    k.first = total * c / p;
    k.count = total * (c + 1) / p - k.first;
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0) return false;
    if (pipe2(out, O_CLOEXEC) != 0) return false;
    std::vector<std::string> args = {"coord_scale_bench",
                                     "--child",
                                     "--port",
                                     std::to_string(port),
                                     "--nodes",
                                     std::to_string(a.nodes),
                                     "--first",
                                     std::to_string(k.first),
                                     "--count",
                                     std::to_string(k.count),
                                     "--ranks-per-node",
                                     std::to_string(a.ranks_per_node),
                                     "--heartbeat-ms",
                                     std::to_string(a.heartbeat_ms),
                                     "--timeout-ms",
                                     std::to_string(a.timeout_ms),
                                     "--persist-ms",
                                     std::to_string(a.persist_ms),
                                     "--channels",
                                     std::to_string(channels),
                                     "--relay-nodes",
                                     std::to_string(a.relay_nodes),
                                     "--relay-gather-ms",
                                     std::to_string(a.relay_gather_ms)};
    std::vector<char*> argv;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    k.pid = fork();
    if (k.pid < 0) return false;
    if (k.pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the bench
      dup2(in[0], 0);
      dup2(out[1], 1);
      execv("/proc/self/exe", argv.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    k.to = in[1];
    k.from = out[0];
    kids->push_back(std::move(k));
  }
  return true;
}

struct Counts {
  uint64_t hb_ok = 0, rpcs = 0, reports_ok = 0;
  double cpu = 0;
};

// Sends "count" to every child and adds up the answers.
bool Query(std::vector<Child>& kids, Counts* c) {
  *c = {};
  for (auto& k : kids)
    if (!k.Send("count")) return false;
  for (auto& k : kids) {
    std::string line;
    if (!k.ReadLine(&line, Now() + 30)) return false;
    unsigned long long hb = 0, rpcs = 0, rep = 0;
    double cpu = 0;
    if (std::sscanf(line.c_str(), "count %llu %llu %llu %lf", &hb, &rpcs, &rep,
                    &cpu) != 4)
      return false;
    c->hb_ok += hb;
    c->rpcs += rpcs;
    c->reports_ok += rep;
    c->cpu += cpu;
  }
  return true;
}

// What the children measured, added up.
struct Merged {
  std::map<std::string, uint64_t> sums;
  int told_hb_ms = 0;
  std::map<uint64_t, std::pair<double, double>> steps;  // last durable, commit
  Histogram late, hblat;
  std::set<uint64_t> orders;
  double node0_last_ok = 0;
};

// Sends "stop" to every child and reads its figures up to "end".
bool StopAndMerge(std::vector<Child>& kids, Merged* m) {
  for (auto& k : kids) k.Send("stop");
  bool ok = true;
  for (auto& k : kids) {
    std::string line;
    bool ended = false;
    while (k.ReadLine(&line, Now() + 60)) {
      if (line == "end") {
        ended = true;
        break;
      }
      std::istringstream in(line);
      std::string kind;
      in >> kind;
      if (kind == "r") {
        std::string key;
        uint64_t v = 0;
        in >> key >> v;
        if (key == "told_hb_ms")
          m->told_hb_ms = std::max(m->told_hb_ms, static_cast<int>(v));
        else
          m->sums[key] += v;
      } else if (kind == "step") {
        uint64_t n = 0;
        double last = 0, committed = -1;
        in >> n >> last >> committed;
        auto it = m->steps.try_emplace(n, 0.0, -1.0).first;
        it->second.first = std::max(it->second.first, last);
        if (committed > 0 &&
            (it->second.second < 0 || committed < it->second.second))
          it->second.second = committed;
      } else if (kind == "late" || kind == "hblat") {
        std::string rest;
        std::getline(in, rest);
        ok = (kind == "late" ? m->late : m->hblat).Merge(rest) && ok;
      } else if (kind == "orders") {
        uint64_t id;
        while (in >> id) m->orders.insert(id);
      } else if (kind == "node0") {
        in >> m->node0_last_ok;
      }
    }
    if (!ended) {
      std::fprintf(stderr,
                   "coord_scale_bench: simulator %d (nodes %d..%d) "
                   "gave no figures\n",
                   static_cast<int>(k.pid), k.first, k.first + k.count - 1);
      ok = false;
    }
    k.Reap();
  }
  return ok;
}

// Why the coordinator declared nodes dead (its reasons, by kind), so that
// a failed setup says why.
void SayWhyNodesDied(v1::Coordinator::Stub* stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::GetClusterRequest req;
  v1::GetClusterResponse resp;
  if (!stub->GetCluster(&ctx, req, &resp).ok()) return;
  std::map<std::string, int> reasons;
  for (const auto& n : resp.nodes()) {
    if (n.health() != v1::DEAD) continue;
    // "no heartbeat for 3012 ms": the kind, without the figure.
    const std::string& why = n.dead_reason();
    ++reasons[why.substr(0, why.find_first_of("0123456789"))];
  }
  for (const auto& [why, count] : reasons)
    std::fprintf(stderr, "coord_scale_bench: %d nodes dead: %s...\n", count,
                 why.c_str());
}

void SayMerged(const Merged& m) {
  auto get = [&](const char* k) {
    auto it = m.sums.find(k);
    return static_cast<unsigned long long>(it == m.sums.end() ? 0 : it->second);
  };
  std::fprintf(
      stderr,
      "coord_scale_bench: refused %llu registrations, %llu heartbeats (%llu "
      "more timed out or unreachable); %llu false deaths; heartbeat answers "
      "p50 %.2f s, p99 %.2f s, max %.2f s; the simulator sent heartbeats "
      "p99 %.3f s, max %.3f s late (%llu more than timeout/2)\n",
      get("refused_register"), get("refused_heartbeat"), get("hb_timed_out"),
      get("false_deaths"), m.hblat.Percentile(0.5), m.hblat.Percentile(0.99),
      m.hblat.Max(), m.late.Percentile(0.99), m.late.Max(),
      get("sim_late_sends"));
}

class Parent {
 public:
  Parent(const Args& a, pid_t coord, int port) : a_(a), coord_(coord) {
    stub_ = v1::Coordinator::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                            grpc::InsecureChannelCredentials()));
    watch_stub_ = v1::CoordinatorWatch::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                            grpc::InsecureChannelCredentials()));
  }

  bool Run(std::vector<Child>& kids, Result* r) {
    const double start = Now();
    const double cpu_start = ProcCpuSeconds(coord_);
    // Registration: every child says when its first RegisterNode went and
    // its last was answered.
    double first_sent = 1e300, last_answered = 0;
    int registered = 0;
    for (auto& k : kids) {
      std::string line;
      double f = 0, l = 0;
      if (!k.ReadLine(&line, start + 120) ||
          std::sscanf(line.c_str(), "registered %lf %lf", &f, &l) != 2)
        break;
      first_sent = std::min(first_sent, f);
      last_answered = std::max(last_answered, l);
      ++registered;
    }
    if (registered < static_cast<int>(kids.size())) {
      std::fprintf(stderr,
                   "coord_scale_bench: registration timed out after %.0f s: "
                   "%d of %zu simulators had every node registered\n",
                   Now() - start, registered, kids.size());
      Merged m;
      StopAndMerge(kids, &m);
      SayMerged(m);
      SayWhyNodesDied(stub_.get());
      return false;
    }
    const double registration_s = last_answered - first_sent;
    v1::RegisterJobRequest req;
    req.set_job(kJob);
    req.set_world_size(a_.nodes * a_.ranks_per_node);
    req.set_nproc_per_node(a_.ranks_per_node);
    v1::RegisterJobResponse resp;
    grpc::Status s;
    uint64_t refused_job = 0;
    for (auto until = Now() + 60;;) {  // an admin call may be shed too
      grpc::ClientContext ctx;
      s = stub_->RegisterJob(&ctx, req, &resp);
      if (!Retryable(s) || Now() > until) break;
      ++refused_job;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    if (!s.ok()) {
      std::fprintf(stderr, "coord_scale_bench: RegisterJob: %s\n",
                   s.error_message().c_str());
      Merged m;
      StopAndMerge(kids, &m);
      SayMerged(m);
      SayWhyNodesDied(stub_.get());
      return false;
    }
    gen0_ = resp.job().generation();
    for (auto& k : kids) k.Send("go " + std::to_string(gen0_));
    std::thread watcher([this] { Watch(); });

    std::this_thread::sleep_for(
        std::chrono::milliseconds(a_.heartbeat_ms * 2));  // assignments known
    // The quiet window: heartbeats only.
    Counts q0, c0, c1;
    const double tq = Now();
    const double cpuq = ProcCpuSeconds(coord_);
    bool counted = Query(kids, &q0);
    if (a_.quiet_s > 0)
      std::this_thread::sleep_for(std::chrono::duration<double>(a_.quiet_s));
    const double t0 = Now();
    const double cpu0 = ProcCpuSeconds(coord_);
    counted = Query(kids, &c0) && counted;
    r->load_before = LoadAvg();
    uint64_t step = 0;
    bool killed = false;
    const int owner0 = 0;  // node 0 is the first child's
    for (double next = t0; Now() < t0 + a_.duration_s;) {
      if (!killed && Now() >= t0 + a_.kill_at_s) {
        killed = true;
        kids[owner0].Send("kill 0");
      }
      if (Now() >= next) {
        step += 10;
        for (auto& k : kids) k.Send("step " + std::to_string(step));
        next += a_.interval_s;
      }
      if (killed && detect_event_ms_ < 0) PollEvents();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const double t1 = Now();
    const double cpu1 = ProcCpuSeconds(coord_);
    counted = Query(kids, &c1) && counted;
    r->load_after = LoadAvg();
    r->rss = ProcStatusKb(coord_, "VmRSS");
    r->rss_peak = ProcStatusKb(coord_, "VmHWM");
    if (detect_event_ms_ < 0) PollEvents();
    Merged m;
    const bool merged = StopAndMerge(kids, &m);
    watch_ctx_.TryCancel();
    watcher.join();
    if (!counted || !merged) {
      std::fprintf(stderr, "coord_scale_bench: a simulator failed\n");
      return false;
    }

    auto get = [&](const char* k) {
      auto it = m.sums.find(k);
      return it == m.sums.end() ? uint64_t{0} : it->second;
    };
    const double w = t1 - t0;
    r->processes = static_cast<int>(kids.size());
    r->sim_cpu_cores = (c1.cpu - c0.cpu) / w;
    r->bench_cpu_cores = r->sim_cpu_cores;
    r->cpu_cores = (cpu1 - cpu0) / w;
    r->nodes = a_.nodes;
    r->ranks = a_.nodes * a_.ranks_per_node;
    r->interval_s = a_.interval_s;
    r->duration_s = a_.duration_s;
    r->reports_per_s = (c1.reports_ok - c0.reports_ok) / w;
    r->rpcs_per_s = static_cast<double>(c1.rpcs - c0.rpcs) / w;
    r->heartbeats_per_s = static_cast<double>(c1.hb_ok - c0.hb_ok) / w;
    r->refused = get("refused_report");
    r->report_errors = get("report_errors");
    r->false_deaths = static_cast<int>(get("false_deaths"));
    r->refused_register = get("refused_register");
    r->refused_heartbeat = get("refused_heartbeat");
    r->hb_timed_out = get("hb_timed_out");
    r->hb_errors = get("hb_errors");
    r->sim_late_sends = get("sim_late_sends");
    r->sim_late_max_s = m.late.Max();
    r->sim_late_p99_s = m.late.Percentile(0.99);
    r->sim_heartbeats = m.late.Count();
    r->refused_job = refused_job;
    r->told_heartbeat_ms = m.told_hb_ms;
    r->reregistrations = static_cast<int>(get("reregistrations"));
    r->relay_nodes = a_.relay_nodes;
    r->relay_gather_ms = a_.relay_gather_ms;
    r->relay_batches = get("relay_batches");
    r->relay_heartbeats = get("relay_heartbeats");
    r->relay_reports = get("relay_reports");
    r->relay_refused = get("relay_refused");
    r->registration_s = registration_s;
    r->cpu_total_s = cpu1 - cpu_start;
    r->wall_total_s = t1 - start;
    r->cpus = static_cast<int>(std::thread::hardware_concurrency());
    std::vector<double> lat;
    r->steps_started = static_cast<int>(m.steps.size());
    for (const auto& [n, st] : m.steps)
      if (st.second > 0) lat.push_back(std::max(0.0, st.second - st.first));
    r->steps_committed = static_cast<int>(lat.size());
    r->commit_p50 = Percentile(lat, 0.5);
    r->commit_p99 = Percentile(lat, 0.99);
    r->commit_max =
        lat.empty() ? -1 : *std::max_element(lat.begin(), lat.end());
    if (detect_event_ms_ >= 0)
      r->detect_s = detect_event_ms_ / 1000.0 - m.node0_last_ok;
    if (detect_event_ms_ >= 0 && plan_event_ms_ >= 0)
      r->plan_compute_s = (plan_event_ms_ - detect_event_ms_) / 1000.0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (detect_event_ms_ >= 0 && plan_seen_ > 0)
        r->plan_s = plan_seen_ - detect_event_ms_ / 1000.0;
    }
    r->plan_orders = static_cast<int>(m.orders.size());
    r->hb_p99 = m.hblat.Percentile(0.99);
    r->hb_max = m.hblat.Max();

    // CPU per call, and the model.
    const double heartbeats_run = static_cast<double>(c1.hb_ok - c0.hb_ok);
    const double report_calls =
        static_cast<double>(c1.rpcs - c0.rpcs) - heartbeats_run;
    r->report_calls_per_s = report_calls / w;
    r->quiet_s = t0 - tq;
    if (a_.quiet_s > 0 && c0.hb_ok > q0.hb_ok) {
      const double hb = static_cast<double>(c0.hb_ok - q0.hb_ok);
      r->quiet_heartbeats_per_s = hb / (t0 - tq);
      r->cpu_us_per_heartbeat = (cpu0 - cpuq) / hb * 1e6;
      if (report_calls > 0)
        r->cpu_us_per_report =
            std::max(0.0, (cpu1 - cpu0) -
                              heartbeats_run * r->cpu_us_per_heartbeat / 1e6) /
            report_calls * 1e6;
    }
    r->model_nodes = a_.model_nodes;
    r->model_interval_ms = static_cast<int>(coordinator::HeartbeatIntervalMs(
        a_.timeout_ms, static_cast<uint64_t>(a_.model_nodes),
        static_cast<uint64_t>(a_.interval_nodes)));
    if (r->cpu_us_per_heartbeat >= 0 && r->cpu_us_per_report >= 0)
      r->model_cores =
          (a_.model_nodes * 1000.0 / r->model_interval_ms) *
              r->cpu_us_per_heartbeat / 1e6 +
          (2.0 * a_.model_nodes / a_.interval_s) * r->cpu_us_per_report / 1e6;
    return true;
  }

 private:
  void PollEvents() {
    v1::EventsRequest req;
    req.set_job(kJob);
    req.set_after_seq(event_seq_);
    v1::EventsResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(5));
    if (!stub_->Events(&ctx, req, &resp).ok()) return;
    for (const auto& e : resp.events()) {
      event_seq_ = std::max(event_seq_, e.seq());
      if (e.kind() == v1::FAILURE_DETECTED &&
          e.node_id() == NodeId(0, a_.nodes) && detect_event_ms_ < 0)
        detect_event_ms_ = e.time_ms();
      if (e.kind() == v1::PLAN_MADE && detect_event_ms_ >= 0 &&
          plan_event_ms_ < 0)
        plan_event_ms_ = e.time_ms();
    }
  }

  void Watch() {
    v1::WatchJobRequest req;
    req.set_job(kJob);
    req.set_node_id(NodeId(1, a_.nodes));
    auto reader = watch_stub_->WatchJob(&watch_ctx_, req);
    v1::JobView v;
    while (reader->Read(&v)) {
      std::lock_guard<std::mutex> lock(mu_);
      if (v.generation() > gen0_ && plan_seen_ < 0) plan_seen_ = Now();
    }
    reader->Finish().ok();
  }

  const Args a_;
  const pid_t coord_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::unique_ptr<v1::CoordinatorWatch::Stub> watch_stub_;
  grpc::ClientContext watch_ctx_;
  std::mutex mu_;
  double plan_seen_ = -1;  // under mu_
  uint64_t gen0_ = 0;
  int64_t detect_event_ms_ = -1, plan_event_ms_ = -1;
  uint64_t event_seq_ = 0;
};

}  // namespace

int RunChild(const Args& a) {
  std::mutex out_mu;
  auto say = [&out_mu](const std::string& s) {
    std::lock_guard<std::mutex> lock(out_mu);
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
  };
  NodeSim sim(a);
  sim.RegisterAll([&say](double first, double last) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "registered %.6f %.6f\n", first, last);
    say(buf);
  });
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "go") {
      uint64_t gen = 0;
      in >> gen;
      sim.SetGeneration(gen);
    } else if (cmd == "step") {
      uint64_t step = 0;
      in >> step;
      sim.StartStep(step);
    } else if (cmd == "kill") {
      int g = -1;
      in >> g;
      sim.Kill(g);
    } else if (cmd == "count") {
      say(sim.Count() + "\n");
    } else if (cmd == "stop") {
      break;
    }
  }
  say(sim.Stop() + "end\n");
  return 0;
}

bool RunOnce(const Args& a, Result* r) {
  testing::TempDir dir;
  testing::CoordinatorProcess coord(dir.path() + "/state",
                                    dir.path() + "/shared", a.timeout_ms,
                                    /*port=*/0, a.binary,
                                    /*own_session=*/true);
  if (coord.port() <= 0) {
    std::fprintf(stderr, "coord_scale_bench: %s did not start\n",
                 a.binary.c_str());
    return false;
  }
  std::vector<Child> kids;
  if (!SpawnChildren(a, coord.port(), &kids)) {
    std::fprintf(stderr, "coord_scale_bench: cannot start the simulators: %s\n",
                 std::strerror(errno));
    for (auto& k : kids) k.Reap();
    return false;
  }
  Parent parent(a, coord.pid(), coord.port());
  const bool ok = parent.Run(kids, r);
  for (auto& k : kids) k.Reap();
  return ok;
}

}  // namespace ckpt::bench
