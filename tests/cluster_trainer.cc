// The deterministic trainer of the multi-node tests and the recovery
// benchmark, configured like a real one by ckptrun's environment (RANK,
// WORLD_SIZE, CKPT_SOCKET, CKPT_JOB, CKPT_RESTORE_STEP). Its state at step S
// is a function of (rank, S), so a restore is checked bit for bit.
//   cluster_trainer BYTES LAST_STEP STEP_MS LOG_DIR [hold]
// It restores CKPT_RESTORE_STEP when set (exit 4 if the state differs),
// then saves steps restore+1 .. LAST_STEP, one every STEP_MS, and appends
// to LOG_DIR/rank-<R>.log lines that the tests parse:
//   start pid=<pid> generation=<G> restore=<S|none> mono_ms=<ms>
//   restored step=<S> seconds=<t> process_start_to_restored=<t> mono_ms=<ms>
//            connect=<t> alloc=<t>
// (connect: Client::Connect; alloc: allocating and zeroing the state the
// restore fills, both before the restore call.)
// (mono_ms: CLOCK_MONOTONIC in ms, the clock of the coordinator's events.)
//   saved step=<S> stall=<t>
//   done step=<the last step saved: LAST_STEP, or restore+N below>
// With "hold" it then sleeps until killed instead of exiting (a quiet job
// for the recovery benchmark). CLUSTER_TRAINER_SLOW=F in the environment
// makes each step F times STEP_MS (a slow node: a straggler);
// CLUSTER_TRAINER_STEPS_AFTER_RESTORE=N makes a restored trainer stop after
// step restore+N when that comes before LAST_STEP (a test that has seen its
// recovery needs only a few more steps, not the run to LAST_STEP).
// CLUSTER_TRAINER_LINKS=1: the ranks run a collective. Each rank other
// than 0 holds a TCP link to rank 0 (MASTER_ADDR:MASTER_PORT, as ckptrun
// sets them) and every step ends in a barrier over the links. A rank whose
// link breaks (a peer died) writes the lost peer's rank to
// $CKPT_PEER_LOST_FILE, logs "peer_lost rank=<R>" and exits 6, as a real
// trainer's failed collective does. CLUSTER_TRAINER_FAKE_PEER_LOST=R:S:P
// makes rank R, in generation 0, claim at step S that peer P is lost
// (exit 6 while P lives: a network blip, or a slow peer).
// CLUSTER_TRAINER_FAKE_PEER_LOST_GATE=<file>: before that claim, rank R
// logs "gate" and waits until <file> exists (a test readies the peer):
// inotify on its directory, so its creation wakes the rank at once.
// CLUSTER_TRAINER_LOSS_GATE=<file>: a rank whose collective breaks waits
// until <file> exists before it claims the loss and exits (a test orders
// this node's claims after another node's: a real peer loss is seen by
// every survivor at about the same time, in no set order).
// CLUSTER_TRAINER_EXIT_AT_RESTORE=C: a trainer given a step to restore
// exits C instead, every time (a restore that cannot work: the job's
// every plan fails).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "tests/harness.h"

namespace {

using Clock = std::chrono::steady_clock;

// Waits until `path` exists: an inotify watch on its directory for names
// created or moved in, then one look at the path itself, so that a file
// created before the watch was set up is not missed. Exits 3 (logged) when
// the watch cannot be set up.
void WaitForFile(const std::string& path, FILE* log) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  const int fd = inotify_init1(IN_CLOEXEC);
  if (fd < 0 ||
      inotify_add_watch(fd, dir.c_str(), IN_CREATE | IN_MOVED_TO) < 0) {
    std::fprintf(log, "gate: inotify on %s: %s\n", dir.c_str(),
                 std::strerror(errno));
    std::fflush(log);
    std::exit(3);
  }
  alignas(struct inotify_event) char buf[4096];
  while (access(path.c_str(), F_OK) != 0) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno != EINTR) {
      std::fprintf(log, "gate: reading inotify: %s\n", std::strerror(errno));
      std::fflush(log);
      std::exit(3);
    }
    // Any event (the file's, another name's, an overflow) is followed by a
    // look at the path itself.
  }
  close(fd);
}

long long MonoMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             Clock::now().time_since_epoch())
      .count();
}

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Stamps (rank, step) into every 4 KiB of every tensor, over the base
// state: any stale page of a wrong step shows.
void Stamp(ckpt::testing::HostState& s, uint32_t rank, uint64_t step) {
  for (size_t i = 0; i < s.buffers.size(); ++i) {
    auto& b = s.buffers[i];
    for (size_t off = 0; off + 16 <= b.size(); off += 4096) {
      uint64_t words[2] = {(uint64_t{rank} << 48) ^ step,
                           step * 0x9E3779B97F4A7C15ull ^ (off + i)};
      std::memcpy(&b[off], words, sizeof words);
    }
  }
}

// The links of the barrier: rank 0 holds one per other rank (by rank),
// every other rank one to rank 0.
struct Links {
  uint32_t rank = 0;
  std::map<uint32_t, int> fds;
};

// CLUSTER_TRAINER_LAST_TO_LEAVE=R: rank R, having lost a peer, breaks its
// links to the others and leaves only once each of them has closed its
// end (exited): the others' collectives break on R, a survivor of their
// own node, and they exit before it does.
bool LastToLeave(uint32_t rank) {
  const char* r = std::getenv("CLUSTER_TRAINER_LAST_TO_LEAVE");
  return r != nullptr && *r != '\0' && std::strtoul(r, nullptr, 10) == rank;
}

[[noreturn]] void PeerLost(FILE* log, uint32_t peer,
                           const Links* links = nullptr) {
  if (const char* gate = std::getenv("CLUSTER_TRAINER_LOSS_GATE");
      links != nullptr && gate && *gate) {
    std::fprintf(log, "loss_gate peer=%u\n", peer);
    std::fflush(log);
    WaitForFile(gate, log);
  }
  if (const char* f = std::getenv("CKPT_PEER_LOST_FILE"); f && *f)
    if (FILE* note = std::fopen(f, "w")) {
      std::fprintf(note, "%u\n", peer);
      std::fclose(note);
    }
  std::fprintf(log, "peer_lost rank=%u mono_ms=%lld\n", peer, MonoMs());
  std::fflush(log);
  if (links != nullptr && LastToLeave(links->rank)) {
    for (const auto& [other, fd] : links->fds) shutdown(fd, SHUT_WR);
    char c;
    for (const auto& [other, fd] : links->fds)
      for (;;) {
        ssize_t n = read(fd, &c, 1);
        if (n > 0 || (n < 0 && errno == EINTR)) continue;
        break;  // closed (or broken): that peer is gone
      }
  }
  std::exit(6);
}

bool ReadByte(int fd) {
  char c;
  for (;;) {
    ssize_t n = read(fd, &c, 1);
    if (n == 1) return true;
    if (n < 0 && errno == EINTR) continue;
    return false;
  }
}

bool WriteAll(int fd, const void* p, size_t n) {
  const char* b = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = write(fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    b += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Joins the generation's links (rank 0 listens, the others connect, each
// saying its rank); false after two minutes without every peer.
bool Join(Links& l, uint32_t world) {
  const char* addr = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  if (!addr || !port) return false;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::atoi(port)));
  if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1) return false;
  const auto deadline = Clock::now() + std::chrono::minutes(2);
  const int one = 1;
  if (l.rank != 0) {
    for (;;) {
      int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) {
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        l.fds[0] = fd;
        return WriteAll(fd, &l.rank, sizeof l.rank);
      }
      close(fd);
      // Rank 0 of this generation may not listen yet.
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(lfd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      listen(lfd, 64) != 0)
    return false;
  while (l.fds.size() + 1 < world) {
    pollfd p{lfd, POLLIN, 0};
    if (poll(&p, 1, 1000) <= 0) {
      if (Clock::now() > deadline) return false;
      continue;
    }
    int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    uint32_t peer = 0;
    if (fd < 0) continue;
    if (read(fd, &peer, sizeof peer) != sizeof peer || peer == 0 ||
        peer >= world) {
      close(fd);
      continue;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    l.fds[peer] = fd;
  }
  close(lfd);
  return true;
}

// Every rank arrives, then every rank leaves; a broken link is a lost
// peer (PeerLost does not return).
void Barrier(Links& l, FILE* log) {
  const char c = 1;
  if (l.rank != 0) {
    if (!WriteAll(l.fds[0], &c, 1) || !ReadByte(l.fds[0])) PeerLost(log, 0, &l);
    return;
  }
  for (const auto& [peer, fd] : l.fds)
    if (!ReadByte(fd)) PeerLost(log, peer, &l);
  for (const auto& [peer, fd] : l.fds)
    if (!WriteAll(fd, &c, 1)) PeerLost(log, peer, &l);
}

}  // namespace

int main(int argc, char** argv) {
  auto t_start = Clock::now();
  if (argc != 5 && !(argc == 6 && std::string(argv[5]) == "hold")) {
    std::fprintf(
        stderr,
        "usage: cluster_trainer BYTES LAST_STEP STEP_MS LOG_DIR [hold]\n");
    return 100;
  }
  const uint64_t bytes = std::strtoull(argv[1], nullptr, 10);
  uint64_t last = std::strtoull(argv[2], nullptr, 10);
  int step_ms = std::atoi(argv[3]);
  if (const char* slow = std::getenv("CLUSTER_TRAINER_SLOW"))
    step_ms = static_cast<int>(step_ms * std::atof(slow));
  ckpt::ClientOptions o;  // everything else from the environment
  // More slots keep older steps in memory for longer (a test that wants
  // its restore served from memory whatever the machine's load).
  if (const char* slots = std::getenv("CLUSTER_TRAINER_SLOTS"))
    o.num_slots = std::atoi(slots);
  const auto t_connect = Clock::now();
  auto client = ckpt::Client::Connect(o);
  const double connect_s = Since(t_connect);
  if (!client.ok()) {
    std::fprintf(stderr, "cluster_trainer: %s\n",
                 std::string(client.status().message()).c_str());
    return 2;
  }
  const uint32_t rank = static_cast<uint32_t>(std::atoi(std::getenv("RANK")));
  std::string path =
      std::string(argv[4]) + "/rank-" + std::to_string(rank) + ".log";
  FILE* log = std::fopen(path.c_str(), "a");
  if (!log) return 101;
  setvbuf(log, nullptr, _IOLBF, 0);
  const char* gen = std::getenv("CKPT_GENERATION");
  const char* restore = std::getenv("CKPT_RESTORE_STEP");
  std::fprintf(log, "start pid=%d generation=%s restore=%s mono_ms=%lld\n",
               getpid(), gen ? gen : "none",
               restore && *restore ? restore : "none", MonoMs());

  uint64_t first = 1;
  ckpt::testing::HostState state;
  if (restore && *restore) {
    // Restore first: what a trainer does before it builds anything else.
    uint64_t step = std::strtoull(restore, nullptr, 10);
    if (const char* code = std::getenv("CLUSTER_TRAINER_EXIT_AT_RESTORE");
        code && *code) {
      std::fprintf(log, "restore_refused step=%lu exit=%s\n",
                   static_cast<unsigned long>(step), code);
      return std::atoi(code);
    }
    const auto t_alloc = Clock::now();
    state = ckpt::testing::MakeEmptyState(bytes, 8);
    const double alloc_s = Since(t_alloc);
    auto t0 = Clock::now();
    absl::Status s =
        (*client)->Restore(static_cast<int64_t>(step), state.tensors);
    double restore_s = Since(t0);
    long long restored_ms = MonoMs();
    double started_s = Since(t_start);
    if (!s.ok()) {
      std::fprintf(log, "restore_failed step=%lu %s\n",
                   static_cast<unsigned long>(step),
                   std::string(s.message()).c_str());
      return 3;
    }
    auto expect = ckpt::testing::MakeState(bytes, 8, 1000 + rank);
    Stamp(expect, rank, step);
    if (!state.Equals(expect)) {
      std::fprintf(log, "mismatch step=%lu\n",
                   static_cast<unsigned long>(step));
      return 4;
    }
    std::fprintf(log,
                 "restored step=%lu seconds=%.6f "
                 "process_start_to_restored=%.6f mono_ms=%lld connect=%.6f "
                 "alloc=%.6f\n",
                 static_cast<unsigned long>(step), restore_s, started_s,
                 restored_ms, connect_s, alloc_s);
    first = step + 1;
    if (const char* n = std::getenv("CLUSTER_TRAINER_STEPS_AFTER_RESTORE");
        n != nullptr && *n != '\0')
      last = std::min<uint64_t>(last, step + std::strtoull(n, nullptr, 10));
  } else {
    state = ckpt::testing::MakeState(bytes, 8, 1000 + rank);
  }
  const bool linked = std::getenv("CLUSTER_TRAINER_LINKS") != nullptr;
  Links links;
  links.rank = rank;
  if (linked) {
    signal(SIGPIPE, SIG_IGN);  // a dead peer's link is an error, not a kill
    const char* world = std::getenv("WORLD_SIZE");
    if (!world || !Join(links, static_cast<uint32_t>(std::atoi(world)))) {
      std::fprintf(log, "join_failed\n");
      return 7;
    }
  }
  // R:S:P, in generation 0 only.
  long fake_rank = -1;
  uint64_t fake_step = 0;
  unsigned fake_peer = 0;
  if (const char* f = std::getenv("CLUSTER_TRAINER_FAKE_PEER_LOST");
      f && gen && std::string(gen) == "0") {
    unsigned long s = 0;
    if (std::sscanf(f, "%ld:%lu:%u", &fake_rank, &s, &fake_peer) == 3)
      fake_step = s;
  }
  for (uint64_t step = first; step <= last; ++step) {
    Stamp(state, rank, step);
    auto t0 = Clock::now();
    absl::Status s = (*client)->Save(static_cast<int64_t>(step), state.tensors);
    if (!s.ok()) {
      std::fprintf(log, "save_failed step=%lu %s\n",
                   static_cast<unsigned long>(step),
                   std::string(s.message()).c_str());
      return 5;
    }
    std::fprintf(log, "saved step=%lu stall=%.6f\n",
                 static_cast<unsigned long>(step), Since(t0));
    (*client)->Progress(static_cast<int64_t>(step));  // the hang beacon
    if (fake_rank == static_cast<long>(rank) && step == fake_step) {
      if (const char* gate = std::getenv("CLUSTER_TRAINER_FAKE_PEER_LOST_GATE");
          gate && *gate) {
        std::fprintf(log, "gate step=%lu\n", static_cast<unsigned long>(step));
        std::fflush(log);
        WaitForFile(gate, log);
      }
      PeerLost(log, fake_peer);
    }
    if (linked) Barrier(links, log);
    std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
  }
  std::fprintf(log, "done step=%lu\n", static_cast<unsigned long>(last));
  // Holding is not a hang: say so once (the pause covers a day).
  if (argc == 6) (*client)->ExpectPause(86400, "holding after the last step");
  while (argc == 6) pause();
  return 0;
}
