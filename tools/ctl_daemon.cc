// list, status and delete: the subcommands that ask a running ckptd.
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "ckpt.grpc.pb.h"
#include "tools/ctl_commands.h"
#include "tools/json_writer.h"
#include "tools/text_output.h"
#include "util/validate.h"

namespace ckpt::tools {
namespace {

absl::StatusOr<std::unique_ptr<v1::Ckptd::Stub>> Connect(
    const std::string& socket) {
  if (socket.empty())
    return absl::InvalidArgumentError(
        "--socket: not given and $CKPT_SOCKET is not set");
  struct stat st;
  if (stat(socket.c_str(), &st) != 0)
    return absl::UnavailableError(absl::StrCat(
        "--socket ", socket, ": no such socket (is ckptd running?)"));
  if (!S_ISSOCK(st.st_mode))
    return absl::InvalidArgumentError(
        absl::StrCat("--socket ", socket, ": not a Unix socket"));
  auto channel =
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
  return v1::Ckptd::NewStub(channel);
}

absl::Status FromGrpc(const grpc::Status& s, const std::string& socket,
                      const char* rpc) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(
      static_cast<absl::StatusCode>(s.error_code()),
      absl::StrCat(rpc, " via ", socket, ": ", s.error_message()));
}

void SetDeadline(grpc::ClientContext* ctx, int seconds) {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::seconds(seconds));
}

// "durable", "staged", ... (the enum value's name without its prefix).
std::string StateText(v1::ShardState state) {
  return absl::AsciiStrToLower(
      absl::StripPrefix(v1::ShardState_Name(state), "SHARD_STATE_"));
}

// "free", "writing(7)", "staged(7)+1r", ...
std::string SlotText(const v1::SlotStatus& slot) {
  std::string text = absl::AsciiStrToLower(
      absl::StripPrefix(v1::SlotState_Name(slot.state()), "SLOT_STATE_"));
  if (slot.state() != v1::SLOT_STATE_FREE)
    absl::StrAppend(&text, "(", slot.step(), ")");
  if (slot.readers()) absl::StrAppend(&text, "+", slot.readers(), "r");
  return text;
}

std::string Location(const v1::ShardInfo& sh) {
  const bool file = !sh.path().empty() && sh.state() == v1::SHARD_STATE_DURABLE;
  if (sh.in_memory() && file) return absl::StrCat("memory + ", sh.path());
  if (sh.in_memory()) return "memory";
  return file ? sh.path() : "-";
}

}  // namespace

absl::Status RunList(const std::string& socket, const std::string& job,
                     bool json) {
  if (!job.empty()) {
    absl::Status s = ValidateJobName(job, "--job");
    if (!s.ok()) return s;
  }
  auto stub = Connect(socket);
  if (!stub.ok()) return stub.status();
  v1::ListRequest req;
  req.set_job(job);
  v1::ListResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, 30);
  absl::Status s = FromGrpc((*stub)->List(&ctx, req, &resp), socket, "List");
  if (!s.ok()) return s;
  // The root makes shard paths usable outside the daemon; optional.
  std::string root;
  {
    v1::StatusResponse st;
    grpc::ClientContext sctx;
    SetDeadline(&sctx, 10);
    if ((*stub)->Status(&sctx, v1::StatusRequest(), &st).ok()) root = st.root();
  }
  auto full_path = [&](const std::string& p) {
    return p.empty() || root.empty() ? p : absl::StrCat(root, "/", p);
  };

  if (json) {
    JsonWriter w;
    w.BeginObject().Field("root", root).Key("jobs").BeginArray();
    for (const auto& j : resp.jobs()) {
      w.BeginObject()
          .Field("job", j.job())
          .Field("world_size", j.world_size())
          .Field("uid", j.uid());
      w.Key("steps").BeginArray();
      for (const auto& st : j.steps()) {
        uint64_t bytes = 0;
        for (const auto& sh : st.shards()) bytes += sh.bytes();
        w.BeginObject().Field("step", static_cast<uint64_t>(st.step()));
        w.Field("complete", st.complete())
            .Field("durable", st.durable())
            .Field("bytes", bytes);
        w.Field("ranks", static_cast<uint64_t>(st.shards_size()));
        w.Key("shards").BeginArray();
        for (const auto& sh : st.shards()) {
          w.BeginObject()
              .Field("rank", sh.rank())
              .Field("state", StateText(sh.state()));
          w.Field("bytes", static_cast<uint64_t>(sh.bytes()))
              .Field("in_memory", sh.in_memory());
          w.Field("durable", sh.state() == v1::SHARD_STATE_DURABLE);
          w.Field("path", sh.state() == v1::SHARD_STATE_DURABLE
                              ? full_path(sh.path())
                              : std::string());
          if (!sh.error().empty()) w.Field("error", sh.error());
          w.EndObject();
        }
        w.EndArray().EndObject();
      }
      w.EndArray().EndObject();
    }
    w.EndArray().EndObject();
    std::printf("%s\n", w.str().c_str());
    return absl::OkStatus();
  }

  Table t({"JOB", "STEP", "RANK", "STATE", "SIZE", "LOCATION", "COMPLETE",
           "DURABLE"});
  for (const auto& j : resp.jobs())
    for (const auto& st : j.steps())
      for (const auto& sh : st.shards()) {
        std::string state = StateText(sh.state());
        if (!sh.error().empty()) state += " (" + sh.error() + ")";
        t.AddRow({j.job(), std::to_string(st.step()),
                  absl::StrCat(sh.rank(), "/", j.world_size()), state,
                  FormatBytes(sh.bytes()), Location(sh),
                  st.complete() ? "yes" : "no", st.durable() ? "yes" : "no"});
      }
  if (t.empty()) {
    std::printf(job.empty() ? "no checkpoints\n" : "no checkpoints of job %s\n",
                job.c_str());
    return absl::OkStatus();
  }
  if (!root.empty()) std::printf("root: %s\n", root.c_str());
  t.Print(stdout);
  return absl::OkStatus();
}

absl::Status RunStatus(const std::string& socket, bool json) {
  auto stub = Connect(socket);
  if (!stub.ok()) return stub.status();
  v1::StatusResponse st;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, 10);
  absl::Status s = FromGrpc((*stub)->Status(&ctx, v1::StatusRequest(), &st),
                            socket, "Status");
  if (!s.ok()) return s;

  if (json) {
    JsonWriter w;
    w.BeginObject().Field("healthy", true).Field("version", st.version());
    w.Field("uptime_s", st.uptime_s())
        .Field("root", st.root())
        .Field("backend", st.backend());
    w.Field("bytes_in_flight", static_cast<uint64_t>(st.bytes_in_flight()));
    w.Field("persist_queue", st.persist_queue());
    w.Field("persisted_shards", static_cast<uint64_t>(st.persisted_shards()));
    w.Field("persisted_bytes", static_cast<uint64_t>(st.persisted_bytes()));
    w.Field("failed_persists", static_cast<uint64_t>(st.failed_persists()));
    if (!st.object_tier().empty()) {
      w.Key("object_tier").BeginObject().Field("backend", st.object_tier());
      w.Field("commit_tier", st.commit_tier());
      w.Field("backlog_steps", st.upload_backlog_steps());
      w.Field("backlog_shards", st.upload_backlog_shards());
      w.Field("backlog_bytes",
              static_cast<uint64_t>(st.upload_backlog_bytes()));
      w.Field("uploaded_shards", static_cast<uint64_t>(st.uploaded_shards()));
      w.Field("uploaded_bytes", static_cast<uint64_t>(st.uploaded_bytes()));
      w.Field("failed_uploads", static_cast<uint64_t>(st.failed_uploads()));
      w.Field("last_upload_error", st.last_upload_error()).EndObject();
    }
    w.Key("events").BeginArray();
    for (const v1::DaemonEvent& e : st.events()) {
      w.BeginObject().Field("kind", e.kind()).Field("job", e.job());
      w.Field("rank", e.rank())
          .Field("from_step", static_cast<uint64_t>(e.from_step()))
          .Field("to_step", static_cast<uint64_t>(e.to_step()));
      w.Key("dropped_steps").BeginArray();
      for (uint64_t n : e.dropped_steps()) w.Uint(n);
      w.EndArray().Field("unix_time_s", e.unix_time_s()).EndObject();
    }
    w.EndArray();
    w.Key("arenas").BeginArray();
    for (const auto& a : st.arenas()) {
      w.BeginObject()
          .Field("job", a.job())
          .Field("rank", a.rank())
          .Field("shm_name", a.shm_name());
      w.Field("arena_bytes", static_cast<uint64_t>(a.arena_bytes()))
          .Key("slots")
          .BeginArray();
      for (const auto& slot : a.slots()) w.String(SlotText(slot));
      w.EndArray().EndObject();
    }
    w.EndArray().EndObject();
    std::printf("%s\n", w.str().c_str());
    return absl::OkStatus();
  }

  std::printf("ckptd %s, up %s, storage %s, root %s\n", st.version().c_str(),
              FormatSeconds(st.uptime_s()).c_str(), st.backend().c_str(),
              st.root().c_str());
  std::printf(
      "in flight: %s in %u queued tasks; persisted: %llu shards, %s; failed "
      "persists: %llu\n",
      FormatBytes(st.bytes_in_flight()).c_str(), st.persist_queue(),
      static_cast<unsigned long long>(st.persisted_shards()),
      FormatBytes(st.persisted_bytes()).c_str(),
      static_cast<unsigned long long>(st.failed_persists()));
  if (!st.object_tier().empty()) {
    std::printf(
        "object tier %s (commit tier %s): backlog %u steps, %u shards, %s; "
        "uploaded: %llu shards, %s; failed uploads: %llu%s%s\n",
        st.object_tier().c_str(), st.commit_tier().c_str(),
        st.upload_backlog_steps(), st.upload_backlog_shards(),
        FormatBytes(st.upload_backlog_bytes()).c_str(),
        static_cast<unsigned long long>(st.uploaded_shards()),
        FormatBytes(st.uploaded_bytes()).c_str(),
        static_cast<unsigned long long>(st.failed_uploads()),
        st.last_upload_error().empty() ? "" : "; last error: ",
        st.last_upload_error().c_str());
  }
  for (const v1::DaemonEvent& e : st.events())
    std::printf("event %s: job %s rank %u from step %llu to %llu, dropped %s\n",
                e.kind().c_str(), e.job().c_str(), e.rank(),
                static_cast<unsigned long long>(e.from_step()),
                static_cast<unsigned long long>(e.to_step()),
                absl::StrJoin(e.dropped_steps(), ", ").c_str());
  if (st.arenas_size() == 0) {
    std::printf("no arenas\n");
    return absl::OkStatus();
  }
  Table t({"JOB", "RANK", "SHM", "SIZE", "SLOTS"});
  for (const auto& a : st.arenas())
    t.AddRow({a.job(), std::to_string(a.rank()), a.shm_name(),
              FormatBytes(a.arena_bytes()),
              absl::StrJoin(a.slots(), " ",
                            [](std::string* out, const v1::SlotStatus& s) {
                              out->append(SlotText(s));
                            })});
  t.Print(stdout);
  return absl::OkStatus();
}

absl::Status RunDelete(const std::string& socket, const std::string& job,
                       std::optional<uint64_t> step, bool all_steps,
                       bool json) {
  absl::Status s = ValidateJobName(job, "--job");
  if (!s.ok()) return s;
  auto stub = Connect(socket);
  if (!stub.ok()) return stub.status();
  v1::DeleteRequest req;
  req.set_job(job);
  req.set_all_steps(all_steps);
  if (step) req.set_step(*step);
  v1::DeleteResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, 60);
  s = FromGrpc((*stub)->Delete(&ctx, req, &resp), socket, "Delete");
  if (!s.ok()) return s;
  if (json) {
    JsonWriter w;
    w.BeginObject()
        .Field("job", job)
        .Field("deleted_steps", resp.deleted_steps())
        .EndObject();
    std::printf("%s\n", w.str().c_str());
  } else {
    std::printf("deleted %u step(s) of job %s\n", resp.deleted_steps(),
                job.c_str());
  }
  return absl::OkStatus();
}

}  // namespace ckpt::tools
