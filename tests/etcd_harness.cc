#include "tests/etcd_harness.h"

#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "coordinator/etcd/etcd_client.h"
#include "tests/test_util.h"

#ifndef ETCD_BINARY
#define ETCD_BINARY "/usr/bin/etcd"
#endif

namespace ckpt::testing {

EtcdCluster::EtcdCluster(std::string dir, int members,
                         coordinator::TlsFiles tls)
    : dir_(std::move(dir)), tls_(std::move(tls)) {
  std::filesystem::create_directories(dir_);
  std::string initial;
  for (int i = 0; i < members; ++i) {
    client_ports_.push_back(FreeLoopbackPort());
    peer_ports_.push_back(FreeLoopbackPort());
    initial += (i ? "," : "") + std::string("m") + std::to_string(i) +
               "=http://127.0.0.1:" + std::to_string(peer_ports_[i]);
  }
  for (int i = 0; i < members; ++i) {
    const std::string client = (tls_.enabled() ? "https" : "http") +
                               std::string("://127.0.0.1:") +
                               std::to_string(client_ports_[i]);
    const std::string peer =
        "http://127.0.0.1:" + std::to_string(peer_ports_[i]);
    std::vector<std::string> argv = {ETCD_BINARY,
                                     "--name",
                                     "m" + std::to_string(i),
                                     "--data-dir",
                                     dir_ + "/m" + std::to_string(i),
                                     "--listen-client-urls",
                                     client,
                                     "--advertise-client-urls",
                                     client,
                                     "--listen-peer-urls",
                                     peer,
                                     "--initial-advertise-peer-urls",
                                     peer,
                                     "--initial-cluster",
                                     initial,
                                     "--initial-cluster-state",
                                     "new",
                                     "--initial-cluster-token",
                                     "ckpt-test",
                                     "--max-txn-ops",
                                     "4096",
                                     "--log-level",
                                     "warn"};
    if (tls_.enabled())
      argv.insert(argv.end(),
                  {"--cert-file", tls_.cert, "--key-file", tls_.key,
                   "--trusted-ca-file", tls_.ca, "--client-cert-auth"});
    members_.push_back(
        Proc::Spawn(argv, dir_ + "/member-" + std::to_string(i) + ".log"));
  }
}

EtcdCluster::~EtcdCluster() {
  for (auto& m : members_)
    if (m) m->Kill();
}

std::string EtcdCluster::Endpoints() const {
  std::string out;
  for (size_t i = 0; i < client_ports_.size(); ++i)
    out += (i ? "," : "") + Endpoint(static_cast<int>(i));
  return out;
}

bool EtcdCluster::WaitHealthy(std::string* why) const {
  const auto credentials = coordinator::LoadClientCredentials(tls_);
  for (size_t i = 0; i < members_.size(); ++i) {
    absl::Status last = credentials.status();
    bool ok =
        credentials.ok() && Cluster::WaitUntil(
                                [&] {
                                  // A new channel per probe: one that failed
                                  // while the member was starting may wait out
                                  // a long reconnect backoff (seen with TLS).
                                  coordinator::etcd::EtcdClient client(
                                      {Endpoint(static_cast<int>(i))},
                                      std::chrono::seconds(1), *credentials);
                                  etcdserverpb::RangeRequest req;
                                  req.set_key("health-probe");
                                  last = client.Range(req).status();
                                  return last.ok();
                                },
                                std::chrono::seconds(30));
    if (!ok) {
      *why = "etcd member " + std::to_string(i) +
             " never served: " + std::string(last.message()) + "\n" + Logs();
      return false;
    }
  }
  return true;
}

void EtcdCluster::Kill(int i) {
  if (members_.at(i)) members_[i]->Kill();
  members_[i].reset();
}

std::string EtcdCluster::Logs() const {
  std::string out;
  for (size_t i = 0; i < members_.size(); ++i) {
    std::ifstream in(dir_ + "/member-" + std::to_string(i) + ".log");
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    if (text.size() > 3000) text = "...\n" + text.substr(text.size() - 3000);
    out += "==== etcd member " + std::to_string(i) + "\n" + text + "\n";
  }
  return out;
}

}  // namespace ckpt::testing
