// ckpt-coordinator: the coordinator of multi-node checkpointed jobs.
//   ckpt-coordinator --listen HOST:PORT --state DIR --shared-root DIR
//                    [--heartbeat-timeout-ms N] [--config FILE]
// Prints "listening on HOST:PORT" (with the real port when PORT is 0) on
// stdout once it serves; SIGTERM/SIGINT stop it (state is always durable,
// so SIGKILL loses nothing that was acknowledged).
#include <signal.h>

#include <cstdio>
#include <thread>

#include "coordinator/options.h"
#include "coordinator/service.h"

int main(int argc, char** argv) {
  std::string help;
  auto opts = ckpt::coordinator::ParseCoordinatorOptions(argc, argv, &help);
  if (!opts.ok()) {
    if (opts.status().code() == absl::StatusCode::kCancelled) {
      std::printf("%s", help.c_str());
      return 0;
    }
    std::fprintf(stderr, "ckpt-coordinator: %s\n", std::string(opts.status().message()).c_str());
    return 2;
  }
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);  // before any thread starts

  auto coord = ckpt::coordinator::Coordinator::Open(opts->coordinator);
  if (!coord.ok()) {
    std::fprintf(stderr, "ckpt-coordinator: %s\n", std::string(coord.status().message()).c_str());
    return 1;
  }
  auto server = ckpt::coordinator::CoordinatorServer::Start(std::move(*coord), opts->listen);
  if (!server.ok()) {
    std::fprintf(stderr, "ckpt-coordinator: %s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  std::string host = opts->listen.substr(0, opts->listen.rfind(':'));
  std::printf("listening on %s:%d\n", host.c_str(), (*server)->port());
  std::fflush(stdout);
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&sigs, &sig);
    (*server)->Shutdown();
  });
  (*server)->Wait();  // only the waiter shuts the server down
  waiter.join();
  return 0;
}
