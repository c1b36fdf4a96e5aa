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
  v1::RelayBatchResponse resp;
  if (absl::Status s = ValidateRelayBatch(req); !s.ok()) {
    // The server refused it before; a caller that did not gets every item
    // refused with the batch's reason, nothing applied.
    for (int i = 0; i < req.heartbeats_size(); ++i)
      SetStatus(s, resp.add_heartbeats()->mutable_status());
    for (int i = 0; i < req.reports_size(); ++i)
      SetStatus(s, resp.add_reports()->mutable_status());
    return resp;
  }

  // Heartbeats: one hold of the state lock for all of them. A node's
  // second heartbeat in the batch is refused (its agent sends one at a
  // time: a relay that repeats one is wrong).
  const int nh = req.heartbeats_size();
  std::vector<HeartbeatCall> beats(nh);
  std::vector<HeartbeatCall*> run;
  run.reserve(nh);
  std::unordered_map<std::string_view, int> first;
  for (int i = 0; i < nh; ++i) {
    beats[i].req = &req.heartbeats(i);
    const std::string& node = req.heartbeats(i).node_id();
    if (!ValidateNodeId(node).ok()) {  // refused by HeartbeatGroup
      run.push_back(&beats[i]);
      continue;
    }
    auto [at, inserted] = first.emplace(node, i);
    if (!inserted) {
      beats[i].out = absl::InvalidArgumentError(
          absl::StrCat("node_id: ", QuotePrefix(node),
                       " has a heartbeat in this batch already (heartbeats[",
                       at->second, "])"));
      continue;
    }
    run.push_back(&beats[i]);
  }
  uint64_t beats_seq = 0;
  if (!run.empty()) (void)HeartbeatGroup(run, /*try_lock=*/false, &beats_seq);

  // Reports: checked before the lock, then applied as direct groups are
  // (ApplyReportGroup), kReportsPerHold calls a hold; every hold's write
  // is waited for after the last one, so the batch waits about once.
  const int nr = req.reports_size();
  std::vector<ReportCall> reports(nr);
  std::vector<absl::Status> unchecked(nr);
  std::vector<ReportCall*> group;
  std::vector<std::function<void()>> finish;
  for (int i = 0; i < nr; ++i) {
    if (absl::Status s = PrepareReportCall(req.reports(i), &reports[i]);
        !s.ok()) {
      unchecked[i] = Indexed(s, "reports", i);
      continue;
    }
    group.push_back(&reports[i]);
    if (group.size() == kReportsPerHold) {
      finish.push_back(ApplyReportGroup(group));
      group.clear();
    }
  }
  if (!group.empty()) finish.push_back(ApplyReportGroup(group));
  const absl::Status beats_durable =
      beats_seq == 0 ? absl::OkStatus() : WaitDurable(beats_seq);
  for (std::function<void()>& f : finish)
    if (f) f();

  for (int i = 0; i < nh; ++i) {
    v1::RelayedHeartbeat* out = resp.add_heartbeats();
    const HeartbeatCall& c = beats[i];
    if (c.out.ok()) {
      out->mutable_status()->set_code(0);
      *out->mutable_response() = *c.out;
    } else if (!c.valid) {
      SetStatus(Indexed(c.out.status(), "heartbeats", i),
                out->mutable_status());
    } else {
      // Refused by the state (a fenced epoch): as the direct call, whose
      // answer waited for the changes it was built on.
      SetStatus(beats_durable.ok() ? c.out.status() : beats_durable,
                out->mutable_status());
    }
    HeartbeatAnswered(c.req->node_id(), c.req->epoch());
  }
  for (int i = 0; i < nr; ++i) {
    v1::RelayedReports* out = resp.add_reports();
    if (!unchecked[i].ok()) {
      SetStatus(unchecked[i], out->mutable_status());
    } else if (!reports[i].out.ok()) {
      SetStatus(reports[i].out.status(), out->mutable_status());
    } else {
      out->mutable_status()->set_code(0);
      *out->mutable_response() = std::move(*reports[i].out);
    }
  }
  return resp;
}

}  // namespace ckpt::coordinator
