// ckptd: serves the Ckptd gRPC service on a Unix socket until SIGTERM or
// SIGINT, then drains pending persists (bounded by --drain-seconds). With
// --coordinator it joins a multi-node job as a node (see node_agent.h);
// with --coordinator-listen it also serves the coordinator itself.
#include <signal.h>
#include <sys/resource.h>

#include <cstdio>
#include <filesystem>

#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include "coordinator/service.h"
#include "daemon/catalog.h"
#include "daemon/engine.h"
#include "daemon/engine_util.h"
#include "daemon/node_agent.h"
#include "daemon/options.h"
#include "daemon/peer_listener.h"
#include "daemon/service.h"

namespace {

int Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "ckptd: %s: %s\n", what.c_str(), std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ckpt::daemon;
  std::string help;
  auto opts = ParseDaemonOptions(argc, argv, &help);
  if (!opts.ok()) {
    if (opts.status().code() == absl::StatusCode::kCancelled) {
      std::fputs(help.c_str(), stdout);
      return 0;
    }
    return Fail("bad arguments", opts.status());
  }
  // Signals go to the main thread's sigwait, never to a worker thread.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // Every connection costs a descriptor; gRPC uses epoll, not select(), so
  // the soft limit can go up to the hard one (systemd's default soft limit
  // is 1024).
  rlimit nofile;
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &nofile);  // best effort: the old limit still works
  }

  std::error_code ec;
  std::filesystem::create_directories(opts->root, ec);
  if (ec) return Fail("--root " + opts->root, absl::InternalError(ec.message()));
  auto backend = ckpt::storage::NewLocalBackend(opts->storage);
  if (!backend.ok()) return Fail("storage", backend.status());
  auto catalog = Catalog::Open(opts->root + "/.catalog");
  if (!catalog.ok()) return Fail("catalog", catalog.status());
  if (!opts->shared_root.empty()) {
    std::filesystem::create_directories(opts->shared_root, ec);
    if (ec) return Fail("--shared-root " + opts->shared_root, absl::InternalError(ec.message()));
  }
  // Embedded coordinator: the same state machine and service as
  // ckpt-coordinator, its state next to the catalog.
  std::unique_ptr<ckpt::coordinator::CoordinatorServer> coordinator;
  if (!opts->coordinator_listen.empty()) {
    ckpt::coordinator::CoordinatorOptions co;
    co.state_dir = opts->root + "/.coordinator";
    co.shared_root = opts->storage.root;
    co.heartbeat_timeout = std::chrono::milliseconds(opts->heartbeat_timeout_ms);
    auto c = ckpt::coordinator::Coordinator::Open(co);
    if (!c.ok()) return Fail("coordinator", c.status());
    auto server = ckpt::coordinator::CoordinatorServer::Start(std::move(*c), opts->coordinator_listen);
    if (!server.ok()) return Fail("coordinator", server.status());
    coordinator = std::move(*server);
    std::string host = opts->coordinator_listen.substr(0, opts->coordinator_listen.rfind(':'));
    opts->agent.coordinator = "127.0.0.1:" + std::to_string(coordinator->port());
    LogInfo("coordinator listening on " + host + ":" + std::to_string(coordinator->port()));
    std::printf("coordinator listening on %s:%d\n", host.c_str(), coordinator->port());
    std::fflush(stdout);
  }
  std::unique_ptr<NodeAgent> agent;
  if (opts->cluster) {
    agent = std::make_unique<NodeAgent>(opts->agent);
    opts->engine.on_shard = [a = agent.get()](const ShardReport& r) { a->Report(r); };
  }
  auto engine = Engine::Open(opts->engine, backend->get(), catalog->get());
  if (!engine.ok()) return Fail("recovery", engine.status());
  auto listener = PeerListener::Listen(opts->socket_path, opts->listener);
  if (!listener.ok()) return Fail("socket", listener.status());

  CkptdService service(engine->get(), listener->get(), opts->root);
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(static_cast<int>(opts->max_request_mib << 20));
  builder.SetMaxSendMessageSize(64 << 20);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) return Fail("grpc", absl::InternalError("server did not start"));
  (*listener)->Start(server.get());
  if (agent) agent->Start(engine->get());
  LogInfo("serving on " + opts->socket_path + ", root " + opts->root + ", storage " +
          (*backend)->name() + ", shm prefix " + opts->engine.shm_prefix);

  int sig = 0;
  sigwait(&sigs, &sig);
  LogInfo(std::string("received ") + (sig == SIGTERM ? "SIGTERM" : "SIGINT") +
          ", draining pending persists");
  size_t left = (*engine)->Drain(opts->drain_deadline);
  if (left)
    LogWarning(std::to_string(left) + " shards not durable at the drain deadline; "
               "they stay in shared memory and a restarted ckptd persists them");
  (*listener)->Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  agent.reset();  // before the engine it reports on
  engine->reset();
  if (coordinator) coordinator->Shutdown();
  LogInfo("stopped");
  return 0;
}
