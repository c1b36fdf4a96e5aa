// ckptd: serves the Ckptd gRPC service on a Unix socket until SIGTERM or
// SIGINT, then drains pending persists (bounded by --drain-seconds).
#include <signal.h>

#include <cstdio>
#include <filesystem>

#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include "daemon/catalog.h"
#include "daemon/engine.h"
#include "daemon/engine_util.h"
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

  std::error_code ec;
  std::filesystem::create_directories(opts->root, ec);
  if (ec) return Fail("--root " + opts->root, absl::InternalError(ec.message()));
  auto backend = ckpt::storage::NewLocalBackend(opts->storage);
  if (!backend.ok()) return Fail("storage", backend.status());
  auto catalog = Catalog::Open(opts->root + "/.catalog");
  if (!catalog.ok()) return Fail("catalog", catalog.status());
  auto engine = Engine::Open(opts->engine, backend->get(), catalog->get());
  if (!engine.ok()) return Fail("recovery", engine.status());
  auto listener = PeerListener::Listen(opts->socket_path);
  if (!listener.ok()) return Fail("socket", listener.status());

  CkptdService service(engine->get(), listener->get(), opts->root);
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.SetMaxSendMessageSize(64 << 20);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) return Fail("grpc", absl::InternalError("server did not start"));
  (*listener)->Start(server.get());
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
  engine->reset();
  LogInfo("stopped");
  return 0;
}
