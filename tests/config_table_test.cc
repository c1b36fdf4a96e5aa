// Every setting of ckptd and ckpt-coordinator is a flag and a config key
// from one table: each flag in --help has a key that is read, a key that
// names no setting stops the binary naming the key, the file and the
// nearest valid key, and a flag given on the command line wins over its key.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "coordinator/options.h"
#include "daemon/options.h"
#include "tests/temp_dir.h"
#include "tests/test_util.h"

namespace ckpt::testing {
namespace {

// Flags that are not settings: the config file itself, the help and
// version answers, and ckptd's one-shot health check mode.
const std::set<std::string> kCommandLineOnly = {
    "--help",         "--version", "--config", "--print-config-keys",
    "--health-check", "--json"};

// The binaries, set up to fail right after parsing their options (the root
// or state directory lies under a regular file), so a key that is ignored
// shows as a start that fails for another reason, not a hang.
struct Binary {
  std::string path;
  std::vector<std::pair<std::string, std::string>> flags;
  // The command line without `skip` (a flag whose key is under test).
  std::string Command(const std::string& skip = "") const {
    std::string c = path;
    for (const auto& [flag, value] : flags)
      if (flag != skip) c += " " + flag + " " + value;
    return c;
  }
};
std::vector<Binary> Binaries(const TempDir& dir) {
  std::ofstream(dir.path() + "/file") << "not a directory\n";
  const std::string blocked = dir.path() + "/file/sub";
  return {
      {CKPTD_BINARY, {{"--socket", dir.path() + "/s"}, {"--root", blocked}}},
      {COORDINATOR_BINARY,
       {{"--listen", "127.0.0.1:0"}, {"--state", blocked}}}};
}

// The long flags --help lists, each the first name of its line.
std::vector<std::string> HelpFlags(const std::string& binary) {
  CommandResult r = RunCommand(binary + " --help", true, 30);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  std::vector<std::string> flags;
  std::regex line(R"(^\s+(?:-\w,)?(--[a-z0-9-]+))");
  std::istringstream in(r.out);
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (std::regex_search(l, m, line)) flags.push_back(m[1]);
  }
  return flags;
}

// flag --foo-bar is key foo_bar; --no-foo is key foo (false for the flag).
std::string KeyOf(std::string flag) {
  flag = flag.substr(2);
  if (flag.rfind("no-", 0) == 0) flag = flag.substr(3);
  for (char& c : flag)
    if (c == '-') c = '_';
  return flag;
}

TEST(ConfigTableTest, UnknownKeyIsRefusedNamingTheKeyFileAndNearestKey) {
  TempDir dir;
  const std::string config = dir.path() + "/c.toml";
  std::ofstream(config) << "retian = 5\n";
  const std::string expect_daemon = "config " + config +
                                    ": unknown key \"retian\" (did you mean "
                                    "\"retain\"?)";
  CommandResult r =
      RunCommand(Binaries(dir)[0].Command() + " --config " + config, true, 30);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find(expect_daemon), std::string::npos) << r.out;

  std::ofstream(config, std::ios::trunc) << "heartbeat_timeot_ms = 500\n";
  r = RunCommand(Binaries(dir)[1].Command() + " --config " + config, true, 30);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.out.find("config " + config +
                       ": unknown key \"heartbeat_timeot_ms\" (did you mean "
                       "\"heartbeat_timeout_ms\"?)"),
            std::string::npos)
      << r.out;
}

// Each flag's key is read: a value of no type any setting has (an array) is
// refused naming the key, where an ignored key would let the binary go on.
TEST(ConfigTableTest, EveryFlagInHelpHasAKeyThatIsRead) {
  TempDir dir;
  const std::string config = dir.path() + "/c.toml";
  for (const Binary& b : Binaries(dir)) {
    std::vector<std::string> flags = HelpFlags(b.path);
    EXPECT_GT(flags.size(), 20u) << b.path;
    for (const std::string& flag : flags) {
      if (kCommandLineOnly.count(flag)) continue;
      const std::string key = KeyOf(flag);
      std::ofstream(config, std::ios::trunc) << key << " = [1]\n";
      CommandResult r =
          RunCommand(b.Command(flag) + " --config " + config, true, 30);
      EXPECT_NE(r.exit_code, 0) << b.path << " " << key;
      EXPECT_NE(r.out.find(": " + key + ": "), std::string::npos)
          << b.path << " " << flag << " (key " << key << "): " << r.out;
    }
  }
}

// doc/operations.md names every key --print-config-keys prints, and that
// list is --help's flags (less the command-line-only ones) plus object_*.
TEST(ConfigTableTest, DocNamesEveryKeyThatPrintConfigKeysPrints) {
  TempDir dir;
  const std::string doc =
      ReadFileToString(std::string(CKPT_SOURCE_DIR) + "/doc/operations.md");
  ASSERT_FALSE(doc.empty());
  for (const Binary& b : Binaries(dir)) {
    CommandResult r = RunCommand(b.path + " --print-config-keys", false, 30);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    std::set<std::string> printed;
    std::istringstream in(r.out);
    for (std::string line; std::getline(in, line);) {
      const std::string key = line.substr(0, line.find(' '));
      printed.insert(key);
      EXPECT_NE(doc.find("`" + key + "`"), std::string::npos)
          << b.path << ": doc/operations.md does not name key " << key;
    }
    for (const std::string& flag : HelpFlags(b.path)) {
      if (kCommandLineOnly.count(flag)) continue;
      EXPECT_TRUE(printed.count(KeyOf(flag))) << b.path << " " << flag;
    }
  }
}

// ckptd's options parsed from `args` after --socket and --root.
absl::StatusOr<daemon::DaemonOptions> ParseDaemon(
    const TempDir& dir, std::vector<std::string> args) {
  std::vector<std::string> all = {"ckptd", "--socket", dir.path() + "/s",
                                  "--root", dir.path() + "/r"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  std::string help;
  return daemon::ParseDaemonOptions(static_cast<int>(argv.size()), argv.data(),
                                    &help);
}

absl::StatusOr<coordinator::CoordinatorServerOptions> ParseCoordinator(
    std::vector<std::string> args) {
  std::vector<std::string> all = {"ckpt-coordinator", "--insecure"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  std::string help;
  return coordinator::ParseCoordinatorOptions(static_cast<int>(argv.size()),
                                              argv.data(), &help);
}

TEST(ConfigTableTest, DaemonKeysTakeEffectAndTheFlagWins) {
  TempDir dir;
  const std::string config = dir.path() + "/c.toml";
  std::ofstream(config) << "heartbeat_timeout_ms = 1234\n"
                           "coordinator_listen = \"127.0.0.1:0\"\n"
                           "health_timeout_s = 7\n"
                           "health_recheck_s = 9\n"
                           "health_net_port = 0\n"
                           "io_uring = false\n"
                           "retain_local = 5\n"
                           "object_max_attempts = 2\n";
  auto o = ParseDaemon(dir, {"--config", config});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->heartbeat_timeout_ms, 1234u);
  EXPECT_EQ(o->coordinator_listen, "127.0.0.1:0");
  EXPECT_TRUE(o->cluster) << "coordinator_listen serves an embedded one";
  EXPECT_EQ(o->health.timeout, std::chrono::seconds(7));
  EXPECT_EQ(o->agent.health_recheck, std::chrono::seconds(9));
  EXPECT_EQ(o->agent.net_probe_port, 0);
  EXPECT_FALSE(o->storage.use_io_uring);
  EXPECT_EQ(o->engine.retain_steps, 5u);
  EXPECT_EQ(o->object_config.max_attempts, 2u) << "object_* keys still read";

  o = ParseDaemon(dir, {"--config", config, "--heartbeat-timeout-ms", "5000",
                        "--health-timeout-s", "3", "--retain", "2"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->heartbeat_timeout_ms, 5000u) << "the flag wins over the key";
  EXPECT_EQ(o->health.timeout, std::chrono::seconds(3));
  EXPECT_EQ(o->engine.retain_steps, 2u)
      << "--retain wins over its alias's key retain_local";

  // The flag's bounds hold for its key too.
  std::ofstream(config, std::ios::trunc) << "heartbeat_timeout_ms = 5\n";
  o = ParseDaemon(dir, {"--config", config});
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(o.status().message().find("heartbeat_timeout_ms"),
            std::string::npos)
      << o.status();
}

TEST(ConfigTableTest, HugePagesModeIsCheckedByName) {
  TempDir dir;
  auto o = ParseDaemon(dir, {"--huge-pages", "of"});
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(o.status().message().find("--huge-pages"), std::string::npos)
      << o.status();
  const std::string config = dir.path() + "/c.toml";
  std::ofstream(config) << "huge_pages = \"yes\"\n";
  o = ParseDaemon(dir, {"--config", config});
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(o.status().message().find("huge_pages"), std::string::npos)
      << o.status();
  // A directory that is not a hugetlbfs of 2 MiB pages stops the start.
  o = ParseDaemon(dir, {"--hugetlbfs", "/dev/shm"});
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(o.status().message().find("--hugetlbfs: hugetlbfs directory "
                                      "\"/dev/shm\""),
            std::string::npos)
      << o.status();
  o = ParseDaemon(dir, {"--huge-pages", "off"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->engine.huge_dir, "");
}

TEST(ConfigTableTest, CoordinatorKeysTakeEffectAndTheFlagWins) {
  TempDir dir;
  const std::string config = dir.path() + "/c.toml";
  std::ofstream(config) << "listen = \"127.0.0.1:0\"\n"
                           "state = \"" +
                               dir.path() +
                               "/state\"\n"
                               "heartbeat_timeout_ms = 777\n"
                               "spare_check_max_age_s = 5\n"
                               "object_region = \"eu\"\n";
  auto o = ParseCoordinator({"--config", config});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->listen, "127.0.0.1:0");
  EXPECT_EQ(o->coordinator.state_dir, dir.path() + "/state");
  EXPECT_EQ(o->coordinator.heartbeat_timeout, std::chrono::milliseconds(777));
  EXPECT_EQ(o->coordinator.spare_check_max_age_ms, 5000);
  EXPECT_EQ(o->coordinator.object_config.region, "eu");

  o = ParseCoordinator({"--config", config, "--heartbeat-timeout-ms", "4000",
                        "--listen", "127.0.0.1:1"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->coordinator.heartbeat_timeout, std::chrono::milliseconds(4000))
      << "the flag wins over the key";
  EXPECT_EQ(o->listen, "127.0.0.1:1");
}

}  // namespace
}  // namespace ckpt::testing
