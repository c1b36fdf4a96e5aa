// Saves and restores of CUDA tensors through a real ckptd (built only with
// CUDA; every test skips when the runtime sees no device). Device tensors
// travel by cudaMemcpyAsync between the GPU and the pinned arena; their
// checksums are computed by the daemon while it persists, so the file on
// disk must carry the checksums of the bytes that were on the device.
//
// The binary has its own main: run with CKPT_CUDA_SAVE_LOOP=<socket>:<job>
// it is the trainer that TrainerKilledDuringADeviceCopyLeavesNoLockedSlot
// SIGKILLs (it saves a large device tensor in a loop and prints "saved N").
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ckpt/client.h"
#include "storage/backend.h"
#include "storage/shard_reader.h"
#include "tests/daemon_test.h"
#include "util/checksum.h"

namespace ckpt::testing {
namespace {

bool HaveDevice() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
}

#define SKIP_WITHOUT_DEVICE() \
  if (!HaveDevice()) GTEST_SKIP() << "no CUDA device on this machine"

// A device buffer with a host mirror of what it holds.
struct DeviceBuf {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<unsigned char> host;  // the bytes the device holds
  void* dev = nullptr;

  DeviceBuf(std::string n, DType d, std::vector<int64_t> s, uint64_t bytes,
            uint32_t seed)
      : name(std::move(n)), dtype(d), shape(std::move(s)), host(bytes) {
    uint64_t x = 0x9E3779B97F4A7C15ull * (seed + 1);
    for (auto& b : host) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      b = static_cast<unsigned char>(x);
    }
    if (bytes > 0) {
      EXPECT_EQ(cudaMalloc(&dev, bytes), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(dev, host.data(), bytes, cudaMemcpyHostToDevice),
                cudaSuccess);
    }
  }
  ~DeviceBuf() {
    if (dev) (void)cudaFree(dev);
  }
  DeviceBuf(const DeviceBuf&) = delete;
  Tensor tensor() const {
    return Tensor{name, dtype, shape, dev, Device::Cuda(0)};
  }
  void Zero() {
    if (dev) {
      ASSERT_EQ(cudaMemset(dev, 0, host.size()), cudaSuccess);
    }
  }
  std::vector<unsigned char> DeviceBytes() const {
    std::vector<unsigned char> out(host.size());
    if (dev) {
      EXPECT_EQ(cudaMemcpy(out.data(), dev, out.size(), cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
    return out;
  }
};

// fp32 of one element; bf16 of 2049 (4,098 bytes: not a multiple of 4 KiB);
// fp32 of 3 MiB + 12 bytes; uint8 of 64 MiB + 4,097 bytes (crosses the
// copier's 64 MiB piece).
std::vector<std::unique_ptr<DeviceBuf>> MakeDeviceState(uint32_t seed) {
  std::vector<std::unique_ptr<DeviceBuf>> v;
  v.push_back(std::make_unique<DeviceBuf>("scalar", DType::kFloat32,
                                          std::vector<int64_t>{1}, 4, seed));
  v.push_back(std::make_unique<DeviceBuf>("bf16.odd", DType::kBFloat16,
                                          std::vector<int64_t>{2049}, 4098,
                                          seed + 1));
  v.push_back(std::make_unique<DeviceBuf>("fp32.w", DType::kFloat32,
                                          std::vector<int64_t>{786435},
                                          786435ull * 4, seed + 2));
  const int64_t big = (int64_t{64} << 20) + 4097;
  v.push_back(std::make_unique<DeviceBuf>(
      "u8.big", DType::kUInt8, std::vector<int64_t>{big}, big, seed + 3));
  return v;
}

std::vector<Tensor> TensorsOf(
    const std::vector<std::unique_ptr<DeviceBuf>>& s) {
  std::vector<Tensor> t;
  for (const auto& b : s) t.push_back(b->tensor());
  return t;
}

class CudaTest : public DaemonTest {};

TEST_F(CudaTest, DeviceTensorsRoundTripBitExactIntoDeviceAndHostTensors) {
  SKIP_WITHOUT_DEVICE();
  auto client = Connect("cuda.roundtrip");
  ASSERT_NE(client, nullptr);
  auto s1 = MakeDeviceState(1);
  ASSERT_TRUE(client->Save(1, TensorsOf(s1)).ok());

  // From shared memory into device tensors.
  for (auto& b : s1) b->Zero();
  absl::Status st = client->Restore(1, TensorsOf(s1));
  ASSERT_TRUE(st.ok()) << st;
  for (const auto& b : s1) EXPECT_TRUE(b->DeviceBytes() == b->host) << b->name;

  // From shared memory into host tensors.
  std::vector<std::vector<unsigned char>> host(s1.size());
  std::vector<Tensor> into_host;
  for (size_t i = 0; i < s1.size(); ++i) {
    host[i].assign(s1[i]->host.size(), 0);
    into_host.push_back(Tensor{s1[i]->name, s1[i]->dtype, s1[i]->shape,
                               host[i].data(), Device::Host()});
  }
  st = client->Restore(1, into_host);
  ASSERT_TRUE(st.ok()) << st;
  for (size_t i = 0; i < s1.size(); ++i)
    EXPECT_TRUE(host[i] == s1[i]->host) << s1[i]->name;

  // Two later saves take both slots: step 1 then comes from its file.
  ASSERT_TRUE(client->WaitDurable(1).ok());
  auto s2 = MakeDeviceState(2);
  ASSERT_TRUE(client->Save(2, TensorsOf(s2)).ok());
  ASSERT_TRUE(client->Save(3, TensorsOf(s2)).ok());
  for (auto& b : s1) b->Zero();
  st = client->Restore(1, TensorsOf(s1));
  ASSERT_TRUE(st.ok()) << st;
  for (const auto& b : s1)
    EXPECT_TRUE(b->DeviceBytes() == b->host) << b->name << " from disk";
}

TEST_F(CudaTest, ShardFileCarriesTheChecksumsOfTheDeviceBytes) {
  SKIP_WITHOUT_DEVICE();
  auto client = Connect("cuda.sums");
  ASSERT_NE(client, nullptr);
  auto s = MakeDeviceState(7);
  std::vector<unsigned char> hostbytes(1 << 20);
  for (size_t i = 0; i < hostbytes.size(); ++i) hostbytes[i] = i * 31;
  std::vector<Tensor> t = TensorsOf(s);
  t.push_back(Tensor{"host.mixed",
                     DType::kUInt8,
                     {static_cast<int64_t>(hostbytes.size())},
                     hostbytes.data(),
                     Device::Host()});
  ASSERT_TRUE(client->Save(4, t).ok());
  ASSERT_TRUE(client->WaitDurable(4).ok());

  storage::LocalBackendOptions lo;
  lo.root = root();
  // The daemon is live: its temporary files (this step's MANIFEST, being
  // written) are not leftovers to sweep.
  lo.remove_tmp_files = false;
  auto local = storage::NewLocalBackend(lo);
  ASSERT_TRUE(local.ok()) << local.status();
  std::string key;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root()))
    if (e.path().extension() == ".shard" &&
        e.path().string().find("cuda.sums") != std::string::npos)
      key = std::filesystem::relative(e.path(), root()).string();
  ASSERT_FALSE(key.empty());
  auto info = storage::ReadShardInfo(**local, key);
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->tensors.size(), t.size());
  for (const storage::ShardTensor& st : info->tensors) {
    const std::vector<unsigned char>* want = &hostbytes;
    for (const auto& b : s)
      if (b->name == st.name) want = &b->host;
    EXPECT_EQ(st.checksum, TensorChecksum(want->data(), want->size()))
        << st.name;
  }
  absl::Status v = storage::VerifyShard(**local, key);
  EXPECT_TRUE(v.ok()) << v;
}

// The child side: saves a 1 GiB device tensor in a loop until killed.
int SaveLoop(const std::string& socket, const std::string& job) {
  ClientOptions o;
  o.socket_path = socket;
  o.job = job;
  o.rank = 0;
  o.world_size = 1;
  auto c = Client::Connect(o);
  if (!c.ok()) {
    std::fprintf(stderr, "save loop: %s\n",
                 std::string(c.status().message()).c_str());
    return 2;
  }
  const uint64_t bytes = 1ull << 30;
  void* dev = nullptr;
  if (cudaMalloc(&dev, bytes) != cudaSuccess ||
      cudaMemset(dev, 0x5a, bytes) != cudaSuccess)
    return 3;
  Tensor t{"big",
           DType::kUInt8,
           {static_cast<int64_t>(bytes)},
           dev,
           Device::Cuda(0)};
  for (int64_t step = 1;; ++step) {
    absl::Status s = (*c)->Save(step, {&t, 1});
    if (!s.ok()) {
      std::fprintf(stderr, "save loop: %s\n", std::string(s.message()).c_str());
      return 4;
    }
    std::printf("saved %lld\n", static_cast<long long>(step));
    std::fflush(stdout);
  }
}

TEST_F(CudaTest, TrainerKilledDuringADeviceCopyLeavesNoLockedSlot) {
  SKIP_WITHOUT_DEVICE();
  const std::string job = "cuda.killed";
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string env = "CKPT_CUDA_SAVE_LOOP=" + daemon_->socket() + ":" + job;
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(out[1], 1);
    close(out[0]);
    putenv(env.data());
    execl(self.c_str(), self.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  FILE* f = fdopen(out[0], "r");
  char line[64];
  int saved = 0;
  while (saved < 3 && std::fgets(line, sizeof line, f)) ++saved;
  ASSERT_EQ(saved, 3) << "the child saved fewer than 3 steps";
  // Kill while the next copy runs: the loop spends nearly all its time in it.
  usleep(15 * 1000);
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  std::fclose(f);
  ASSERT_TRUE(WIFSIGNALED(status));

  // Both slots must come back: two saves need two free slots, within the
  // reaper's time, not the 10-minute busy timeout.
  ClientOptions o = OptionsFor(*daemon_, job, 0, 1);
  o.busy_timeout = std::chrono::seconds(30);
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto s = MakeDeviceState(9);
  auto latest = (*c)->LatestStep();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_GE(*latest, 3);
  for (int64_t step = *latest + 1; step <= *latest + 2; ++step) {
    absl::Status st = (*c)->Save(step, TensorsOf(s));
    ASSERT_TRUE(st.ok()) << "step " << step << ": " << st;
  }
  for (auto& b : s) b->Zero();
  absl::Status st = (*c)->Restore(*latest + 2, TensorsOf(s));
  ASSERT_TRUE(st.ok()) << st;
  for (const auto& b : s) EXPECT_TRUE(b->DeviceBytes() == b->host) << b->name;
}

}  // namespace
}  // namespace ckpt::testing

int main(int argc, char** argv) {
  if (const char* loop = std::getenv("CKPT_CUDA_SAVE_LOOP")) {
    std::string arg = loop;
    size_t colon = arg.rfind(':');
    return ckpt::testing::SaveLoop(arg.substr(0, colon), arg.substr(colon + 1));
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
