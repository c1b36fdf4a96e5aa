// cluster, rollback and stacks: subcommands that ask the coordinator.
#include "tools/ctl_coord.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/client/channel.h"
#include "coordinator/client/leader_channel.h"
#include "tools/ctl_commands.h"
#include "tools/json_writer.h"
#include "tools/text_output.h"
#include "util/validate.h"

namespace ckpt::tools {
namespace {

namespace cv1 = ::ckpt::coord::v1;

std::string HealthName(cv1::NodeHealth h) {
  return h == cv1::ALIVE ? "ALIVE" : h == cv1::DEAD ? "DEAD" : "UNSPECIFIED";
}

// The coordinator's view of what `job` restores from memory (peer
// replicas included).
const cv1::JobMemory* MemoryOf(const cv1::GetClusterResponse& c,
                               const std::string& job) {
  for (const cv1::JobMemory& m : c.memory())
    if (m.job() == job) return &m;
  return nullptr;
}

// "0-3:n1 4-7:n2": runs of consecutive ranks on one node.
std::string Placement(const cv1::JobRecord& j) {
  std::vector<std::string> runs;
  for (int r = 0; r < j.rank_node_size();) {
    int end = r;
    while (end + 1 < j.rank_node_size() &&
           j.rank_node(end + 1) == j.rank_node(r))
      ++end;
    runs.push_back(absl::StrCat(r, end > r ? absl::StrCat("-", end) : "", ":",
                                j.rank_node(r)));
    r = end + 1;
  }
  return runs.empty() ? "-" : absl::StrJoin(runs, " ");
}

// The stragglers the coordinator names on `node` now (its soft state).
std::vector<const cv1::StragglerMark*> StragglersOn(
    const cv1::GetClusterResponse& c, const std::string& node) {
  std::vector<const cv1::StragglerMark*> out;
  for (const cv1::StragglerMark& m : c.stragglers())
    if (m.node_id() == node) out.push_back(&m);
  return out;
}

// Why a node is marked: "cordoned (R)", "unhealthy (check:
// R)", "straggler (job J rank N)"; "-" when none.
std::string Marks(const cv1::GetClusterResponse& c, const cv1::NodeRecord& n) {
  std::vector<std::string> marks;
  if (n.cordoned()) marks.push_back("cordoned (" + n.cordon_reason() + ")");
  if (n.unhealthy())
    marks.push_back(absl::StrCat("unhealthy (", n.unhealthy_check(), ": ",
                                 n.unhealthy_reason(), ")"));
  for (const cv1::StragglerMark* m : StragglersOn(c, n.node_id()))
    marks.push_back(
        absl::StrCat("straggler (job ", m->job(), " rank ", m->rank(), ")"));
  return marks.empty() ? "-" : absl::StrJoin(marks, "; ");
}

void WriteCluster(const cv1::GetClusterResponse& c) {
  JsonWriter w;
  w.BeginObject().Key("nodes").BeginArray();
  for (const auto& n : c.nodes()) {
    w.BeginObject().Field("node_id", n.node_id()).Field("address", n.address());
    w.Field("health", HealthName(n.health()))
        .Field("epoch", static_cast<uint64_t>(n.epoch()));
    w.Field("spare", n.spare()).Field("capacity", n.capacity());
    w.Field("ms_since_heartbeat", static_cast<int64_t>(n.ms_since_heartbeat()));
    w.Field("dead_reason", n.dead_reason());
    // The marks: why the node takes no ranks, or is slow.
    w.Field("cordoned", n.cordoned()).Field("cordon_reason", n.cordon_reason());
    w.Field("unhealthy", n.unhealthy())
        .Field("unhealthy_check", n.unhealthy_check())
        .Field("unhealthy_reason", n.unhealthy_reason());
    w.Key("stragglers").BeginArray();
    for (const cv1::StragglerMark* m : StragglersOn(c, n.node_id()))
      w.BeginObject()
          .Field("job", m->job())
          .Field("rank", m->rank())
          .EndObject();
    // Replicas: its failure domain, its replica listener and
    // where its ranks' replicas go now ("" none).
    w.EndArray()
        .Field("domain", n.domain())
        .Field("replica_port", n.replica_port())
        .Field("replica_target", n.replica_target());
    w.EndObject();
  }
  w.EndArray().Key("jobs").BeginArray();
  for (const auto& j : c.jobs()) {
    w.BeginObject().Field("job", j.job()).Field("world_size", j.world_size());
    w.Key("rank_node").BeginArray();
    for (const auto& node : j.rank_node()) w.String(node);
    w.EndArray().Key("last_good_step");
    if (j.has_last_good())
      w.Uint(j.last_good_step());
    else
      w.Null();
    w.Key("manifest_steps").BeginArray();
    for (uint64_t st : j.manifest_steps()) w.Uint(st);
    w.EndArray().Field("generation", static_cast<uint64_t>(j.generation()));
    w.Field("plan_state", cv1::PlanState_Name(j.plan_state()))
        .Key("restore_step");
    if (j.has_restore_step())
      w.Uint(j.restore_step());
    else
      w.Null();
    w.Key("lost_ranks").BeginArray();
    for (uint32_t r : j.lost_ranks()) w.Uint(r);
    w.EndArray();
    // Plans since the last commit; PLAN_HELD: why (ckptctl resume).
    w.Field("plans_since_commit", j.plans_since_commit())
        .Field("held", j.plan_state() == cv1::PLAN_HELD)
        .Field("held_reason", j.held_reason());
    // Elastic continuation: the registered size (world_size is smaller
    // while the job runs shrunk), the least and the multiple (0: never
    // shrinks), and a restore at another world size: the saved rank per
    // rank.
    w.Field("full_world_size",
            j.full_world_size() != 0 ? j.full_world_size() : j.world_size())
        .Field("min_world_size", j.min_world_size())
        .Field("world_size_multiple", j.world_size_multiple())
        .Field("restore_world_size", j.restore_world_size());
    w.Key("restore_ranks").BeginArray();
    for (uint32_t r : j.restore_ranks()) w.Uint(r);
    w.EndArray();
    // Which write of the last good step's MANIFEST.global its commit
    // refers to (a leader's fence; null for a commit without a stamp).
    w.Key("last_good_manifest");
    auto stamp = j.has_last_good()
                     ? j.manifest_stamps().find(j.last_good_step())
                     : j.manifest_stamps().end();
    if (stamp == j.manifest_stamps().end()) {
      w.Null();
    } else {
      w.BeginObject().Field("generation",
                            static_cast<uint64_t>(stamp->second.generation()));
      w.Field("fence", static_cast<uint64_t>(stamp->second.fence()))
          .EndObject();
    }
    // The newest step every rank restores from memory (its
    // host's, or a live peer's replica), were a node lost now.
    const cv1::JobMemory* memory = MemoryOf(c, j.job());
    w.Key("memory_step");
    if (memory && memory->has_memory_step())
      w.Uint(memory->memory_step());
    else
      w.Null();
    w.Field("replicated_ranks", memory ? memory->replicated_ranks() : 0u);
    w.Key("replicated_step");
    if (memory && memory->has_replicated_step())
      w.Uint(memory->replicated_step());
    else
      w.Null();
    w.EndObject();
  }
  w.EndArray().Key("events");
  WriteEvents(w, c.recent_events());
  w.EndObject();
  std::printf("%s\n", w.str().c_str());
}

void PrintCluster(const cv1::GetClusterResponse& c) {
  Table nodes({"NODE", "ADDRESS", "HEALTH", "EPOCH", "SPARE", "CAPACITY",
               "HEARTBEAT", "DOMAIN", "REPLICAS_TO", "DEAD_REASON", "MARKS"});
  for (const auto& n : c.nodes())
    nodes.AddRow({n.node_id(), n.address().empty() ? "-" : n.address(),
                  HealthName(n.health()), std::to_string(n.epoch()),
                  n.spare() ? "yes" : "no", std::to_string(n.capacity()),
                  absl::StrCat(n.ms_since_heartbeat(), " ms ago"),
                  n.domain().empty() ? "-" : n.domain(),
                  n.replica_target().empty() ? "-" : n.replica_target(),
                  n.dead_reason().empty() ? "-" : n.dead_reason(),
                  Marks(c, n)});
  if (nodes.empty())
    std::printf("no nodes\n");
  else
    nodes.Print(stdout);
  std::printf("\n");
  Table jobs({"JOB", "WORLD", "GENERATION", "PLAN", "LAST_GOOD", "IN_MEMORY",
              "REPLICATED", "REPLICA_STEP", "RESTORE", "LOST", "MANIFESTS",
              "PLACEMENT"});
  for (const auto& j : c.jobs()) {
    const cv1::JobMemory* memory = MemoryOf(c, j.job());
    jobs.AddRow(
        {j.job(), std::to_string(j.world_size()),
         std::to_string(j.generation()), cv1::PlanState_Name(j.plan_state()),
         j.has_last_good() ? std::to_string(j.last_good_step()) : "-",
         memory && memory->has_memory_step()
             ? std::to_string(memory->memory_step())
             : "-",
         absl::StrCat(memory ? memory->replicated_ranks() : 0u, "/",
                      j.world_size()),
         memory && memory->has_replicated_step()
             ? std::to_string(memory->replicated_step())
             : "-",
         j.has_restore_step() ? std::to_string(j.restore_step()) : "-",
         j.lost_ranks().empty() ? "-" : absl::StrJoin(j.lost_ranks(), ","),
         j.manifest_steps().empty() ? "-"
                                    : absl::StrJoin(j.manifest_steps(), ","),
         Placement(j)});
  }
  if (jobs.empty())
    std::printf("no jobs\n");
  else
    jobs.Print(stdout);
  // A held job waits for an operator: why, and what to do.
  for (const auto& j : c.jobs())
    if (j.plan_state() == cv1::PLAN_HELD)
      std::printf("\njob %s is HELD: %s\n", j.job().c_str(),
                  j.held_reason().c_str());
  std::printf("\n");
  PrintEvents(c.recent_events());
}

}  // namespace

absl::Status RunCluster(const std::string& coordinator,
                        const coordinator::TlsFiles& tls, bool json) {
  absl::Status s = CheckCoordinator(coordinator);
  if (!s.ok()) return s;
  auto client = coordinator::CoordinatorClient::Create(coordinator, tls);
  if (!client.ok()) return client.status();
  cv1::GetClusterResponse resp;
  s = coordinator::CoordStatus(
      (*client)->Call(&cv1::Coordinator::Stub::GetCluster,
                      cv1::GetClusterRequest{}, &resp, kRpcTimeout),
      "GetCluster", (*client)->current());
  if (!s.ok()) return s;
  if (json)
    WriteCluster(resp);
  else
    PrintCluster(resp);
  return absl::OkStatus();
}

absl::Status RunResume(const std::string& coordinator,
                       const coordinator::TlsFiles& tls, const std::string& job,
                       bool json) {
  absl::Status s = CheckCoordinator(coordinator);
  if (s.ok()) s = ValidateJobName(job, "--job");
  if (!s.ok()) return s;
  auto client = coordinator::CoordinatorClient::Create(coordinator, tls);
  if (!client.ok()) return client.status();
  cv1::ResumeRequest req;
  req.set_job(job);
  cv1::ResumeResponse resp;
  s = coordinator::CoordStatus(
      (*client)->Call(&cv1::Coordinator::Stub::Resume, req, &resp, kRpcTimeout),
      "Resume", (*client)->current());
  if (!s.ok()) return s;
  if (json) {
    JsonWriter w;
    w.BeginObject().Field("job", job);
    w.Field("generation", static_cast<uint64_t>(resp.generation())).EndObject();
    std::printf("%s\n", w.str().c_str());
  } else {
    std::printf("job %s resumed: generation %llu plans again\n", job.c_str(),
                static_cast<unsigned long long>(resp.generation()));
  }
  return absl::OkStatus();
}

absl::Status RunRollback(const std::string& coordinator,
                         const coordinator::TlsFiles& tls,
                         const std::string& job, std::optional<uint64_t> step,
                         bool json) {
  absl::Status s = CheckCoordinator(coordinator);
  if (s.ok()) s = ValidateJobName(job, "--job");
  if (s.ok() && !step) s = absl::InvalidArgumentError("--step: not given");
  if (!s.ok()) return s;
  auto client = coordinator::CoordinatorClient::Create(coordinator, tls);
  if (!client.ok()) return client.status();
  cv1::RollbackRequest req;
  req.set_job(job);
  req.set_step(*step);
  cv1::RollbackResponse resp;
  s = coordinator::CoordStatus(
      (*client)->Call(&cv1::Coordinator::Stub::Rollback, req, &resp,
                      kRpcTimeout),
      "Rollback", (*client)->current());
  if (!s.ok()) return s;
  if (json) {
    JsonWriter w;
    w.BeginObject().Field("job", job).Field("step", *step);
    w.Field("generation", static_cast<uint64_t>(resp.generation())).EndObject();
    std::printf("%s\n", w.str().c_str());
  } else {
    std::printf("job %s rolls back to step %llu in generation %llu\n",
                job.c_str(), static_cast<unsigned long long>(*step),
                static_cast<unsigned long long>(resp.generation()));
  }
  return absl::OkStatus();
}

absl::Status RunStacks(const std::string& coordinator,
                       const coordinator::TlsFiles& tls, const std::string& job,
                       std::optional<uint64_t> generation, bool json) {
  absl::Status s = CheckCoordinator(coordinator);
  if (s.ok()) s = ValidateJobName(job, "--job");
  if (!s.ok()) return s;
  auto client = coordinator::CoordinatorClient::Create(coordinator, tls);
  if (!client.ok()) return client.status();
  cv1::GetStacksRequest req;
  req.set_job(job);
  if (generation) {
    req.set_has_generation(true);
    req.set_generation(*generation);
  }
  cv1::GetStacksResponse resp;
  s = coordinator::CoordStatus(
      (*client)->Call(&cv1::Coordinator::Stub::GetStacks, req, &resp,
                      kRpcTimeout),
      "GetStacks", (*client)->current());
  if (!s.ok()) return s;
  if (json) {
    JsonWriter w;
    w.BeginObject().Field("job", job).Key("generations").BeginArray();
    for (uint64_t g : resp.generations()) w.Uint(g);
    w.EndArray().Key("reports").BeginArray();
    for (const cv1::StackReport& r : resp.reports()) {
      w.BeginObject()
          .Field("node_id", r.node_id())
          .Field("generation", static_cast<uint64_t>(r.generation()))
          .Field("time_ms", static_cast<int64_t>(r.time_ms()))
          .Key("ranks")
          .BeginArray();
      for (const cv1::RankStacks& k : r.ranks())
        w.BeginObject()
            .Field("rank", k.rank())
            .Field("pid", k.pid())
            .Field("tool", k.tool())
            .Field("text", k.text())
            .EndObject();
      w.EndArray().EndObject();
    }
    w.EndArray().EndObject();
    std::printf("%s\n", w.str().c_str());
    return absl::OkStatus();
  }
  if (resp.reports_size() == 0) {
    std::printf("no stacks kept for job %s\n", job.c_str());
    return absl::OkStatus();
  }
  for (const cv1::StackReport& r : resp.reports())
    for (const cv1::RankStacks& k : r.ranks())
      std::printf(
          "=== job %s generation %llu node %s rank %u (pid %u, %s) ===\n%s\n",
          job.c_str(), static_cast<unsigned long long>(r.generation()),
          r.node_id().c_str(), k.rank(), k.pid(), k.tool().c_str(),
          k.text().c_str());
  std::printf("generations with stacks kept: %s\n",
              absl::StrJoin(resp.generations(), ",").c_str());
  return absl::OkStatus();
}

}  // namespace ckpt::tools
