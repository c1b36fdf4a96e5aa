// Launcher: a trainer's word that its collective failed because peers are
// gone. Its exit is then maybe a symptom of another node's death, not a
// failure of its own: the report says so, and the coordinator probes the
// peers' nodes before it plans (ReportTrainerExitRequest.peer_lost).
//
// $CKPT_PEER_LOST_FILE (one per rank, made empty before each start): a
// trainer that lost peers writes their ranks to it, separated by blanks
// or newlines (anything else in it, or nothing but a newline: peers it
// cannot name), then exits non-zero. An empty file says nothing.
#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <set>

#include "tools/ckptrun.h"

namespace ckpt::tools {
namespace {

// What is read of the note: a trainer writes a few ranks, not a job's.
constexpr size_t kMaxNoteBytes = 4096;
constexpr size_t kMaxLostRanks = 64;

}  // namespace

std::string Launcher::PeerLostFile(uint32_t rank) {
  return RankFile(rank, ".peer-lost", /*truncate=*/true);
}

Launcher::PeerLost Launcher::TakePeerLost(uint32_t rank, uint32_t world_size) {
  PeerLost lost;
  if (stacks_dir_.empty()) return lost;
  const std::string path = RankFile(rank, ".peer-lost", /*truncate=*/false);
  if (path.empty()) return lost;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return lost;
  std::string text(kMaxNoteBytes, '\0');
  ssize_t n = ::read(fd, text.data(), text.size());
  ::close(fd);
  if (n <= 0) return lost;
  text.resize(static_cast<size_t>(n));
  lost.said = true;
  // Only ranks of the job, each once; a word that is not one names none.
  std::set<uint32_t> ranks;
  const char* p = text.c_str();
  while (*p != '\0') {
    if (std::isspace(static_cast<unsigned char>(*p))) {
      ++p;
      continue;
    }
    char* end = nullptr;
    unsigned long r = 0;
    if (std::isdigit(static_cast<unsigned char>(*p)))
      r = std::strtoul(p, &end, 10);
    if (end == nullptr || end == p) {
      while (*p != '\0' && !std::isspace(static_cast<unsigned char>(*p))) ++p;
      continue;
    }
    p = end;
    if (r < world_size && r != rank && ranks.size() < kMaxLostRanks)
      ranks.insert(static_cast<uint32_t>(r));
  }
  lost.ranks.assign(ranks.begin(), ranks.end());
  PeerLostFile(rank);  // emptied: said once
  return lost;
}

const std::vector<uint32_t>* Launcher::SaidLost(uint32_t rank,
                                                uint64_t generation) const {
  for (const PendingReport& r : reports_)
    if (r.exit.rank == rank && r.generation == generation && r.peers.said)
      return &r.peers.ranks;
  auto s = said_lost_.find(rank);
  if (s != said_lost_.end() && s->second.first == generation)
    return &s->second.second;
  return nullptr;
}

bool Launcher::ResolveLocalPeers(PendingReport& r) {
  if (!r.peers.said || r.peers.ranks.empty()) return true;
  std::set<uint32_t> out;
  std::set<uint32_t> seen = {r.exit.rank};
  std::vector<uint32_t> todo(r.peers.ranks.rbegin(), r.peers.ranks.rend());
  bool replaced = false;
  while (!todo.empty()) {
    const uint32_t l = todo.back();
    todo.pop_back();
    if (!seen.insert(l).second) continue;
    const std::vector<uint32_t>* said = SaidLost(l, r.generation);
    if (said != nullptr && !said->empty()) {
      todo.insert(todo.end(), said->rbegin(), said->rend());
      replaced = true;
      continue;
    }
    auto p = procs_.find(l);
    if (p != procs_.end() && p->second.generation == r.generation &&
        !p->second.kept_for) {
      // Still running here and silent: it is leaving too (its collective
      // broke on the same loss) or it is the failure itself.
      const auto now = std::chrono::steady_clock::now();
      if (!r.held_since) r.held_since = now;
      if (now - *r.held_since < kLocalPeerWait) return false;
    }
    out.insert(l);
  }
  // Only this node's ranks, naming each other: nothing better to say.
  if (replaced && !out.empty()) {
    r.named = r.peers.ranks;
    r.peers.ranks.assign(out.begin(), out.end());
  }
  return true;
}

}  // namespace ckpt::tools
