// ckptctl: lists, inspects, verifies, restores, exports (safetensors),
// reshards (another world size) and deletes checkpoints, on a directory or
// an object store (s3://);
// shows and steers multi-node jobs through the coordinator (cluster,
// rollback, resume, events with --coordinator HOST:PORT).
//
// Exit status: 0 on success; 1 when the operation failed or found damage
// (the reason on stderr); 2 on a usage error.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "coordinator/client/channel.h"
#include "coordinator/client/leader_channel.h"
#include "tools/ctl_commands.h"
#include "tools/text_output.h"
#include "util/program.h"

namespace {

using ckpt::tools::ShardSelector;

int Finish(const char* command, const absl::Status& s) {
  if (s.ok()) return 0;
  std::fprintf(stderr, "ckptctl %s: %s\n", command,
               std::string(s.message()).c_str());
  return 1;
}

// The shard-selection flags shared by inspect and restore.
void AddShardSelector(CLI::App* cmd, ShardSelector* sel,
                      std::optional<uint64_t>* step,
                      std::optional<uint32_t>* rank) {
  cmd->add_option("file", sel->file,
                  "shard file (instead of --root/--job/--step/--rank)");
  cmd->add_option("--root", sel->root,
                  "checkpoint root: a directory, or s3://BUCKET/PREFIX");
  cmd->add_option("--job", sel->job, "job name");
  cmd->add_option("--step", *step, "step number");
  cmd->add_option("--rank", *rank, "rank");
  cmd->add_option("--node", sel->node,
                  "cluster root: the node whose copy of the rank's shard");
}

}  // namespace

int main(int argc, char** argv) {
  if (ckpt::PrintedVersion(argc, argv, "ckptctl", CKPT_VERSION)) return 0;
  CLI::App app{"ckptctl: inspect and manage ckptd checkpoints"};
  app.require_subcommand(1);
  app.fallthrough();
  std::string socket;
  if (const char* env = std::getenv("CKPT_SOCKET")) socket = env;
  app.add_option("--socket", socket,
                 "ckptd's Unix socket (default: $CKPT_SOCKET)");
  std::string coordinator;
  app.add_option(
      "--coordinator", coordinator,
      "ckpt-coordinator's HOST:PORT[,HOST:PORT...] (cluster, rollback, events, "
      "stacks, health, cordon, uncordon; "
      "replicas: the leader is followed)");
  ckpt::coordinator::TlsFiles tls;
  app.add_option("--tls-cert", tls.cert,
                 "client certificate for the coordinator (PEM; mutual TLS)");
  app.add_option("--tls-key", tls.key, "its private key (PEM)");
  app.add_option("--tls-ca", tls.ca,
                 "CA of the coordinator's certificate (PEM)");
  app.add_flag("--insecure", tls.insecure,
               "plaintext to the coordinator (the default without --tls-*)");
  bool json = false;
  app.add_flag("--json", json, "print one JSON object instead of tables");
  bool progress = false;
  app.add_flag("--progress", progress,
               "draw progress on stderr even when it is not a terminal");

  std::string job;
  std::optional<uint64_t> step;
  std::optional<uint32_t> rank;
  bool all_steps = false;

  CLI::App* list = app.add_subcommand(
      "list", "jobs, steps and shards known to the daemon (or on storage)");
  list->add_option("--job", job, "only this job");
  std::string list_root;
  list->add_option(
      "--root", list_root,
      "list what is on storage under this root (a directory or "
      "s3://BUCKET/PREFIX: "
      "shards, node and global manifests) instead of asking the daemon");

  CLI::App* status =
      app.add_subcommand("status", "daemon health, arenas, persist queue");

  CLI::App* del =
      app.add_subcommand("delete", "delete one step or every step of a job");
  del->add_option("--job", job, "job name")->required();
  auto* del_step = del->add_option("--step", step, "step to delete");
  auto* del_all =
      del->add_flag("--all", all_steps, "delete every step of the job");
  del_step->excludes(del_all);
  del_all->excludes(del_step);

  ShardSelector sel;
  std::optional<uint64_t> sel_step;
  std::optional<uint32_t> sel_rank;
  CLI::App* inspect = app.add_subcommand(
      "inspect", "a shard's header and tensor index, or a manifest");
  AddShardSelector(inspect, &sel, &sel_step, &sel_rank);

  ckpt::tools::VerifyOptions vopts;
  CLI::App* verify = app.add_subcommand(
      "verify", "check every checksum and manifest under a root");
  verify
      ->add_option("--root", vopts.root,
                   "checkpoint root: a directory, or s3://BUCKET/PREFIX")
      ->required();
  verify->add_option("--job", vopts.job, "only this job");
  verify->add_option("--step", vopts.step, "only this step (needs --job)");
  verify->add_option("--rank", vopts.rank,
                     "only this rank (needs --job and --step)");

  std::string out;
  CLI::App* restore =
      app.add_subcommand("restore", "extract a shard, verifying checksums");
  AddShardSelector(restore, &sel, &sel_step, &sel_rank);
  restore
      ->add_option(
          "--out", out,
          "file (verified shard copy) or directory/ (one file per tensor)")
      ->required();

  ckpt::tools::ExportArgs export_args;
  CLI::App* exp = app.add_subcommand(
      "export",
      "a step's global tensors (no --rank) or one shard as a safetensors "
      "file, verifying checksums");
  AddShardSelector(exp, &sel, &sel_step, &sel_rank);
  exp->add_option("--format", export_args.format,
                  "output format (safetensors)");
  exp->add_option("--out", export_args.out, "the file to write")->required();
  exp->add_flag("--force", export_args.force, "replace an existing --out");

  ckpt::tools::ReshardArgs reshard_args;
  CLI::App* reshard = app.add_subcommand(
      "reshard",
      "write a step as a checkpoint of another world size into a new root");
  reshard
      ->add_option("--root", reshard_args.root,
                   "checkpoint root: a directory, or s3://BUCKET/PREFIX")
      ->required();
  reshard->add_option("--job", reshard_args.job, "job name")->required();
  reshard->add_option("--step", reshard_args.step, "step number")->required();
  reshard
      ->add_option("--world-size", reshard_args.world_size,
                   "ranks of the new checkpoint")
      ->required();
  reshard
      ->add_option("--out", reshard_args.out,
                   "the new root (a directory that must not exist)")
      ->required();
  reshard->add_option("--uid", reshard_args.uid,
                      "the job's owner in the new root (default: yours)");

  CLI::App* cluster = app.add_subcommand(
      "cluster", "the coordinator's nodes, jobs and recent events");

  CLI::App* rollback =
      app.add_subcommand("rollback", "restart a job at an older durable step");
  rollback->add_option("--job", job, "job name")->required();
  rollback->add_option("--step", step, "durable step to go back to")
      ->required();

  CLI::App* resume = app.add_subcommand(
      "resume", "plan a held job again (PLAN_HELD: its plans all failed)");
  resume->add_option("--job", job, "job name")->required();

  uint64_t after_seq = 0;
  CLI::App* events =
      app.add_subcommand("events", "the coordinator's event log");
  events->add_option("--job", job, "only this job");
  events->add_option("--after", after_seq,
                     "only events with a sequence number above this");

  std::optional<uint64_t> generation;
  std::string stacks_job;
  CLI::App* stacks = app.add_subcommand(
      "stacks", "the stacks captured when a job hung (HANG_DETECTED)");
  stacks->add_option("--job", stacks_job, "job name")->required();
  stacks->add_option("--generation", generation,
                     "the generation that hung (default: the newest hang)");

  ckpt::tools::HealthArgs health_args;
  CLI::App* health = app.add_subcommand(
      "health", "run the nodes' health checks now; show each verdict");
  health->add_option("--node", health_args.node, "only this node");
  health->add_flag("--last", health_args.last,
                   "run nothing: show each node's newest report");
  health->add_flag("--network", health_args.network,
                   "also run a round of the pairwise network check");
  health->add_option("--timeout-s", health_args.timeout_s,
                     "wait this long for the reports (default 60)");

  std::string cordon_node, cordon_reason;
  CLI::App* cordon = app.add_subcommand(
      "cordon", "keep a node out of placement; its ranks move to a spare");
  cordon->add_option("NODE", cordon_node, "node id")->required();
  cordon->add_option("--reason", cordon_reason, "why (shown with the node)")
      ->required();
  CLI::App* uncordon =
      app.add_subcommand("uncordon", "let a cordoned node take ranks again");
  uncordon->add_option("NODE", cordon_node, "node id")->required();

  for (CLI::App* cmd :
       {list, status, del, inspect, verify, restore, exp, reshard, cluster,
        rollback, resume, events, stacks, health, cordon, uncordon})
    cmd->add_flag("--json", json, "print one JSON object instead of tables");
  for (CLI::App* cmd : {verify, restore, exp, reshard})
    cmd->add_flag("--progress", progress,
                  "draw progress on stderr even when it is not a terminal");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  sel.step = sel_step;
  sel.rank = sel_rank;
  ckpt::tools::Progress::Force(progress);

  for (CLI::App* cmd :
       {cluster, rollback, resume, events, stacks, health, cordon, uncordon}) {
    if (!cmd->parsed()) continue;
    absl::Status s =
        coordinator.empty()
            ? absl::InvalidArgumentError("--coordinator HOST:PORT is required")
            : ckpt::coordinator::ParseAddressList(coordinator, "--coordinator")
                  .status();
    if (s.ok())
      s = ckpt::coordinator::ValidateTlsFlags(tls, /*require_choice=*/false);
    if (!s.ok()) {
      std::fprintf(stderr, "ckptctl %s: %s\n", cmd->get_name().c_str(),
                   std::string(s.message()).c_str());
      return 2;
    }
  }
  if (cluster->parsed())
    return Finish("cluster", ckpt::tools::RunCluster(coordinator, tls, json));
  if (rollback->parsed())
    return Finish("rollback",
                  ckpt::tools::RunRollback(coordinator, tls, job, step, json));
  if (resume->parsed())
    return Finish("resume",
                  ckpt::tools::RunResume(coordinator, tls, job, json));
  if (health->parsed())
    return Finish("health",
                  ckpt::tools::RunHealth(coordinator, tls, health_args, json));
  if (cordon->parsed())
    return Finish("cordon",
                  ckpt::tools::RunCordon(coordinator, tls, cordon_node,
                                         cordon_reason, json));
  if (uncordon->parsed())
    return Finish("uncordon", ckpt::tools::RunUncordon(coordinator, tls,
                                                       cordon_node, json));
  if (events->parsed())
    return Finish("events", ckpt::tools::RunEvents(coordinator, tls, job,
                                                   after_seq, json));
  if (stacks->parsed())
    return Finish("stacks", ckpt::tools::RunStacks(coordinator, tls, stacks_job,
                                                   generation, json));
  if (list->parsed() && !list_root.empty())
    return Finish("list", ckpt::tools::RunListRoot(list_root, job, json));
  if (list->parsed())
    return Finish("list", ckpt::tools::RunList(socket, job, json));
  if (status->parsed())
    return Finish("status", ckpt::tools::RunStatus(socket, json));
  if (del->parsed()) {
    if (!step && !all_steps) {
      std::fprintf(stderr, "ckptctl delete: give --step N or --all\n");
      return 2;
    }
    return Finish("delete",
                  ckpt::tools::RunDelete(socket, job, step, all_steps, json));
  }
  if (inspect->parsed())
    return Finish("inspect", ckpt::tools::RunInspect(sel, json));
  if (verify->parsed())
    return Finish("verify", ckpt::tools::RunVerify(vopts, json));
  if (restore->parsed())
    return Finish("restore", ckpt::tools::RunRestore(sel, out, json));
  if (exp->parsed()) {
    export_args.sel = sel;
    return Finish("export", ckpt::tools::RunExport(export_args, json));
  }
  if (reshard->parsed())
    return Finish("reshard", ckpt::tools::RunReshard(reshard_args, json));
  return 2;
}
