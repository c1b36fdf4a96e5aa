// A trainer's smallest C++ use of the installed libckpt, built outside the
// tree with CMake's find_package(ckpt) and ckpt::client (packaging/tests/).
// No argument: resolves the rank as a launcher-less process (rank 0 of 1)
// and names a dtype, no daemon needed. SOCKET JOB: saves step 1 of two
// tensors to the ckptd at SOCKET, waits until it is durable, restores it
// into zeroed buffers and compares the bytes. Exit 0 when all of it worked.
#include <cstdio>
#include <cstring>
#include <vector>

#include "ckpt/client.h"

namespace {
int Fail(const char* what, const absl::Status& s) {
  std::fprintf(stderr, "consumer_cxx: %s: %s\n", what, s.ToString().c_str());
  return 1;
}
}  // namespace

int main(int argc, char** argv) {
  int rank = -1, world_size = -1;
  if (absl::Status s = ckpt::ResolveRank(&rank, &world_size, nullptr); !s.ok())
    return Fail("ResolveRank", s);
  if (argc < 3) {
    std::printf("consumer_cxx: rank %d of %d, %s is %zu bytes\n", rank,
                world_size,
                std::string(ckpt::DTypeName(ckpt::DType::kBFloat16)).c_str(),
                ckpt::DTypeSize(ckpt::DType::kBFloat16));
    return 0;
  }
  ckpt::ClientOptions options;
  options.socket_path = argv[1];
  options.job = argv[2];
  options.rank = 0;
  options.world_size = 1;
  auto client = ckpt::Client::Connect(options);
  if (!client.ok()) return Fail("Connect", client.status());
  std::vector<double> w(4096), w_back(4096);
  std::vector<int64_t> b(17), b_back(17);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 1.0 / (1.0 + i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = -3 * static_cast<int64_t>(i);
  std::vector<ckpt::Tensor> tensors = {
      {"layer/w",
       ckpt::DType::kFloat64,
       {64, 64},
       w.data(),
       ckpt::Device::Host()},
      {"layer/b", ckpt::DType::kInt64, {17}, b.data(), ckpt::Device::Host()}};
  if (absl::Status s = (*client)->Save(1, tensors); !s.ok())
    return Fail("Save", s);
  if (absl::Status s = (*client)->WaitDurable(1); !s.ok())
    return Fail("WaitDurable", s);
  tensors[0].data = w_back.data();
  tensors[1].data = b_back.data();
  if (absl::Status s = (*client)->Restore(1, tensors); !s.ok())
    return Fail("Restore", s);
  if (std::memcmp(w.data(), w_back.data(), w.size() * sizeof(double)) != 0 ||
      std::memcmp(b.data(), b_back.data(), b.size() * sizeof(int64_t)) != 0)
    return Fail("compare", absl::DataLossError("restored bytes differ"));
  std::printf("consumer_cxx: step 1 saved and restored bit-exact\n");
  return 0;
}
