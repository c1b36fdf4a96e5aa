// Coordinator: a relay's batch (RelayBatchRequest) of many nodes'
// heartbeats and ReportShards calls, each item answered as its direct call
// would have been (doc/coordinator-scale.md "Relays").
#include <string_view>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator.h"
#include "util/status.h"
#include "util/validate.h"

namespace ckpt::coordinator {
namespace {

// The report calls one hold of the state lock applies, as a direct
// group's (Coordinator::report_groups_): short enough for the heartbeats
// that wait for the lock.
constexpr size_t kReportsPerHold = 64;

// A refusal found before the lock, naming the item: "heartbeats[3]." +
// its message, which starts with the field ("node_id: ...").
absl::Status Indexed(const absl::Status& s, const char* list, int i) {
  return absl::Status(s.code(), absl::StrCat(list, "[", i, "].", s.message()));
}

void SetStatus(const absl::Status& s, v1::RelayedStatus* out) {
  out->set_code(static_cast<int32_t>(s.code()));
  out->set_message(std::string(s.message()));
}

}  // namespace

absl::Status Coordinator::ValidateRelayBatch(const v1::RelayBatchRequest& req) {
  CKPT_RETURN_IF_ERROR(
      ValidatePrintable(req.relay_id(), "relay_id", kMaxRelayIdBytes));
  if (req.heartbeats_size() > kMaxRelayHeartbeats)
    return absl::InvalidArgumentError(
        absl::StrCat("heartbeats: ", req.heartbeats_size(),
                     " items in one batch, more than ", kMaxRelayHeartbeats));
  if (req.reports_size() > kMaxRelayReports)
    return absl::InvalidArgumentError(
        absl::StrCat("reports: ", req.reports_size(),
                     " items in one batch, more than ", kMaxRelayReports));
  return absl::OkStatus();
}

void Coordinator::HearRelayBatch(const v1::RelayBatchRequest& req) {
  std::unordered_map<std::string_view, int> seen;
  for (const v1::HeartbeatRequest& h : req.heartbeats()) {
    if (!ValidateNodeId(h.node_id()).ok()) continue;
    if (!seen.emplace(h.node_id(), 0).second) continue;  // refused, unheard
    Heard(h.node_id(), h.epoch());
  }
}

void Coordinator::RelayBatchShed(const v1::RelayBatchRequest& req) {
  for (const v1::HeartbeatRequest& h : req.heartbeats()) {
    hearing_.NoteShed();
    HeartbeatAnswered(h.node_id(), h.epoch());
  }
}

v1::RelayBatchResponse Coordinator::RelayBatch(
    const v1::RelayBatchRequest& req) {
  bool waits = false;
  v1::RelayBatchResponse resp;
  ApplyRelayBatch(req, &waits)(&resp);
  return resp;
}

std::function<void(v1::RelayBatchResponse*)> Coordinator::ApplyRelayBatch(
    const v1::RelayBatchRequest& req, bool* waits) {
  *waits = false;
  if (absl::Status s = ValidateRelayBatch(req); !s.ok()) {
    // The server refused it before; a caller that did not gets every item
    // refused with the batch's reason, nothing applied.
    return [s, &req](v1::RelayBatchResponse* resp) {
      for (int i = 0; i < req.heartbeats_size(); ++i)
        SetStatus(s, resp->add_heartbeats()->mutable_status());
      for (int i = 0; i < req.reports_size(); ++i)
        SetStatus(s, resp->add_reports()->mutable_status());
    };
  }
  // What the finish needs; the report calls' addresses are held by the
  // groups until then.
  struct Work {
    std::vector<HeartbeatCall> beats;
    uint64_t beats_seq = 0;
    std::vector<ReportCall> reports;
    std::vector<absl::Status> unchecked;
    std::vector<std::function<void()>> finish;
  };
  auto w = std::make_shared<Work>();

  // Heartbeats: one hold of the state lock for all of them. A node's
  // second heartbeat in the batch is refused (its agent sends one at a
  // time: a relay that repeats one is wrong).
  const int nh = req.heartbeats_size();
  w->beats.resize(nh);
  std::vector<HeartbeatCall*> run;
  run.reserve(nh);
  std::unordered_map<std::string_view, int> first;
  first.reserve(static_cast<size_t>(nh));
  for (int i = 0; i < nh; ++i) {
    w->beats[i].req = &req.heartbeats(i);
    const std::string& node = req.heartbeats(i).node_id();
    if (!ValidateNodeId(node).ok()) {  // refused by HeartbeatGroup
      run.push_back(&w->beats[i]);
      continue;
    }
    auto [at, inserted] = first.emplace(node, i);
    if (!inserted) {
      w->beats[i].out = absl::InvalidArgumentError(
          absl::StrCat("node_id: ", QuotePrefix(node),
                       " has a heartbeat in this batch already (heartbeats[",
                       at->second, "])"));
      continue;
    }
    run.push_back(&w->beats[i]);
  }
  if (!run.empty())
    (void)HeartbeatGroup(run, /*try_lock=*/false, &w->beats_seq);

  // Reports: checked before the lock, then applied as direct groups are
  // (ApplyReportGroup), kReportsPerHold calls a hold; the finish waits for
  // every hold's write (in order: about one wait).
  const int nr = req.reports_size();
  w->reports.resize(nr);
  w->unchecked.resize(nr);
  std::vector<ReportCall*> group;
  for (int i = 0; i < nr; ++i) {
    if (absl::Status s = PrepareReportCall(req.reports(i), &w->reports[i]);
        !s.ok()) {
      w->unchecked[i] = Indexed(s, "reports", i);
      continue;
    }
    group.push_back(&w->reports[i]);
    if (group.size() == kReportsPerHold) {
      w->finish.push_back(ApplyReportGroup(group));
      group.clear();
    }
  }
  if (!group.empty()) w->finish.push_back(ApplyReportGroup(group));
  *waits = w->beats_seq != 0 || !w->finish.empty();

  return [this, w](v1::RelayBatchResponse* resp) {
    const absl::Status beats_durable =
        w->beats_seq == 0 ? absl::OkStatus() : WaitDurable(w->beats_seq);
    for (std::function<void()>& f : w->finish)
      if (f) f();
    resp->mutable_heartbeats()->Reserve(static_cast<int>(w->beats.size()));
    resp->mutable_reports()->Reserve(static_cast<int>(w->reports.size()));
    for (size_t i = 0; i < w->beats.size(); ++i) {
      v1::RelayedHeartbeat* out = resp->add_heartbeats();
      HeartbeatCall& c = w->beats[i];
      if (c.out.ok()) {
        out->mutable_status()->set_code(0);
        *out->mutable_response() = std::move(*c.out);
      } else if (!c.valid) {
        SetStatus(Indexed(c.out.status(), "heartbeats", static_cast<int>(i)),
                  out->mutable_status());
      } else {
        // Refused by the state (a fenced epoch): as the direct call, whose
        // answer waited for the changes it was built on.
        SetStatus(beats_durable.ok() ? c.out.status() : beats_durable,
                  out->mutable_status());
      }
      HeartbeatAnswered(c.req->node_id(), c.req->epoch());
    }
    for (size_t i = 0; i < w->reports.size(); ++i) {
      v1::RelayedReports* out = resp->add_reports();
      if (!w->unchecked[i].ok()) {
        SetStatus(w->unchecked[i], out->mutable_status());
      } else if (!w->reports[i].out.ok()) {
        SetStatus(w->reports[i].out.status(), out->mutable_status());
      } else {
        out->mutable_status()->set_code(0);
        *out->mutable_response() = std::move(*w->reports[i].out);
      }
    }
  };
}

}  // namespace ckpt::coordinator
