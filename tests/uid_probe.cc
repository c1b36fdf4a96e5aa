// Runs as another uid and tries to reach a job it does not own; the exit
// status is a bitmask of the checks that let it in (0 = all refused).
// Usage: uid_probe SOCKET JOB SHM_NAME
//        uid_probe SOCKET JOB SHM_NAME status   (only: Status shows no arena)
#include <fcntl.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "ckpt.grpc.pb.h"

int main(int argc, char** argv) {
  if (argc != 4 && !(argc == 5 && std::string(argv[4]) == "status")) return 100;
  if (setgid(65534) != 0 || setuid(65534) != 0) return 101;
  auto stub = ckpt::v1::Ckptd::NewStub(grpc::CreateChannel(
      std::string("unix:") + argv[1], grpc::InsecureChannelCredentials()));
  if (argc == 5) {
    grpc::ClientContext ctx;
    ckpt::v1::StatusResponse resp;
    if (!stub->Status(&ctx, ckpt::v1::StatusRequest(), &resp).ok()) return 102;
    return resp.arenas_size() == 0 ? 0 : 32;
  }
  int bad = 0;
  {
    grpc::ClientContext ctx;
    ckpt::v1::ListRequest req;
    req.set_job(argv[2]);
    ckpt::v1::ListResponse resp;
    if (stub->List(&ctx, req, &resp).error_code() !=
        grpc::StatusCode::PERMISSION_DENIED)
      bad |= 1;
  }
  {
    grpc::ClientContext ctx;
    ckpt::v1::RegisterRequest req;
    req.set_job(argv[2]);
    req.set_world_size(1);
    req.set_slot_bytes(1 << 20);
    ckpt::v1::RegisterResponse resp;
    if (stub->Register(&ctx, req, &resp).error_code() !=
        grpc::StatusCode::PERMISSION_DENIED)
      bad |= 2;
  }
  {
    grpc::ClientContext ctx;
    ckpt::v1::DeleteRequest req;
    req.set_job(argv[2]);
    req.set_all_steps(true);
    ckpt::v1::DeleteResponse resp;
    if (stub->Delete(&ctx, req, &resp).error_code() !=
        grpc::StatusCode::PERMISSION_DENIED)
      bad |= 4;
  }
  {
    grpc::ClientContext ctx;
    ckpt::v1::ListRequest req;  // all jobs: the other uid's job is not listed
    ckpt::v1::ListResponse resp;
    if (!stub->List(&ctx, req, &resp).ok() || resp.jobs_size() != 0) bad |= 8;
  }
  if (shm_open(argv[3], O_RDWR, 0) >= 0) bad |= 16;
  return bad;
}
