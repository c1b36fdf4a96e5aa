// A real etcd cluster for the HA tests: N members of Debian's etcd binary
// (ETCD_BINARY, default /usr/bin/etcd) on loopback, each on two free ports
// (client, peer) with its own data directory under `dir`, started together
// as one new cluster. Members are child processes (they die with the test)
// that tests stop and kill with real signals; each logs to member-N.log.
// --max-txn-ops is raised so one coordinator operation fits one Txn
// (doc/ha-etcd.md). With `tls`, members serve clients over mutual TLS only
// (the files are both etcd's server certificate and what it trusts for
// client certificates). Not thread-safe: one test thread drives it.
#ifndef CKPT_TESTS_ETCD_HARNESS_H_
#define CKPT_TESTS_ETCD_HARNESS_H_

#include <memory>
#include <string>
#include <vector>

#include "coordinator/client/tls.h"
#include "tests/cluster_harness.h"

namespace ckpt::testing {

class EtcdCluster {
 public:
  EtcdCluster(std::string dir, int members,
              coordinator::TlsFiles tls = coordinator::TlsFiles());
  ~EtcdCluster();

  // False (with the logs in *why) unless every member serves within 30 s.
  bool WaitHealthy(std::string* why) const;
  std::string Endpoint(int i) const {
    return "127.0.0.1:" + std::to_string(client_ports_.at(i));
  }
  std::string Endpoints() const;  // "A:P,B:P,C:P"
  // "etcd://A:P,B:P,C:P/prefix"
  std::string StateUrl(const std::string& prefix) const {
    return "etcd://" + Endpoints() + "/" + prefix;
  }
  void Kill(int i);
  bool Running(int i) const { return members_.at(i) != nullptr; }
  std::string Logs() const;

 private:
  const std::string dir_;
  const coordinator::TlsFiles tls_;
  std::vector<int> client_ports_, peer_ports_;
  std::vector<std::unique_ptr<Proc>> members_;
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_ETCD_HARNESS_H_
