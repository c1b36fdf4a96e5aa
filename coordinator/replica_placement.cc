#include "coordinator/replica_placement.h"

#include <algorithm>
#include <cstdint>
#include <tuple>

namespace ckpt::coordinator {

std::string HostOf(const std::string& address) {
  const size_t colon = address.find(':');
  return colon != std::string::npos &&
                 address.find(':', colon + 1) == std::string::npos
             ? address.substr(0, colon)
             : address;
}

std::map<std::string, std::string> PlaceReplicas(
    std::vector<PlacementNode> nodes) {
  std::sort(nodes.begin(), nodes.end(),
            [](const PlacementNode& a, const PlacementNode& b) {
              return std::tie(a.domain, a.id) < std::tie(b.domain, b.id);
            });
  const size_t n = nodes.size();
  std::vector<size_t> holders;
  for (size_t i = 0; i < n; ++i)
    if (nodes[i].holder) holders.push_back(i);
  std::vector<uint32_t> load(n, 0);
  std::vector<size_t> target(n, SIZE_MAX);
  std::map<std::string, std::string> out;
  for (size_t s = 0; s < n; ++s) {
    if (!nodes[s].source) continue;
    bool other_domain = false;
    for (size_t h : holders)
      other_domain |= h != s && !SameDomain(nodes[h].domain, nodes[s].domain);
    size_t best = SIZE_MAX;
    std::tuple<uint32_t, bool, size_t> best_key;
    for (size_t h : holders) {
      if (h == s) continue;
      if (other_domain && SameDomain(nodes[h].domain, nodes[s].domain))
        continue;
      std::tuple<uint32_t, bool, size_t> key{load[h], target[h] == s,
                                             (h + n - s) % n};
      if (best == SIZE_MAX || key < best_key) {
        best = h;
        best_key = key;
      }
    }
    if (best == SIZE_MAX) continue;
    target[s] = best;
    ++load[best];
    out[nodes[s].id] = nodes[best].id;
  }
  return out;
}

}  // namespace ckpt::coordinator
