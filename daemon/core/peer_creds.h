// Who is calling ckptd over its socket: the credentials PeerListener
// records for each connection (SO_PEERCRED) and the process start time that
// tells a live holder from a pid reused since. Plain data and two clock
// reads, so that the job table and the node agent, which only need to know
// who a caller is, do not depend on the listener and its gRPC server.
#ifndef CKPT_DAEMON_CORE_PEER_CREDS_H_
#define CKPT_DAEMON_CORE_PEER_CREDS_H_

#include <sys/types.h>

#include <cstdint>

namespace ckpt::daemon {

struct PeerCreds {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  // When the peer process started (ProcessStartMs, read when it
  // connected); 0: unknown.
  int64_t started_ms = 0;
};

// CLOCK_BOOTTIME now, in ms: the clock of ProcessStartMs.
int64_t BootClockMs();
// When process `pid` started, in ms of CLOCK_BOOTTIME (/proc/<pid>/stat's
// starttime, 10 ms steps), or 0 when that cannot be read: pid 0 (the
// kernel's answer for a peer in a pid namespace this one cannot see), a
// process already gone.
int64_t ProcessStartMs(pid_t pid);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_CORE_PEER_CREDS_H_
