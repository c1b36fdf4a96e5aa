#include "coordinator/replica_placement.h"

#include <algorithm>
#include <cstdint>
#include <set>
#include <tuple>
#include <vector>

namespace ckpt::coordinator {

std::string HostOf(const std::string& address) {
  const size_t colon = address.find(':');
  return colon != std::string::npos &&
                 address.find(':', colon + 1) == std::string::npos
             ? address.substr(0, colon)
             : address;
}

// The rule of the header, in O(nodes log nodes): holders sit in sets by
// load, ordered by ring position, so the least loaded nearest one is a
// lower_bound away, and a source's own domain (contiguous on the ring) is
// skipped in one jump. replica_placement_test keeps it equal to the rule
// written out plainly.
std::map<std::string, std::string> PlaceReplicas(
    std::vector<PlacementNode> nodes) {
  std::sort(nodes.begin(), nodes.end(),
            [](const PlacementNode& a, const PlacementNode& b) {
              return std::tie(a.domain, a.id) < std::tie(b.domain, b.id);
            });
  const size_t n = nodes.size();
  constexpr size_t kNone = SIZE_MAX;
  // Each node's domain as a ring range [first, last] ("" : itself), and
  // holders counted up to each position.
  std::vector<size_t> first(n), last(n), holders_before(n + 1, 0);
  for (size_t i = 0; i < n; ++i) {
    holders_before[i + 1] = holders_before[i] + (nodes[i].holder ? 1 : 0);
    first[i] = last[i] = i;
    if (nodes[i].domain.empty()) continue;
    if (i > 0 && nodes[i - 1].domain == nodes[i].domain)
      first[i] = first[i - 1];
  }
  for (size_t i = n; i-- > 0;)
    if (!nodes[i].domain.empty() && i + 1 < n &&
        nodes[i + 1].domain == nodes[i].domain)
      last[i] = last[i + 1];
  std::map<uint32_t, std::set<size_t>> by_load;
  std::vector<uint32_t> load(n, 0);
  std::vector<size_t> target(n, kNone);
  for (size_t i = 0; i < n; ++i)
    if (nodes[i].holder) by_load[0].insert(i);
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < n; ++i) index[nodes[i].id] = i;
  std::map<std::string, std::string> out;
  for (size_t s = 0; s < n; ++s) {
    if (!nodes[s].source) continue;
    const size_t own = holders_before[last[s] + 1] - holders_before[first[s]];
    // Excluded holders are no holders of s's: neither counted nor picked.
    std::vector<bool> excluded;
    size_t excluded_other = 0;
    if (!nodes[s].excluded.empty()) {
      excluded.assign(n, false);
      for (const std::string& id : nodes[s].excluded) {
        auto it = index.find(id);
        if (it == index.end() || !nodes[it->second].holder) continue;
        excluded[it->second] = true;
        if (it->second < first[s] || it->second > last[s]) ++excluded_other;
      }
    }
    const bool other_domain = holders_before[n] - own > excluded_other;
    size_t pick = kNone;
    for (auto level = by_load.begin(); level != by_load.end() && pick == kNone;
         ++level) {
      const std::set<size_t>& ring = level->second;
      size_t mutual = kNone;
      // Candidates in ring order after s, within [lo, hi): true when a
      // holder that does not replicate to s was found.
      auto scan = [&](size_t lo, size_t hi) {
        for (auto it = ring.lower_bound(lo); it != ring.end() && *it < hi;) {
          const size_t c = *it;
          if (c == s || (!excluded.empty() && excluded[c])) {
            ++it;
          } else if (other_domain && c >= first[s] && c <= last[s]) {
            it = ring.upper_bound(last[s]);  // s's own domain
          } else if (target[c] != s) {
            pick = c;
            return true;
          } else {
            if (mutual == kNone) mutual = c;
            ++it;
          }
        }
        return false;
      };
      if (!scan(s + 1, n) && !scan(0, s + 1) && mutual != kNone) pick = mutual;
    }
    if (pick == kNone) continue;
    std::set<size_t>& from = by_load[load[pick]];
    from.erase(pick);
    if (from.empty()) by_load.erase(load[pick]);
    by_load[++load[pick]].insert(pick);
    target[s] = pick;
    out[nodes[s].id] = nodes[pick].id;
  }
  return out;
}

}  // namespace ckpt::coordinator
