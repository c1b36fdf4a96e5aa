#include "util/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <prometheus/exposer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>

#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

struct ListenAddress {
  std::string host;  // as civetweb wants it: "1.2.3.4" or "[::1]"
  bool v6 = false;
  sockaddr_storage sa{};
  socklen_t len = 0;
  int port = 0;
};

std::string Quote(const std::string& s) {
  constexpr size_t kMax = 64;
  // Appended piecewise: GCC 12 warns (-Warray-bounds, a false positive)
  // on the operator+ chain of temporaries.
  std::string out = "\"";
  out.append(s, 0, std::min(s.size(), kMax));
  if (s.size() > kMax) out += "...";
  out += '"';
  return out;
}

absl::StatusOr<ListenAddress> Parse(const std::string& addr,
                                    const std::string& flag) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", Quote(addr), ": ", why,
                     " (expected HOST:PORT, HOST an IP address)"));
  };
  size_t colon = addr.rfind(':');
  if (colon == std::string::npos) return bad("no port");
  ListenAddress a;
  a.host = addr.substr(0, colon);
  std::string port = addr.substr(colon + 1);
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos)
    return bad("port is not a number in [0, 65535]");
  a.port = std::stoi(port);
  if (a.port > 65535) return bad("port is not a number in [0, 65535]");
  if (a.host == "localhost") a.host = "127.0.0.1";
  if (a.host.size() > 2 && a.host.front() == '[' && a.host.back() == ']') {
    auto* s6 = reinterpret_cast<sockaddr_in6*>(&a.sa);
    if (inet_pton(AF_INET6, a.host.substr(1, a.host.size() - 2).c_str(),
                  &s6->sin6_addr) != 1)
      return bad("host is not an IPv6 address");
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(static_cast<uint16_t>(a.port));
    a.len = sizeof(sockaddr_in6);
    a.v6 = true;
    return a;
  }
  auto* s4 = reinterpret_cast<sockaddr_in*>(&a.sa);
  if (a.host.empty()) return bad("empty host");
  if (inet_pton(AF_INET, a.host.c_str(), &s4->sin_addr) != 1)
    return bad("host is not an IPv4 address, [IPv6] address or localhost");
  s4->sin_family = AF_INET;
  s4->sin_port = htons(static_cast<uint16_t>(a.port));
  a.len = sizeof(sockaddr_in);
  return a;
}

// Binds (and closes) a socket the way civetweb will, so that a port in use
// or an address that is not local is reported with its errno; civetweb's
// own failure says only that the server did not start.
absl::Status ProbeBind(const ListenAddress& a, const std::string& addr,
                       const std::string& flag) {
  if (a.port == 0) return absl::OkStatus();
  int fd = socket(a.v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return absl::InternalError(
        absl::StrCat(flag, ": socket: ", std::strerror(errno)));
  int one = 1;
  (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc = bind(fd, reinterpret_cast<const sockaddr*>(&a.sa), a.len);
  int err = errno;
  close(fd);
  if (rc == 0) return absl::OkStatus();
  std::string why = absl::StrCat("cannot listen: ", std::strerror(err));
  if (err == EADDRINUSE)
    return absl::UnavailableError(
        absl::StrCat(flag, " ", Quote(addr), ": ", why));
  return absl::InvalidArgumentError(
      absl::StrCat(flag, " ", Quote(addr), ": ", why));
}

}  // namespace

absl::Status ValidateMetricsListen(const std::string& addr,
                                   const std::string& flag) {
  return Parse(addr, flag).status();
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& addr, const std::string& flag,
    const std::vector<std::weak_ptr<prometheus::Collectable>>& collectables) {
  absl::StatusOr<ListenAddress> a = Parse(addr, flag);
  if (!a.ok()) return a.status();
  if (absl::Status s = ProbeBind(*a, addr, flag); !s.ok()) return s;
  std::unique_ptr<MetricsServer> server(new MetricsServer);
  server->host_ = a->host;
  try {
    // Two threads: a scrape is small, but a Kubernetes probe may arrive
    // while Prometheus scrapes.
    server->exposer_ = std::make_unique<prometheus::Exposer>(
        absl::StrCat(a->host, ":", a->port), /*num_threads=*/2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat(flag, " ", Quote(addr), ": cannot listen: ", e.what()));
  }
  std::vector<int> ports = server->exposer_->GetListeningPorts();
  if (ports.empty())
    return absl::UnavailableError(
        absl::StrCat(flag, " ", Quote(addr), ": cannot listen"));
  server->port_ = ports.front();
  for (const auto& c : collectables) server->exposer_->RegisterCollectable(c);
  return server;
}

MetricsServer::~MetricsServer() = default;

std::string MetricsServer::address() const {
  return absl::StrCat(host_, ":", port_);
}

}  // namespace ckpt
