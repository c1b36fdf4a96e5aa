// Helpers shared by the integration tests that talk to ckptd's RPCs
// directly (bad input, engine refusals, hostile clients): a canonical
// two-tensor commit, and running tests/uid_probe as another uid.
// Header-only (integration_test defines UID_PROBE_BINARY); thread-safe.
#ifndef CKPT_TESTS_RPC_HELPERS_H_
#define CKPT_TESTS_RPC_HELPERS_H_

#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "ckpt.pb.h"
#include "ckpt/tensor.h"
#include "storage/shard_format.h"
#include "util/checksum.h"

namespace ckpt::testing {

// A commit of two 4 KiB float32 tensors named a and b at their canonical
// offsets. A fresh slot's bytes are zero, so the checksums match its bytes
// unless `corrupt`.
inline v1::CommitSaveRequest TwoZeroTensorCommit(const std::string& job,
                                                 uint64_t step,
                                                 const v1::BeginSaveResponse& b,
                                                 bool corrupt = false) {
  v1::CommitSaveRequest req;
  req.set_job(job);
  req.set_step(step);
  req.set_slot(b.slot());
  req.set_lease(b.lease());
  auto layout = storage::ComputeLayout(std::vector<uint64_t>{4096, 4096});
  std::vector<char> zeros(4096, 0);
  for (int i = 0; i < 2; ++i) {
    v1::TensorMeta* m = req.add_tensors();
    m->set_name(i == 0 ? "a" : "b");
    m->set_dtype(static_cast<uint32_t>(DType::kFloat32));
    m->add_shape(1024);
    m->set_offset(layout->tensor_offsets[i]);
    m->set_bytes(4096);
    m->set_checksum(TensorChecksum(zeros.data(), zeros.size()) ^
                    (corrupt ? 1 : 0));
    m->set_has_checksum(true);
  }
  return req;
}

#ifdef UID_PROBE_BINARY
// Runs uid_probe (as uid 65534) against job's arena shm on socket, with an
// optional mode ("status"); returns its exit code, -1 if it did not exit.
inline int RunUidProbe(const std::string& socket, const std::string& job,
                       const std::string& shm, const char* mode = nullptr) {
  pid_t child = fork();
  if (child < 0) return -1;
  if (child == 0) {
    execl(UID_PROBE_BINARY, UID_PROBE_BINARY, socket.c_str(), job.c_str(),
          shm.c_str(), mode, nullptr);
    _exit(127);
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}
#endif

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_RPC_HELPERS_H_
