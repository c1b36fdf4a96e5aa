#include "worker/data_parallel.h"

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/transport/tcp/device.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "util/status.h"
#include "worker/mesh_context.h"
#include "worker/phase_trace.h"
#include "worker/rendezvous_store.h"

namespace ckpt::worker {

namespace {

// The one place gloo's exceptions become a Status.
template <typename F>
absl::Status GlooCall(const std::string& what, F&& f) {
  try {
    f();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(what, ": ", e.what()));
  }
}

// The local address this host uses to reach host:port (a UDP connect sends
// nothing; it only picks the route), so gloo listens on that interface.
absl::StatusOr<std::string> LocalAddressFor(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
      rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MASTER_ADDR = \"", host, "\": cannot resolve: ", gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> guard(res, freeaddrinfo);
  int fd = socket(res->ai_family, SOCK_DGRAM, 0);
  if (fd < 0)
    return ErrnoToStatus(errno, "socket for the route to MASTER_ADDR");
  sockaddr_storage local{};
  socklen_t len = sizeof(local);
  int err = 0;
  if (connect(fd, res->ai_addr, res->ai_addrlen) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) {
    err = errno;
  }
  close(fd);
  if (err != 0)
    return ErrnoToStatus(err, absl::StrCat("route to MASTER_ADDR = ", host));
  char name[NI_MAXHOST];
  if (int rc = getnameinfo(reinterpret_cast<sockaddr*>(&local), len, name,
                           sizeof(name), nullptr, 0, NI_NUMERICHOST);
      rc != 0) {
    return absl::InternalError(
        absl::StrCat("local address for ", host, ": ", gai_strerror(rc)));
  }
  return std::string(name);
}

// A collective broke on a peer's link (closed, reset, or past its
// timeout): maybe the peer's node died. Said to the launcher before the
// worker exits, so that the coordinator probes the peers' nodes instead of
// planning this exit as a failure of its own ($CKPT_PEER_LOST_FILE,
// doc/operations.md "Detection from peers"). gloo does not say which rank,
// so the note names none.
void NotePeerLost() {
  const char* path = std::getenv("CKPT_PEER_LOST_FILE");
  if (path == nullptr || *path == '\0') return;
  if (FILE* f = std::fopen(path, "w")) {
    std::fputs("\n", f);
    std::fclose(f);
  }
}

}  // namespace

absl::Status ValidateDataParallelOptions(const DataParallelOptions& o) {
  if (o.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size = ", o.world_size, ": not positive"));
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank = ", o.rank, ": not in [0, world_size ", o.world_size, ")"));
  }
  if (o.world_size > 1 && o.master_addr.empty()) {
    return absl::InvalidArgumentError(
        "MASTER_ADDR: empty (needed when WORLD_SIZE > 1)");
  }
  if (o.master_port < 1 || o.master_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("MASTER_PORT = ", o.master_port, ": not in [1, 65535]"));
  }
  if (o.connect_timeout.count() <= 0 || o.collective_timeout.count() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("connect_timeout = ", o.connect_timeout.count(),
                     " ms, collective_timeout = ", o.collective_timeout.count(),
                     " ms: both must be positive"));
  }
  return absl::OkStatus();
}

DataParallel::DataParallel(const DataParallelOptions& options)
    : options_(options) {}
DataParallel::~DataParallel() {
  // Closing each pair and ending the device wait for a turn of gloo's loop:
  // immediate while armed (LoopTurns, mesh_context.h).
  if (turns_ != nullptr) turns_->Arm();
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    context_.reset();
  }
  // The last holder ends the loop (at its next turn) and joins it; held
  // elsewhere, the waker leaves the loop before it is gone.
  if (device_.use_count() == 1) device_.reset();
  turns_.reset();
}

absl::StatusOr<std::unique_ptr<DataParallel>> DataParallel::Create(
    const DataParallelOptions& options) {
  CKPT_RETURN_IF_ERROR(ValidateDataParallelOptions(options));
  return std::unique_ptr<DataParallel>(new DataParallel(options));
}

absl::StatusOr<std::unique_ptr<DataParallel>> DataParallel::Connect(
    const DataParallelOptions& options) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<DataParallel> dp, Create(options));
  CKPT_RETURN_IF_ERROR(dp->Rendezvous());
  return dp;
}

void DataParallel::Abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(abort_mu_);
  if (!aborted_.empty()) return;
  aborted_ = why.empty() ? "aborted" : why;
  broken_ = true;
  if (store_ != nullptr) store_->Abort(aborted_);
  if (context_ == nullptr) return;
  // Each failed pair leaves gloo's loop, a wait for its next turn: prompt
  // while armed (measured: 9.5 ms for a survivor's abort before).
  if (turns_ != nullptr) turns_->Arm();
  context_->Abort(aborted_);
  if (turns_ != nullptr) turns_->Disarm();
}

absl::Status DataParallel::Rendezvous() {
  const DataParallelOptions& o = options_;
  if (o.world_size == 1) return absl::OkStatus();
  std::string where =
      absl::StrCat("rendezvous of rank ", o.rank, " of ", o.world_size, " at ",
                   HostPort(o.master_addr, o.master_port), " (generation ",
                   o.generation, ")");
  gloo::transport::tcp::attr attr;
  if (!o.iface.empty()) {
    attr.iface = o.iface;
  } else {
    CKPT_ASSIGN_OR_RETURN(attr.hostname,
                          LocalAddressFor(o.master_addr, o.master_port));
  }
  auto context = std::make_shared<MeshContext>(o.rank, o.world_size);
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (!aborted_.empty())
      return absl::AbortedError(absl::StrCat(where, ": ", aborted_));
    store_ = GrpcStore::Create(o.master_addr, o.master_port, o.connect_timeout);
    context_ = context;
  }
  if (o.rank == 0 && !o.store_served) {
    absl::StatusOr<std::unique_ptr<StoreServer>> server =
        StoreServer::Start(o.master_addr, o.master_port);
    if (!server.ok())
      return Annotate(server.status(), "rank 0 (MASTER_ADDR:MASTER_PORT)");
    server_ = std::move(*server);
  }
  Phase("store_created", o.rank);
  CKPT_RETURN_IF_ERROR(store_->WaitConnected(o.connect_timeout));
  Phase("store_connected", o.rank);
  absl::Status s = GlooCall(where, [&] {
    std::shared_ptr<gloo::transport::Device> device =
        gloo::transport::tcp::CreateDevice(attr);
    Phase("device_created", o.rank);
    device_ = device;
    {
      std::lock_guard<std::mutex> lock(abort_mu_);  // Abort arms it
      turns_ = std::make_unique<LoopTurns>(device);
    }
    // Peers connect within the join window; later collectives get the
    // shorter timeout.
    context->setTimeout(o.connect_timeout);
    context->ConnectFullMesh(*store_, std::move(device),
                             absl::StrCat("generation/", o.generation, "/"),
                             turns_.get());
    context->setTimeout(o.collective_timeout);
  });
  std::lock_guard<std::mutex> lock(abort_mu_);
  if (!aborted_.empty())
    return absl::AbortedError(absl::StrCat(where, ": ", aborted_));
  return s;
}

absl::Status DataParallel::CollectiveFailed(const absl::Status& s) {
  broken_ = true;
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (!aborted_.empty()) return absl::AbortedError(aborted_);
  }
  NotePeerLost();
  return Annotate(
      s, absl::StrCat("a peer rank died or stalled (collective timeout ",
                      options_.collective_timeout.count() / 1000.0, " s)"));
}

absl::Status DataParallel::AllReduceMean(std::span<float> values) {
  if (options_.world_size == 1 || values.empty()) return absl::OkStatus();
  std::string what =
      absl::StrCat("allreduce of ", values.size(), " floats on rank ",
                   options_.rank, " of ", options_.world_size);
  absl::Status s = GlooCall(what, [&] {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(values.data(), values.size());
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(
            &gloo::sum<float>));
    opts.setTag(next_tag_++);
    opts.setTimeout(options_.collective_timeout);
    gloo::allreduce(opts);
  });
  if (!s.ok()) return CollectiveFailed(s);
  const float w = static_cast<float>(options_.world_size);
  for (float& v : values) v /= w;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint64_t>> DataParallel::AllGather(uint64_t value) {
  std::vector<uint64_t> all(options_.world_size, value);
  if (options_.world_size == 1) return all;
  std::string what = absl::StrCat("allgather on rank ", options_.rank, " of ",
                                  options_.world_size);
  absl::Status s = GlooCall(what, [&] {
    gloo::AllgatherOptions opts(context_);
    opts.setInput(&value, 1);
    opts.setOutput(all.data(), all.size());
    opts.setTag(next_tag_++);
    opts.setTimeout(options_.collective_timeout);
    gloo::allgather(opts);
  });
  if (!s.ok()) return CollectiveFailed(s);
  return all;
}

absl::Status DataParallel::GatherBytes(const void* mine, size_t mine_count,
                                       void* all, size_t all_count,
                                       size_t elem_size,
                                       const std::vector<size_t>& counts) {
  const size_t world = static_cast<size_t>(options_.world_size);
  if (counts.size() != world)
    return absl::InvalidArgumentError(
        absl::StrCat("allgatherv: counts has ", counts.size(),
                     " entries, world size is ", world));
  if (counts[options_.rank] != mine_count)
    return absl::InvalidArgumentError(absl::StrCat(
        "allgatherv: counts[", options_.rank, "] = ", counts[options_.rank],
        ", this rank gives ", mine_count));
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  if (total != all_count)
    return absl::InvalidArgumentError(
        absl::StrCat("allgatherv: the counts add up to ", total,
                     ", the output holds ", all_count));
  if (world == 1) {
    if (mine_count > 0 && mine != all)
      std::memmove(all, mine, mine_count * elem_size);
    return absl::OkStatus();
  }
  std::vector<size_t> bytes(world);
  for (size_t r = 0; r < world; ++r) bytes[r] = counts[r] * elem_size;
  std::string what = absl::StrCat("allgatherv of ", total, " elements on rank ",
                                  options_.rank, " of ", world);
  absl::Status s = GlooCall(what, [&] {
    gloo::AllgathervOptions opts(context_);
    // gloo reads the input; its API takes a mutable pointer.
    opts.setInput(static_cast<uint8_t*>(const_cast<void*>(mine)),
                  mine_count * elem_size);
    opts.setOutput(static_cast<uint8_t*>(all), bytes);
    opts.setTag(next_tag_++);
    opts.setTimeout(options_.collective_timeout);
    gloo::allgatherv(opts);
  });
  if (!s.ok()) return CollectiveFailed(s);
  return absl::OkStatus();
}

absl::Status DataParallel::AllGatherV(std::span<const uint16_t> mine,
                                      std::span<uint16_t> all,
                                      const std::vector<size_t>& counts) {
  return GatherBytes(mine.data(), mine.size(), all.data(), all.size(),
                     sizeof(uint16_t), counts);
}

absl::Status DataParallel::AllGatherV(std::span<const float> mine,
                                      std::span<float> all,
                                      const std::vector<size_t>& counts) {
  return GatherBytes(mine.data(), mine.size(), all.data(), all.size(),
                     sizeof(float), counts);
}

}  // namespace ckpt::worker
