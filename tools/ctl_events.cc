// ckptctl events, and the event rendering `cluster` shares (ctl_coord.h).
#include <cstdio>

#include "coordinator/client/channel.h"
#include "coordinator/client/leader_channel.h"
#include "tools/ctl_commands.h"
#include "tools/ctl_coord.h"
#include "tools/json_writer.h"
#include "tools/text_output.h"
#include "util/validate.h"

namespace ckpt::tools {

namespace cv1 = ::ckpt::coord::v1;

absl::Status CheckCoordinator(const std::string& coordinator) {
  if (coordinator.empty())
    return absl::InvalidArgumentError(
        "--coordinator: not given (HOST:PORT of ckpt-coordinator)");
  return coordinator::ParseAddressList(coordinator, "--coordinator").status();
}

void WriteEvents(JsonWriter& w,
                 const google::protobuf::RepeatedPtrField<cv1::Event>& events) {
  w.BeginArray();
  for (const auto& e : events) {
    w.BeginObject()
        .Field("seq", static_cast<uint64_t>(e.seq()))
        .Field("time_ms", static_cast<int64_t>(e.time_ms()));
    w.Field("job", e.job())
        .Field("node_id", e.node_id())
        .Field("kind", cv1::EventKind_Name(e.kind()));
    w.Field("detail", e.detail());
    // The job's world size in the plan's generation (elastic jobs shrink).
    if (e.has_world_size()) w.Field("world_size", e.world_size());
    if (e.kind() == cv1::FALLBACK) {
      // The fields of the detail, for scripts.
      const cv1::Fallback& f = e.fallback();
      w.Key("fallback")
          .BeginObject()
          .Field("rank", f.rank())
          .Field("step", static_cast<uint64_t>(f.step()));
      w.Field("copy", f.copy()).Field("reason", f.reason()).Key("next_step");
      if (f.has_next_step())
        w.Uint(f.next_step());
      else
        w.Null();
      w.Field("next_copy", f.next_copy()).EndObject();
    }
    if (e.kind() == cv1::STRAGGLER) {
      const cv1::Straggler& st = e.straggler();
      w.Field("rank", st.rank())
          .Key("straggler")
          .BeginObject()
          .Field("time_ms", st.time_ms())
          .Field("median_ms", st.median_ms())
          .Field("windows", st.windows())
          .Field("compute", st.compute())
          .EndObject();
    }
    if (e.kind() == cv1::HANG_DETECTED) {
      // rank: the first rank named stuck; ranks: every one.
      const cv1::Hang& h = e.hang();
      w.Key("rank");
      if (h.ranks_size() > 0)
        w.Uint(h.ranks(0));
      else
        w.Null();
      w.Key("ranks").BeginArray();
      for (uint32_t r : h.ranks()) w.Uint(r);
      w.EndArray().Key("step");
      if (h.has_step())
        w.Uint(h.step());
      else
        w.Null();
      w.Field("timeout_s", h.timeout_s())
          .Field("silent_s", h.silent_s())
          .Field("first_step", h.first_step())
          .Field("pause_reason", h.pause_reason())
          .Field("generation", static_cast<uint64_t>(h.generation()))
          .Field("stacks", h.stacks());
    }
    if (e.kind() == cv1::RESTORE_SOURCES) {
      // Where each moved rank came from, and the steps lost
      // against storage alone.
      const cv1::RestoreSources& rs = e.restore();
      w.Key("restore")
          .BeginObject()
          .Field("generation", static_cast<uint64_t>(rs.generation()))
          .Key("step");
      if (rs.has_step())
        w.Uint(rs.step());
      else
        w.Null();
      w.Field("from_memory", rs.from_memory()).Key("newest_step");
      if (rs.has_newest_step())
        w.Uint(rs.newest_step());
      else
        w.Null();
      w.Key("durable_step");
      if (rs.has_durable_step())
        w.Uint(rs.durable_step());
      else
        w.Null();
      w.Field("steps_lost", static_cast<uint64_t>(rs.steps_lost()))
          .Field("steps_lost_durable",
                 static_cast<uint64_t>(rs.steps_lost_durable()))
          .Key("ranks")
          .BeginArray();
      for (const cv1::RankSource& r : rs.ranks())
        w.BeginObject()
            .Field("rank", r.rank())
            .Field("node_id", r.node_id())
            .Field("copy", r.copy())
            .EndObject();
      w.EndArray().EndObject();
    }
    if (e.kind() == cv1::HEALTH_FAILED)  // node_id, check, reason
      w.Field("check", e.health().check()).Field("reason", e.health().reason());
    if (e.kind() == cv1::CORDONED || e.kind() == cv1::UNCORDONED ||
        e.kind() == cv1::EVICTION_SKIPPED)  // node_id, reason
      w.Field("reason", e.cordon().reason()).Field("by", e.cordon().by());
    w.EndObject();
  }
  w.EndArray();
}

void PrintEvents(const google::protobuf::RepeatedPtrField<cv1::Event>& events) {
  Table t({"SEQ", "TIME_MS", "JOB", "NODE", "KIND", "DETAIL"});
  for (const auto& e : events)
    t.AddRow({std::to_string(e.seq()), std::to_string(e.time_ms()),
              e.job().empty() ? "-" : e.job(),
              e.node_id().empty() ? "-" : e.node_id(),
              cv1::EventKind_Name(e.kind()), e.detail()});
  if (t.empty()) {
    std::printf("no events\n");
    return;
  }
  t.Print(stdout);
}

absl::Status RunEvents(const std::string& coordinator,
                       const coordinator::TlsFiles& tls, const std::string& job,
                       uint64_t after_seq, bool json) {
  absl::Status s = CheckCoordinator(coordinator);
  if (s.ok() && !job.empty()) s = ValidateJobName(job, "--job");
  if (!s.ok()) return s;
  auto client = coordinator::CoordinatorClient::Create(coordinator, tls);
  if (!client.ok()) return client.status();
  cv1::EventsRequest req;
  req.set_job(job);
  req.set_after_seq(after_seq);
  cv1::EventsResponse resp;
  s = coordinator::CoordStatus(
      (*client)->Call(&cv1::Coordinator::Stub::Events, req, &resp, kRpcTimeout),
      "Events", (*client)->current());
  if (!s.ok()) return s;
  if (json) {
    JsonWriter w;
    w.BeginObject().Key("events");
    WriteEvents(w, resp.events());
    w.EndObject();
    std::printf("%s\n", w.str().c_str());
  } else {
    PrintEvents(resp.events());
  }
  return absl::OkStatus();
}

}  // namespace ckpt::tools
