// Disabled by default: measures how close the local backend gets to the
// device by writing 1 GiB with it and with `dd oflag=direct conv=fsync` in the
// same run, and prints the figures (no assertion on time). Run with
//   storage_test --gtest_also_run_disabled_tests --gtest_filter='*Throughput*'
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "gtest/gtest.h"
#include "storage/backend.h"
#include "tests/temp_dir.h"

namespace ckpt::storage {
namespace {

constexpr uint64_t kBytes = 1ull << 30;

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since)
      .count();
}

double WriteWithBackend(const std::string& root, bool io_uring, bool registered,
                        char* buf) {
  LocalBackendOptions o;
  o.root = root;
  o.use_io_uring = io_uring;
  auto b = NewLocalBackend(o);
  EXPECT_TRUE(b.ok()) << b.status();
  if (registered) {
    EXPECT_TRUE((*b)->RegisterMemory(buf, kBytes).ok());
  }
  auto start = std::chrono::steady_clock::now();
  auto w = (*b)->NewObjectWriter("bench/object", kBytes);
  EXPECT_TRUE(w.ok());
  EXPECT_TRUE((*w)->WriteAt(0, buf, kBytes).ok());
  EXPECT_TRUE((*w)->Commit().ok());
  double s = Seconds(start);
  EXPECT_TRUE((*b)->Delete("bench/object").ok());
  if (registered) (*b)->UnregisterMemory(buf);
  return s;
}

TEST(Throughput, DISABLED_OneGiBWriteVersusDdDirect) {
  ckpt::testing::TempDir dir;
  char* buf = static_cast<char*>(
      mmap(nullptr, kBytes, PROT_READ | PROT_WRITE,
           MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0));
  ASSERT_NE(buf, MAP_FAILED);
  for (uint64_t i = 0; i < kBytes; i += 4096)
    buf[i] = static_cast<char>(i >> 12);

  const std::string dd_file = dir.path() + "/dd.out";
  const std::string dd = "dd if=/dev/zero of=" + dd_file +
                         " bs=4M count=256 oflag=direct conv=fsync status=none";
  auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(std::system(dd.c_str()), 0);
  const double dd_s = Seconds(start);
  std::remove(dd_file.c_str());

  const double uring_s = WriteWithBackend(dir.path(), true, false, buf);
  const double fixed_s = WriteWithBackend(dir.path(), true, true, buf);
  const double pwrite_s = WriteWithBackend(dir.path(), false, false, buf);
  auto gbs = [](double s) { return kBytes / s / 1e9; };
  std::printf("1 GiB, O_DIRECT + fsync + rename + dir fsync:\n");
  std::printf("  dd oflag=direct bs=4M     %.2f GB/s\n", gbs(dd_s));
  std::printf("  io_uring                  %.2f GB/s (%.2fx dd)\n",
              gbs(uring_s), dd_s / uring_s);
  std::printf("  io_uring, registered buf  %.2f GB/s (%.2fx dd)\n",
              gbs(fixed_s), dd_s / fixed_s);
  std::printf("  pwrite                    %.2f GB/s (%.2fx dd)\n",
              gbs(pwrite_s), dd_s / pwrite_s);
  munmap(buf, kBytes);
}

}  // namespace
}  // namespace ckpt::storage
