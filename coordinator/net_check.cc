#include "coordinator/net_check.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "util/status.h"
#include "util/validate.h"

namespace ckpt::coordinator {
namespace {

constexpr int kMaxNetResults = 16;
constexpr size_t kTokenChars = 32;

std::string NewToken() {
  static thread_local std::random_device rd;
  static const char kHex[] = "0123456789abcdef";
  std::string t;
  for (int i = 0; i < 4; ++i) {
    uint32_t v = rd();
    for (int j = 0; j < 8; ++j) t += kHex[(v >> (4 * j)) & 0xf];
  }
  return t;
}

bool IsToken(const std::string& t) {
  if (t.size() != kTokenChars) return false;
  for (char c : t)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace

absl::Status ValidateNetResults(const v1::HeartbeatRequest& req) {
  if (req.net_results_size() > kMaxNetResults)
    return absl::InvalidArgumentError(
        absl::StrCat("net_results: ", req.net_results_size(),
                     " results, at most ", kMaxNetResults));
  for (int i = 0; i < req.net_results_size(); ++i) {
    const v1::NetProbeResult& r = req.net_results(i);
    const std::string at = absl::StrCat("net_results[", i, "]");
    if (!IsToken(r.token()))
      return absl::InvalidArgumentError(
          absl::StrCat(at, ".token: not ", kTokenChars, " hex characters"));
    CKPT_RETURN_IF_ERROR(ValidatePrintable(r.error(), at + ".error", 512,
                                           /*allow_empty=*/true));
    if (!std::isfinite(r.mb_per_s()) || r.mb_per_s() < 0)
      return absl::InvalidArgumentError(absl::StrCat(
          at, ".mb_per_s: ", r.mb_per_s(), " is not a finite >= 0"));
  }
  return absl::OkStatus();
}

void PutNetworkCheck(const NetFigure& f, v1::NodeHealthReport* report) {
  auto checks = report->mutable_checks();
  checks->erase(std::remove_if(checks->begin(), checks->end(),
                               [](const v1::HealthCheck& c) {
                                 return c.name() == "network";
                               }),
                checks->end());
  v1::HealthCheck* c = report->add_checks();
  c->set_name("network");
  c->set_unit("MB/s");
  c->set_figure(f.mb_per_s);
  c->set_passed(f.mb_per_s > 0);
  c->set_reason(f.errors.substr(0, 512));
}

bool NetCheckPlanner::Heartbeat(const std::map<std::string, NetEndpoint>& nodes,
                                const v1::HeartbeatRequest& req, int64_t now_ms,
                                v1::HeartbeatResponse* resp) {
  SetNodes(nodes, now_ms);
  return Heartbeat(req, now_ms, resp);
}

bool NetCheckPlanner::Heartbeat(const v1::HeartbeatRequest& req, int64_t now_ms,
                                v1::HeartbeatResponse* resp) {
  bool finished = false;
  for (const v1::NetProbeResult& r : req.net_results())
    finished |= Record(req.node_id(), r, now_ms);
  finished |= ExpireLate(now_ms);
  for (v1::NetProbeOrder& o : OrdersFor(req.node_id(), now_ms))
    *resp->add_net_probes() = std::move(o);
  return finished;
}

void NetCheckPlanner::SetNodes(const std::map<std::string, NetEndpoint>& nodes,
                               int64_t now_ms) {
  if (nodes == nodes_) return;
  nodes_ = nodes;
  first_sample_.clear();
  ++round_;
  StartRound(now_ms);
}

void NetCheckPlanner::StartRound(int64_t now_ms) {
  probes_.clear();
  round_start_ms_ = now_ms;
  finished_ = nodes_.size() < 2;  // one node has nobody to probe
  std::vector<std::string> ids;
  for (const auto& [id, e] : nodes_) ids.push_back(id);
  if (ids.size() < 2) return;
  // A ring; with two nodes one probe says all a pair can say.
  const size_t n = ids.size() == 2 ? 1 : ids.size();
  for (size_t i = 0; i < n; ++i) {
    Probe p;
    p.sender = ids[i];
    p.receiver = ids[(i + 1) % ids.size()];
    p.token = NewToken();
    probes_.push_back(std::move(p));
  }
}

bool NetCheckPlanner::Record(const std::string& node,
                             const v1::NetProbeResult& result, int64_t now_ms) {
  for (Probe& p : probes_) {
    if (p.token != result.token() || p.sender != node || p.done) continue;
    p.done = true;
    p.mb_per_s = result.mb_per_s();
    p.error = result.error();
    return FinishIfDone(now_ms);
  }
  return false;
}

bool NetCheckPlanner::ExpireLate(int64_t now_ms) {
  if (finished_ || now_ms - round_start_ms_ < options_.order_ttl_ms)
    return false;
  for (Probe& p : probes_) {
    if (p.done) continue;
    p.done = true;
    p.error = absl::StrCat("probe ", p.sender, " -> ", p.receiver,
                           ": no result within ", options_.order_ttl_ms, " ms");
  }
  return FinishIfDone(now_ms);
}

bool NetCheckPlanner::FinishIfDone(int64_t now_ms) {
  if (finished_) return false;
  for (const Probe& p : probes_)
    if (!p.done) return false;
  std::map<std::string, NetFigure> figures;
  for (const Probe& p : probes_) {
    for (const std::string* id : {&p.sender, &p.receiver}) {
      NetFigure& f = figures[*id];
      f.mb_per_s = std::max(f.mb_per_s, p.error.empty() ? p.mb_per_s : 0.0);
      if (!p.error.empty())
        absl::StrAppend(&f.errors, f.errors.empty() ? "" : "; ", p.error);
    }
  }
  if (first_sample_.empty() && AnyLow(figures)) {
    first_sample_ = std::move(figures);
    StartRound(now_ms);
    return false;
  }
  for (auto& [id, first] : first_sample_) {
    NetFigure& f = figures[id];
    if (first.mb_per_s > f.mb_per_s) f = std::move(first);
  }
  first_sample_.clear();
  finished_ = true;
  figures_ = std::move(figures);
  return true;
}

bool NetCheckPlanner::AnyLow(
    const std::map<std::string, NetFigure>& figures) const {
  std::vector<double> v;
  for (const auto& [id, f] : figures)
    if (f.mb_per_s > 0) v.push_back(f.mb_per_s);
  if (v.size() < figures.size()) return true;  // a node's probes all failed
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  const double median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  return v.front() < options_.min_ratio * median;
}

std::vector<v1::NetProbeOrder> NetCheckPlanner::OrdersFor(
    const std::string& node, int64_t now_ms) {
  (void)now_ms;
  std::vector<v1::NetProbeOrder> out;
  if (finished_) return out;  // every probe is done: nothing to order
  for (Probe& p : probes_) {
    if (p.done) continue;
    v1::NetProbeOrder o;
    o.set_token(p.token);
    o.set_bytes(options_.bytes);
    o.set_timeout_ms(options_.timeout_ms);
    if (node == p.receiver) {
      // Heartbeats of a node come one after the other: told before this
      // one, it registered the token before sending this one.
      if (p.accept_told) p.accept_known = true;
      p.accept_told = true;
      o.set_peer_node(p.sender);
      o.set_send(false);
      out.push_back(std::move(o));
    } else if (node == p.sender && p.accept_known) {
      const NetEndpoint& to = nodes_.at(p.receiver);
      o.set_peer_node(p.receiver);
      o.set_peer_host(to.host);
      o.set_peer_port(to.port);
      o.set_send(true);
      out.push_back(std::move(o));
    }
  }
  return out;
}

}  // namespace ckpt::coordinator
