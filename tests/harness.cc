#include "tests/harness.h"

#include <dirent.h>
#include <grpcpp/create_channel.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "shm/huge_pages.h"
#include "storage/shard_format.h"

namespace ckpt::testing {

absl::StatusOr<std::unique_ptr<DaemonProcess>> DaemonProcess::Start(
    const std::string& root, const std::string& run_dir,
    const std::string& shm_prefix, std::vector<std::string> extra_args) {
  auto d = std::unique_ptr<DaemonProcess>(new DaemonProcess);
  d->socket_ = run_dir + "/ckptd.sock";
  // CKPTD_BINARY in the environment wins over the build tree's path: a
  // test binary carried to another machine (scripts/gpu_checks.sh) names
  // the daemon it was carried with.
  const char* binary = std::getenv("CKPTD_BINARY");
  std::vector<std::string> args = {
      binary != nullptr && *binary != '\0' ? binary : CKPTD_BINARY, "--socket",
      d->socket_, "--root", root, "--shm-prefix", shm_prefix,
      // The start-up memcpy check at a test's size: its 64 MiB rounds
      // cost ~1.4 CPU-s per start in the sanitizer build.
      "--health-memcpy-mib", "4"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  d->pid_ = pid;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, d->socket_.c_str(), sizeof(addr.sun_path) - 1);
  // Until it accepts or exits. The bound only marks a hang: an
  // instrumented ckptd runs its start-up health checks (a memcpy probe of
  // up to 10 s among them) first, and took over 20 s at load average 20.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      d->pid_ = -1;
      return absl::InternalError("ckptd exited during start-up, status " +
                                 std::to_string(status));
    }
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    close(fd);
    if (ok) return d;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError(
      "ckptd did not accept connections within 120 s");
}

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) {
    Kill(SIGKILL);
    Wait();
  }
}

void DaemonProcess::Kill(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

int DaemonProcess::Wait() {
  int status = 0;
  if (pid_ > 0) waitpid(pid_, &status, 0);
  pid_ = -1;
  return status;
}

bool DaemonProcess::Exited(int* status) {
  if (pid_ <= 0) return true;
  if (waitpid(pid_, status, WNOHANG) != pid_) return false;
  pid_ = -1;
  return true;
}

std::unique_ptr<v1::Ckptd::Stub> DaemonProcess::Stub() const {
  return v1::Ckptd::NewStub(grpc::CreateChannel(
      "unix:" + socket_, grpc::InsecureChannelCredentials()));
}

void UnlinkArenas(const std::string& shm_prefix) {
  DIR* dir = opendir("/dev/shm");
  if (!dir) return;
  std::vector<std::string> names;
  while (dirent* e = readdir(dir))
    if (std::strncmp(e->d_name, shm_prefix.c_str(), shm_prefix.size()) == 0)
      names.push_back(e->d_name);
  closedir(dir);
  for (const auto& n : names) shm_unlink(("/" + n).c_str());
}

void FlipFirstTensorByteOfFile(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.is_open()) << path;
  std::vector<char> head(storage::kShardAlign);
  f.read(head.data(), static_cast<std::streamsize>(head.size()));
  auto header = storage::DecodeHeader(head);
  ASSERT_TRUE(header.ok()) << header.status();
  f.seekg(static_cast<std::streamoff>(header->data_offset));
  char c = 0;
  f.read(&c, 1);
  c ^= 0x20;
  f.seekp(static_cast<std::streamoff>(header->data_offset));
  f.write(&c, 1);
  ASSERT_TRUE(f.good()) << path;
}

std::string UniqueShmPrefix() {
  static std::atomic<int> counter{0};
  return "ckpttest-" + std::to_string(getpid()) + "-" +
         std::to_string(counter++);
}

ClientOptions OptionsFor(const DaemonProcess& d, const std::string& job,
                         int rank, int world_size) {
  ClientOptions o;
  o.socket_path = d.socket();
  o.job = job;
  o.rank = rank;
  o.world_size = world_size;
  return o;
}

void* MapTensorMemory(size_t bytes) {
  void* p = shm::MapHugeAnonymous(bytes);
  return p == MAP_FAILED ? nullptr : p;
}

void UnmapTensorMemory(void* p, size_t bytes) { munmap(p, bytes); }

HostState MakeEmptyState(uint64_t total_bytes, int num_tensors) {
  HostState s;
  const DType kinds[] = {DType::kFloat32, DType::kBFloat16, DType::kInt64,
                         DType::kUInt8};
  uint64_t per = total_bytes / num_tensors;
  for (int i = 0; i < num_tensors; ++i) {
    DType dt = kinds[i % 4];
    uint64_t es = DTypeSize(dt);
    // Odd element counts, so sizes are not multiples of any chunk.
    int64_t n = static_cast<int64_t>(per / es) - (i % 3);
    if (n < 1) n = 1;
    std::vector<int64_t> shape =
        (i % 2) ? std::vector<int64_t>{n} : std::vector<int64_t>{1, n};
    s.buffers.emplace_back(n * es);
    s.tensors.push_back(Tensor{"layer" + std::to_string(i) + ".weight", dt,
                               shape, nullptr, Device::Host()});
  }
  for (size_t i = 0; i < s.tensors.size(); ++i)
    s.tensors[i].data = s.buffers[i].data();
  return s;
}

HostState MakeState(uint64_t total_bytes, int num_tensors, uint32_t seed) {
  HostState s = MakeEmptyState(total_bytes, num_tensors);
  std::mt19937_64 rng(seed);
  for (auto& buf : s.buffers) {
    uint64_t x = rng();
    for (size_t b = 0; b + 8 <= buf.size(); b += 8) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      std::memcpy(&buf[b], &x, 8);
    }
    for (size_t b = buf.size() & ~size_t{7}; b < buf.size(); ++b)
      buf[b] = static_cast<char>(rng());
  }
  return s;
}

HostState HostState::EmptyLike() const {
  HostState e;
  for (size_t i = 0; i < tensors.size(); ++i) {
    e.buffers.emplace_back(buffers[i].size(), 0);
    e.tensors.push_back(tensors[i]);
  }
  for (size_t i = 0; i < e.tensors.size(); ++i)
    e.tensors[i].data = e.buffers[i].data();
  return e;
}

bool HostState::Equals(const HostState& other) const {
  return buffers == other.buffers;
}

uint64_t HostState::bytes() const {
  uint64_t n = 0;
  for (const auto& b : buffers) n += b.size();
  return n;
}

}  // namespace ckpt::testing
