// ShmHugePages on mountinfo text: which mount holds the directory, and
// what its huge= option and the system-wide override say.
#include "shm/huge_pages.h"

#include "gtest/gtest.h"

namespace ckpt::shm {
namespace {

constexpr char kMountinfo[] =
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    "25 22 0:21 / /dev rw,nosuid shared:2 - devtmpfs udev rw,size=1k\n"
    "26 25 0:23 / /dev/shm rw,nosuid,nodev shared:3 - tmpfs tmpfs "
    "rw,size=24683620k,inode64\n"
    "40 22 0:40 / /run/big rw,relatime - tmpfs tmpfs rw,huge=within_size\n"
    "41 40 0:41 / /run/big/small rw,relatime - tmpfs tmpfs rw,size=8k\n";

TEST(HealthTest, ShmHugePagesReadsTheMountHoldingTheDirectory) {
  const char* thp = "always within_size advise [never] deny force";
  EXPECT_EQ(ShmHugePages(kMountinfo, thp, "/dev/shm"),
            "off: /dev/shm is mounted huge=never");
  EXPECT_EQ(ShmHugePages(kMountinfo, thp, "/run/big"), "on: huge=within_size");
  EXPECT_EQ(ShmHugePages(kMountinfo, thp, "/run/big/arenas"),
            "on: huge=within_size");
  // The longest mount point that holds it, not a name that merely starts
  // the same.
  EXPECT_EQ(ShmHugePages(kMountinfo, thp, "/run/big/small/x"),
            "off: /run/big/small is mounted huge=never");
  EXPECT_EQ(ShmHugePages(kMountinfo, thp, "/run/bigger"), "unknown");
  EXPECT_EQ(ShmHugePages(kMountinfo, thp, "/var/tmp"), "unknown");  // ext4
  // The system-wide override wins over the mount.
  EXPECT_EQ(ShmHugePages(kMountinfo, "always [deny] force", "/run/big"),
            "off: shmem_enabled is deny, huge=within_size");
  EXPECT_EQ(ShmHugePages(kMountinfo, "never deny [force]", "/dev/shm"),
            "on: shmem_enabled is force");
  // Garbage is not a crash.
  EXPECT_EQ(ShmHugePages("x - \n\n - - -", thp, "/dev/shm"), "unknown");
}

}  // namespace
}  // namespace ckpt::shm
