// ckptrun --coordinator HOST:PORT --node-id ID --nproc-per-node N
//         [--nnodes M] [--world-size W] [--job NAME] [--socket PATH]
//         [--master-addr ADDR] [--master-port BASE] [--poll-ms MS]
//         [--grace-ms MS] [--restart-timeout S] [--finish-wait-s S] [--warm N]
//         [--rendezvous auto|trainer|worker|torch]
//         [--rendezvous-python PATH] -- CMD ARGS...
// See ckptrun.h for what it does and its exit status.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "coordinator/client/channel.h"
#include "coordinator/client/leader_channel.h"
#include "tools/ckptrun.h"
#include "util/cli_parse.h"
#include "util/program.h"
#include "util/validate.h"

namespace ckpt::tools {

absl::StatusOr<RunOptions> ParseRunOptions(int argc, char** argv,
                                           std::string* help) {
  RunOptions o;
  int split = 1;
  bool wants_help = false;
  for (; split < argc && std::strcmp(argv[split], "--") != 0; ++split)
    wants_help = wants_help || std::strcmp(argv[split], "--help") == 0 ||
                 std::strcmp(argv[split], "-h") == 0;
  for (int i = split + 1; i < argc; ++i) o.command.push_back(argv[i]);
  // Before the flags: without "--", CMD would be taken for a stray argument.
  if (split == argc && !wants_help)
    return absl::InvalidArgumentError(
        "--: missing before the trainer command (ckptrun [flags] -- CMD "
        "ARGS...)");

  CLI::App app{
      "ckptrun: starts this node's trainers of a coordinated job and restarts "
      "them on new generations"};
  app.footer(
      "After the flags: -- CMD ARGS..., the trainer command, started once per "
      "rank of this node.");
  std::optional<uint32_t> world_size;
  int64_t poll_ms = 100, grace_ms = 3000, master_port = 29500;
  std::string restart_timeout = "30";
  std::string finish_wait = "60";
  std::string warm = "0";
  std::string rendezvous = "auto";
  std::string rendezvous_python = "python3";
  app.add_option("--coordinator", o.coordinator,
                 "ckpt-coordinator's HOST:PORT[,HOST:PORT...] (replicas: the "
                 "leader is followed)")
      ->required();
  app.add_option(
      "--tls-cert", o.tls.cert,
      "this node's certificate for the coordinator (PEM; mutual TLS)");
  app.add_option("--tls-key", o.tls.key, "its private key (PEM)");
  app.add_option("--tls-ca", o.tls.ca,
                 "CA of the coordinator's certificate (PEM)");
  app.add_flag("--insecure", o.tls.insecure,
               "plaintext to the coordinator (the default without --tls-*)");
  app.add_option("--node-id", o.node_id,
                 "this node's id, as its ckptd registered it")
      ->required();
  app.add_option("--nproc-per-node", o.nproc_per_node, "trainers per node")
      ->required();
  app.add_option("--nnodes", o.nnodes, "nodes of the job (default 1)");
  app.add_option("--world-size", world_size,
                 "ranks of the job (default nproc-per-node * nnodes)");
  app.add_option("--min-world-size", o.min_world_size,
                 "elastic continuation: when a node is lost and no spare "
                 "takes its ranks, the job goes on with fewer, never fewer "
                 "than this (default: the coordinator's --min-world-size)");
  app.add_option("--world-size-multiple", o.world_size_multiple,
                 "elastic continuation: every world size the job runs at "
                 "is a multiple of this (default: the coordinator's)");
  app.add_option("--job", o.job, "job name (default $CKPT_JOB)");
  app.add_option(
      "--socket", o.socket,
      "this node's ckptd socket, passed to trainers (default $CKPT_SOCKET)");
  app.add_option("--master-addr", o.master_addr,
                 "MASTER_ADDR (default: the host of rank 0's node)");
  app.add_option("--master-port", master_port,
                 "MASTER_PORT base; generation G uses base + G % 1000");
  app.add_option(
      "--rendezvous", rendezvous,
      "who serves each generation's rendezvous store: worker (ckpt-worker's "
      "store) or torch (torch's TCPStore, a python3 child), served by "
      "ckptrun on every node from its start at --master-port for every "
      "generation, trainers its clients ($CKPT_RENDEZVOUS=launcher); "
      "trainer: rank 0's trainer, at --master-port + G % 1000 (as "
      "before); auto (default): worker when CMD is ckpt-worker, else "
      "trainer");
  app.add_option("--rendezvous-python", rendezvous_python,
                 "the interpreter of --rendezvous torch's store server, with "
                 "torch and ckpt importable (default python3 in $PATH)");
  app.add_option("--poll-ms", poll_ms,
                 "the longest the loop sleeps when nothing happens (a new "
                 "view or a trainer's exit wakes it at once; no RPC; "
                 "default 100)");
  app.add_option(
      "--grace-ms", grace_ms,
      "SIGTERM to SIGKILL delay when stopping trainers (default 3000)");
  app.add_option(
      "--restart-timeout", restart_timeout,
      "seconds a trainer kept in its process (in-process restart: it wrote "
      "`capable` in $CKPT_RESTART_DIR and its rank stays on this node) has "
      "to join a new generation before it is stopped and started anew; 0: "
      "no trainer is kept and none gets $CKPT_RESTART_DIR, every one is "
      "stopped and started anew on each generation (default 30)");
  app.add_option(
      "--finish-wait-s", finish_wait,
      "once every rank of this node finished, the longest to wait for the "
      "coordinator to say the whole job did (a failure elsewhere found "
      "meanwhile restarts ranks here) before leaving (default 60)");
  app.add_option(
      "--warm", warm,
      "trainer processes kept started ahead on this node (in [0, 64]): each "
      "runs CMD with CKPT_WARM=1 and no rank, does its imports and waits; a "
      "rank started anew after a failure goes to a ready one, and another "
      "is started in its place (default 0: none)");
  if (absl::Status s = ParseCli(app, help, split, argv); !s.ok()) return s;

  auto bad = [](const std::string& flag, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", why));
  };
  if (o.command.empty()) return bad("--", "no trainer command after it");
  if (absl::Status s =
          coordinator::ParseAddressList(o.coordinator, "--coordinator")
              .status();
      !s.ok())
    return s;
  if (absl::Status s =
          coordinator::ValidateTlsFlags(o.tls, /*require_choice=*/false);
      !s.ok())
    return s;
  if (absl::Status s =
          coordinator::CoordinatorClient::Create(o.coordinator, o.tls).status();
      !s.ok())
    return s;
  if (absl::Status s = ValidateJobName(o.node_id, "--node-id"); !s.ok())
    return s;
  if (o.nproc_per_node == 0)
    return bad("--nproc-per-node", "must be at least 1");
  if (o.nnodes == 0) return bad("--nnodes", "must be at least 1");
  uint64_t default_world = uint64_t{o.nproc_per_node} * o.nnodes;
  if (!world_size && default_world > UINT32_MAX)
    return bad("--nproc-per-node", "times --nnodes is too large");
  o.world_size = world_size.value_or(static_cast<uint32_t>(default_world));
  if (o.world_size == 0) return bad("--world-size", "must be at least 1");
  if (o.min_world_size &&
      (*o.min_world_size == 0 || *o.min_world_size > o.world_size))
    return bad("--min-world-size", absl::StrCat("must be in [1, ", o.world_size,
                                                "] (the world size)"));
  if (o.world_size_multiple && *o.world_size_multiple == 0)
    return bad("--world-size-multiple", "must be at least 1");
  if (o.min_world_size && o.world_size_multiple &&
      *o.min_world_size % *o.world_size_multiple != 0)
    return bad("--min-world-size",
               absl::StrCat(*o.min_world_size, " is not a multiple of ",
                            "--world-size-multiple ", *o.world_size_multiple));
  if (o.job.empty()) {
    const char* env = std::getenv("CKPT_JOB");
    if (!env || !*env)
      return bad("--job", "not given and $CKPT_JOB is not set");
    o.job = env;
  }
  if (absl::Status s = ValidateJobName(o.job, "--job"); !s.ok()) return s;
  if (o.socket.empty()) {
    const char* env = std::getenv("CKPT_SOCKET");
    if (!env || !*env)
      return bad("--socket", "not given and $CKPT_SOCKET is not set");
    o.socket = env;
  }
  if (master_port < 1 || master_port + 999 > 65535)
    return bad("--master-port", "must be in [1, 64536]");
  o.master_port = static_cast<uint32_t>(master_port);
  if (poll_ms < 1 || poll_ms > 60000)
    return bad("--poll-ms", "must be in [1, 60000]");
  o.poll = std::chrono::milliseconds(poll_ms);
  if (grace_ms < 0 || grace_ms > 3600000)
    return bad("--grace-ms", "must be in [0, 3600000]");
  o.grace = std::chrono::milliseconds(grace_ms);
  double restart_s = 0;
  if (!absl::SimpleAtod(restart_timeout, &restart_s) ||
      restart_timeout.find_first_not_of("0123456789.") != std::string::npos)
    return bad("--restart-timeout",
               absl::StrCat("\"", restart_timeout.substr(0, 32),
                            "\" is not a number of seconds"));
  if (!(restart_s >= 0 && restart_s <= 3600))
    return bad("--restart-timeout", "must be in [0, 3600] seconds");
  o.restart_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(restart_s * 1000 + 0.5));
  if (restart_s > 0 && o.restart_timeout.count() == 0)
    return bad("--restart-timeout", "below a millisecond (0 disables it)");
  if (finish_wait.empty() || finish_wait.size() > 5 ||
      finish_wait.find_first_not_of("0123456789") != std::string::npos)
    return bad("--finish-wait-s",
               absl::StrCat("\"", finish_wait.substr(0, 32),
                            "\" is not a whole number of seconds"));
  o.finish_wait = std::chrono::seconds(std::stoll(finish_wait));
  if (o.finish_wait > std::chrono::seconds(86400))
    return bad("--finish-wait-s", "must be in [0, 86400]");
  if (warm.empty() || warm.size() > 2 ||
      warm.find_first_not_of("0123456789") != std::string::npos)
    return bad("--warm", absl::StrCat("\"", warm.substr(0, 32),
                                      "\" is not a count in [0, 64]"));
  o.warm = static_cast<uint32_t>(std::stoul(warm));
  if (o.warm > 64) return bad("--warm", "must be in [0, 64]");
  if (o.warm > 0 && o.restart_timeout.count() == 0)
    return bad("--warm",
               "a warm process is given its rank by an in-process restart "
               "plan: not with --restart-timeout 0");
  absl::StatusOr<std::string> program = ResolveProgram(o.command[0]);
  if (!program.ok()) return program.status();
  o.program = *program;
  absl::StatusOr<RendezvousKind> kind = ParseRendezvous(rendezvous, o.program);
  if (!kind.ok()) return kind.status();
  o.rendezvous = *kind;
  if (o.rendezvous == RendezvousKind::kTorch) {
    absl::StatusOr<std::string> python = ResolveProgram(rendezvous_python);
    if (!python.ok())
      return bad("--rendezvous-python",
                 absl::StrCat("\"", rendezvous_python.substr(0, 64),
                              "\" is not an executable (needed by "
                              "--rendezvous torch)"));
    o.rendezvous_python = *python;
  }
  return o;
}

}  // namespace ckpt::tools

int main(int argc, char** argv) {
  if (ckpt::PrintedVersion(argc, argv, "ckptrun", CKPT_VERSION)) return 0;
  // Only the launcher's sigtimedwait sees them.
  const sigset_t signals =
      ckpt::BlockSignals({SIGTERM, SIGINT, SIGCHLD, ckpt::tools::ViewSignal()});
  std::string help;
  absl::StatusOr<ckpt::tools::RunOptions> opts =
      ckpt::tools::ParseRunOptions(argc, argv, &help);
  if (!opts.ok()) {
    if (opts.status().code() == absl::StatusCode::kCancelled) {
      std::printf("%s", help.c_str());
      return 0;
    }
    std::fprintf(stderr, "ckptrun: %s\n",
                 std::string(opts.status().message()).c_str());
    return 2;
  }
  ckpt::tools::Launcher launcher(std::move(*opts), signals);
  return launcher.Run();
}
