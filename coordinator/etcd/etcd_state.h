// `--state etcd://HOST:PORT[,HOST:PORT...]/PREFIX`: the coordinator's
// option parsing needs only this, not the etcd client and its generated
// gRPC API (etcd_client.h), so ckptd's embedded coordinator builds and
// links without them.
#ifndef CKPT_COORDINATOR_ETCD_ETCD_STATE_H_
#define CKPT_COORDINATOR_ETCD_ETCD_STATE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt::coordinator::etcd {

struct EtcdState {
  std::vector<std::string> endpoints;  // HOST:PORT each
  std::string prefix;  // "/PREFIX/": every key of ours starts with it
};

// True when `state` starts with "etcd://".
bool IsEtcdState(const std::string& state);
// InvalidArgument naming `flag` unless `state` is
// etcd://HOST:PORT[,HOST:PORT...]/PREFIX with a non-empty PREFIX of
// [A-Za-z0-9._/-].
[[nodiscard]] absl::StatusOr<EtcdState> ParseEtcdState(const std::string& state,
                                                       const std::string& flag);

}  // namespace ckpt::coordinator::etcd

#endif  // CKPT_COORDINATOR_ETCD_ETCD_STATE_H_
