// replica_bench: what the peer-replica transport (proto/replica.proto,
// doc/replicas.md) costs against the limit, in one run on one loopback:
//   tcp       a plain TCP sender/receiver of the same bytes (2 MiB writes
//             from the image, reads into pre-faulted memory): the limit;
//   grpc      Put to a real ReplicaServer, plaintext (--insecure): chunks,
//             the holder's copy into its own shared memory, and its
//             verification (header, index, footer, every tensor checksum);
//   grpc_tls  the same under mutual TLS with certificates of one CA
//             (tests/make_certs.sh): the payload-encryption cost;
//   get, get_tls  a fetch (Get) of the held copy into pre-faulted memory,
//             the direction a node-loss recovery waits for;
//   bulk, bulk_get  the bulk path (daemon/replica/replica_bulk*.h): the
//             offer over the gRPC channel (mTLS when certificates could be
//             made), the bytes over plain TCP with the offer's token, into
//             the reservation (put, then the holder's verification) or
//             pre-faulted memory (get);
//   verify    the holder's verification alone (VerifyReplicaImage).
// Repeats are interleaved (tcp, grpc, grpc_tls per round) and medians
// reported; --json prints one object.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/huge_buffer.h"
#include "bench/stats.h"
#include "daemon/replica/replica_bulk_client.h"
#include "daemon/replica/replica_client.h"
#include "daemon/replica/replica_service.h"
#include "daemon/replica/replica_store.h"
#include "storage/shard_format.h"
#include "util/checksum.h"
#include "util/program.h"

namespace {

using ckpt::bench::Clock;
using ckpt::bench::Median;
using ckpt::bench::Since;
namespace rv1 = ::ckpt::replica::v1;

// A shard image of `bytes` of tensor data in 64 MiB tensors.
std::vector<char> MakeImage(uint64_t bytes, rv1::ShardCopy* copy) {
  ckpt::storage::ShardInfo info;
  info.job = "bench";
  info.step = 1;
  info.world_size = 1;
  std::vector<uint64_t> sizes;
  for (uint64_t left = bytes; left > 0;) {
    const uint64_t n = std::min<uint64_t>(left, 64ull << 20);
    ckpt::storage::ShardTensor t;
    t.name = "t" + std::to_string(sizes.size());
    t.dtype = ckpt::DType::kUInt8;
    t.shape = {n};
    t.bytes = n;
    info.tensors.push_back(t);
    sizes.push_back(n);
    left -= n;
  }
  auto layout = ckpt::storage::ComputeLayout(sizes);
  std::vector<char> image(layout->image_bytes);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i + 8 <= image.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(&image[i], &v, 8);
  }
  *copy = rv1::ShardCopy();
  copy->set_job("bench");
  copy->set_rank(0);
  copy->set_world_size(1);
  copy->set_image_bytes(image.size());
  copy->set_source_node("n1");
  for (size_t i = 0; i < info.tensors.size(); ++i) {
    auto& t = info.tensors[i];
    t.offset = layout->tensor_offsets[i];
    t.checksum = ckpt::TensorChecksum(image.data() + t.offset, t.bytes);
    copy->add_checksums(t.checksum);
  }
  if (!ckpt::storage::EncodeShardMetadata(info, image).ok()) std::abort();
  return image;
}

// One plain TCP transfer of `image` over loopback; seconds until the
// receiver has every byte (it answers one byte).
double TcpOnce(const std::vector<char>& image, char* sink) {
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      listen(ls, 1) != 0 ||
      getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    std::abort();
  std::thread rx([&] {
    int c = accept(ls, nullptr, nullptr);
    uint64_t got = 0;
    while (got < image.size()) {
      ssize_t n = read(c, sink + got, image.size() - got);
      if (n <= 0) std::abort();
      got += static_cast<uint64_t>(n);
    }
    char ok = 1;
    if (write(c, &ok, 1) != 1) std::abort();
    close(c);
  });
  const auto t0 = Clock::now();
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) std::abort();
  for (uint64_t off = 0; off < image.size();) {
    const uint64_t n = std::min<uint64_t>(2 << 20, image.size() - off);
    ssize_t w = write(s, image.data() + off, n);
    if (w <= 0) std::abort();
    off += static_cast<uint64_t>(w);
  }
  char ok = 0;
  if (read(s, &ok, 1) != 1) std::abort();
  const double secs = Since(t0);
  close(s);
  rx.join();
  close(ls);
  return secs;
}

struct Holder {
  std::unique_ptr<ckpt::daemon::ReplicaStore> store;
  std::unique_ptr<ckpt::daemon::ReplicaServer> server;
  std::shared_ptr<grpc::Channel> channel;
};

Holder StartHolder(uint64_t budget, const ckpt::coordinator::TlsFiles& server,
                   const ckpt::coordinator::TlsFiles& client) {
  Holder h;
  h.store = std::make_unique<ckpt::daemon::ReplicaStore>(budget);
  ckpt::daemon::ReplicaServerOptions so;
  so.host = "127.0.0.1";
  so.tls = server;
  auto s = ckpt::daemon::ReplicaServer::Start(so, h.store.get(), nullptr);
  if (!s.ok()) {
    std::fprintf(stderr, "replica server: %s\n", s.status().ToString().c_str());
    std::exit(1);
  }
  h.server = std::move(*s);
  h.channel = *ckpt::daemon::ReplicaChannel(client, "n2", "127.0.0.1",
                                            h.server->port());
  return h;
}

double PutOnce(Holder& h, rv1::ShardCopy copy, uint64_t step,
               const std::vector<char>& image,
               ckpt::daemon::ReplicaTransport transport =
                   ckpt::daemon::ReplicaTransport::kGrpc) {
  // The image names step 1; the holder checks the step it names, so each
  // round puts generation `step` of step 1.
  copy.set_step(1);
  copy.set_generation(step);
  ckpt::daemon::PutOptions po;
  po.deadline = std::chrono::system_clock::now() + std::chrono::minutes(5);
  const auto t0 = Clock::now();
  auto r = ckpt::daemon::SendReplica(transport, *h.channel, "127.0.0.1", copy,
                                     image.data(), po);
  const double secs = Since(t0);
  if (!r.ok()) {
    std::fprintf(stderr, "put: %s\n", r.status().ToString().c_str());
    std::exit(1);
  }
  return secs;
}

// One Get of the held copy (step 1, the newest generation) into `sink`,
// pre-faulted as the slot a fetch fills would be.
double GetOnce(Holder& h, char* sink,
               ckpt::daemon::ReplicaTransport transport =
                   ckpt::daemon::ReplicaTransport::kGrpc) {
  rv1::GetRequest req;
  req.set_job("bench");
  req.set_step(1);
  req.set_rank(0);
  req.set_replica(true);
  const auto t0 = Clock::now();
  auto r = ckpt::daemon::FetchReplica(
      transport, *h.channel, "127.0.0.1", req,
      [&](const rv1::ShardCopy&) -> absl::StatusOr<char*> { return sink; },
      std::chrono::system_clock::now() + std::chrono::minutes(5));
  const double secs = Since(t0);
  if (!r.ok()) {
    std::fprintf(stderr, "get: %s\n", r.status().ToString().c_str());
    std::exit(1);
  }
  return secs;
}

}  // namespace

int main(int argc, char** argv) {
  if (ckpt::PrintedVersion(argc, argv, "replica_bench", CKPT_VERSION)) return 0;
  uint64_t mib = 256;
  int repeats = 5;
  bool json = false;
  std::string certs_script = MAKE_CERTS_SCRIPT;
  CLI::App app{"replica_bench: the replica transport against plain TCP"};
  app.add_option("--mib", mib, "MiB of tensor data per copy")
      ->check(CLI::Range(1, 16384));
  app.add_option("--repeats", repeats, "interleaved rounds")
      ->check(CLI::Range(1, 100));
  app.add_flag("--json", json, "one JSON object");
  CLI11_PARSE(app, argc, argv);

  rv1::ShardCopy copy;
  const std::vector<char> image = MakeImage(mib << 20, &copy);
  const uint64_t bytes = image.size();
  // Pre-faulted, in the pages the receiver's slot would have.
  absl::StatusOr<ckpt::bench::HugeBuffer> sink_memory =
      ckpt::bench::HugeBuffer::Make(bytes);
  if (!sink_memory.ok()) std::abort();
  char* sink = sink_memory->data();

  char tmpl[] = "/tmp/replica-bench-XXXXXX";
  const std::string certs = mkdtemp(tmpl);
  const bool tls =
      std::system(
          ("sh " + certs_script + " " + certs + " >/dev/null 2>&1").c_str()) ==
      0;
  auto files = [&](const std::string& name) {
    ckpt::coordinator::TlsFiles t;
    t.cert = certs + "/" + name + ".pem";
    t.key = certs + "/" + name + ".key";
    t.ca = certs + "/ca.pem";
    return t;
  };
  Holder plain = StartHolder(3 * bytes, {}, {});
  Holder secure;
  if (tls) secure = StartHolder(3 * bytes, files("n2"), files("n1"));

  std::vector<double> tcp, grpc_plain, grpc_tls, verify, get_plain, get_tls,
      bulk, bulk_get;
  constexpr auto kBulk = ckpt::daemon::ReplicaTransport::kBulk;
  Holder& control = tls ? secure : plain;  // the bulk path's offer channel
  PutOnce(plain, copy, 1, image);  // warm: channel up, pages mapped once
  if (tls) PutOnce(secure, copy, 1, image);
  for (int r = 0; r < repeats; ++r) {
    tcp.push_back(TcpOnce(image, sink));
    grpc_plain.push_back(PutOnce(plain, copy, 2 + 2 * r, image));
    if (tls) grpc_tls.push_back(PutOnce(secure, copy, 2 + 2 * r, image));
    bulk.push_back(PutOnce(control, copy, 3 + 2 * r, image, kBulk));
    get_plain.push_back(GetOnce(plain, sink));
    if (tls) get_tls.push_back(GetOnce(secure, sink));
    bulk_get.push_back(GetOnce(control, sink, kBulk));
    const auto t0 = Clock::now();
    copy.set_step(1);
    if (!ckpt::daemon::VerifyReplicaImage(image.data(), copy, "bench").ok())
      std::abort();
    verify.push_back(Since(t0));
  }
  const double gb = static_cast<double>(bytes) / 1e9;
  const double t = Median(tcp), g = Median(grpc_plain), s = Median(grpc_tls),
               v = Median(verify), gp = Median(get_plain), gs = Median(get_tls),
               b = Median(bulk), bg = Median(bulk_get);
  // Puts after the first two take an evicted copy's mapping (spare).
  const uint64_t reused =
      plain.store->Stats().reused + (tls ? secure.store->Stats().reused : 0);
  if (json) {
    std::printf(
        "{\"bytes\": %llu, \"repeats\": %d, \"tcp_s\": %.4f, \"grpc_s\": %.4f, "
        "\"grpc_tls_s\": %.4f, \"verify_s\": %.4f, \"tcp_gbps\": %.3f, "
        "\"grpc_gbps\": %.3f, \"grpc_tls_gbps\": %.3f, \"grpc_vs_tcp\": %.3f, "
        "\"tls_vs_plain\": %.3f, \"get_s\": %.4f, \"get_tls_s\": %.4f, "
        "\"get_vs_tcp\": %.3f, \"bulk_s\": %.4f, \"bulk_vs_tcp\": %.3f, "
        "\"bulk_get_s\": %.4f, \"bulk_get_vs_tcp\": %.3f, "
        "\"bulk_control_tls\": %s, \"holder_reused_mappings\": %llu}\n",
        static_cast<unsigned long long>(bytes), repeats, t, g, s, v, gb / t,
        gb / g, tls ? gb / s : 0.0, g / t, tls ? s / g : 0.0, gp, gs, gp / t, b,
        b / t, bg, bg / t, tls ? "true" : "false",
        static_cast<unsigned long long>(reused));
  } else {
    std::printf("copy of %.1f MiB, median of %d interleaved rounds\n",
                static_cast<double>(bytes) / (1 << 20), repeats);
    std::printf("  plain TCP (limit)   %8.4f s  %6.2f GB/s\n", t, gb / t);
    std::printf("  gRPC Put, plaintext %8.4f s  %6.2f GB/s  %.2fx TCP\n", g,
                gb / g, g / t);
    if (tls)
      std::printf(
          "  gRPC Put, mTLS      %8.4f s  %6.2f GB/s  %.2fx plaintext\n", s,
          gb / s, s / g);
    std::printf("  gRPC Get, plaintext %8.4f s  %6.2f GB/s  %.2fx TCP\n", gp,
                gb / gp, gp / t);
    if (tls)
      std::printf(
          "  gRPC Get, mTLS      %8.4f s  %6.2f GB/s  %.2fx plaintext\n", gs,
          gb / gs, gs / gp);
    std::printf("  bulk put (%s offer) %8.4f s  %6.2f GB/s  %.2fx TCP\n",
                tls ? "mTLS" : "plain", b, gb / b, b / t);
    std::printf("  bulk get (%s offer) %8.4f s  %6.2f GB/s  %.2fx TCP\n",
                tls ? "mTLS" : "plain", bg, gb / bg, bg / t);
    std::printf("  holder's verify     %8.4f s  %6.2f GB/s\n", v, gb / v);
    std::printf("  copies that took an evicted copy's mapping: %llu\n",
                static_cast<unsigned long long>(reused));
  }
  std::system(("rm -rf " + certs).c_str());
  return 0;
}
