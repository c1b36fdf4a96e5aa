// The fixture of ckptrun's tests: the real ckptrun binary against the real
// ckpt-coordinator binary, with /bin/sh trainers that write their
// environment to a file (kTrainer). Not thread-safe.
#ifndef CKPT_TOOLS_CKPTRUN_FIXTURE_H_
#define CKPT_TOOLS_CKPTRUN_FIXTURE_H_

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tests/temp_dir.h"
#include "tools/ckptrun_testing.h"

extern char** environ;

namespace ckpt::tools {

namespace cv1 = ::ckpt::coord::v1;
using std::chrono::milliseconds;

// Writes its environment (and pid) to DIR/env-<generation>-<rank>, then
// behaves as MODE says. The keep* modes follow the in-process restart
// contract (client/restart_plan.h): write `capable`, and on each newer
// `plan` write its lines (with PID= and KEPT=1) to DIR/env-<G>-<rank>,
// then `joined`. Rank 1 of generation 0 exits 3 once DIR/fail exists.
// keep-nojoin: rank 0 never joins; keep-exit: rank 0 exits 5 when it sees
// a newer plan; keep-badpid: rank 0 names pid 1 in
// `capable`; keep-peerlost: rank 0 of generation 0 notes peer rank 1 lost
// once DIR/peerlost exists, and keeps running.
// A warm process (CKPT_WARM=1, ckptrun --warm) writes `capable` and
// DIR/warm-<pid>, waits for its `plan`, takes its generation, rank and
// restore step from it, then goes on as above; in mode warm-crash it exits
// 9 at once instead.
constexpr char kTrainer[] = R"(
d=$1
if [ "$CKPT_WARM" = 1 ]; then
  r=$CKPT_RESTART_DIR; [ -n "$r" ] || exit 4
  [ "$2" = warm-crash ] && exit 9
  echo "pid=$$" > "$r/capable.tmp" && mv "$r/capable.tmp" "$r/capable"
  echo "$$" > "$d/warm-$$.tmp" && mv "$d/warm-$$.tmp" "$d/warm-$$"
  p=; rk=; rs=
  while [ -z "$p" ]; do
    sleep 0.05
    while IFS= read -r line; do
      case "$line" in generation=*) p=${line#generation=} ;;
        rank=*) rk=${line#rank=} ;; restore_step=*) rs=${line#restore_step=} ;;
      esac
    done 2>/dev/null < "$r/plan"
  done
  export CKPT_GENERATION=$p RANK=$rk CKPT_RESTORE_STEP=$rs
fi
f="$d/env-$CKPT_GENERATION-$RANK"
{ env; echo "PID=$$"; } > "$f.tmp" && mv "$f.tmp" "$f"
case "$2" in
  keep*) r=$CKPT_RESTART_DIR; [ -n "$r" ] || exit 4
         pid=$$; [ "$2" = keep-badpid ] && [ "$RANK" = 0 ] && pid=1
         echo "pid=$pid" > "$r/capable.tmp" && mv "$r/capable.tmp" "$r/capable"
         g=$CKPT_GENERATION; noted=
         while :; do
           [ "$g" = 0 ] && [ "$RANK" = 1 ] && [ -e "$d/fail" ] && exit 3
           if [ "$2" = keep-peerlost ] && [ "$g" = 0 ] && [ "$RANK" = 0 ] &&
              [ -z "$noted" ] && [ -e "$d/peerlost" ]; then
             echo 1 > "$CKPT_PEER_LOST_FILE"; noted=1
           fi
           p=; plan=
           while IFS= read -r line; do
             plan="$plan$line
"
             case "$line" in generation=*) p=${line#generation=} ;; esac
           done 2>/dev/null < "$r/plan"
           if [ -n "$p" ] && [ "$p" -gt "$g" ] &&
              ! { [ "$2" = keep-nojoin ] && [ "$RANK" = 0 ]; }; then
             [ "$2" = keep-exit ] && [ "$RANK" = 0 ] && exit 5
             g=$p; f="$d/env-$g-$RANK"
             printf '%sPID=%s\nKEPT=1\n' "$plan" "$$" > "$f.tmp" && mv "$f.tmp" "$f"
             echo "generation=$g" > "$r/joined.tmp" && mv "$r/joined.tmp" "$r/joined"
           fi
           sleep 0.05
         done ;;
  exit0) exit 0 ;;
  wrapped) sleep 60 & c=$!; echo "$c" > "$d/child-$RANK.tmp" && mv "$d/child-$RANK.tmp" "$d/child-$RANK"
           wait; exit 0 ;;
  fail1) if [ "$CKPT_GENERATION" = 0 ] && [ "$RANK" = 1 ]; then
           while [ ! -e "$d/fail" ]; do sleep 0.02; done; exit 3
         fi ;;
esac
exec sleep 60
)";

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline bool WaitFor(const std::function<bool()>& done, milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return done();
}

class CkptrunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    coord_ = std::make_unique<testing::CoordinatorProcess>(
        dir_.path() + "/state", dir_.path() + "/shared", 1000);
    ASSERT_GT(coord_->port(), 0);
    stub_ = coord_->Stub();
  }
  void TearDown() override {
    if (ckptrun_ > 0) {
      kill(ckptrun_, SIGKILL);
      waitpid(ckptrun_, nullptr, 0);
    }
    if (!HasFailure()) return;
    std::fprintf(stderr, "ckptrun's log:\n%s\n", ReadFile(log()).c_str());
    grpc::ClientContext ctx;
    cv1::EventsResponse resp;
    if (stub_ && stub_->Events(&ctx, cv1::EventsRequest(), &resp).ok())
      for (const auto& e : resp.events())
        std::fprintf(stderr, "event %llu %s %s %s\n",
                     static_cast<unsigned long long>(e.seq()),
                     cv1::EventKind_Name(e.kind()).c_str(), e.node_id().c_str(),
                     e.detail().c_str());
  }
  std::string log() const { return dir_.path() + "/ckptrun.log"; }
  std::string EnvFile(uint64_t generation, uint32_t rank) const {
    return dir_.path() + "/env-" + std::to_string(generation) + "-" +
           std::to_string(rank);
  }

  // ckptrun for job "train" on `node`, stderr to log().
  void StartCkptrun(const std::string& mode, uint32_t nproc,
                    const std::string& node = "n1",
                    const std::vector<std::string>& flags = {}) {
    std::vector<std::string> args = {CKPTRUN_PATH,
                                     "--coordinator",
                                     coord_->address(),
                                     "--node-id",
                                     node,
                                     "--nproc-per-node",
                                     std::to_string(nproc),
                                     "--job",
                                     "train",
                                     "--socket",
                                     "/run/ckptd-test.sock",
                                     "--master-port",
                                     "31000",
                                     "--poll-ms",
                                     poll_ms_,
                                     "--grace-ms",
                                     "1000",
                                     "--",
                                     "/bin/sh",
                                     "-c",
                                     kTrainer,
                                     "trainer",
                                     dir_.path(),
                                     mode};
    args.insert(std::find(args.begin(), args.end(), "--"), flags.begin(),
                flags.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // TMPDIR in the test's directory: TearDown SIGKILLs ckptrun, which
    // then cannot remove its stacks directory (made under TMPDIR).
    std::vector<std::string> env_strings = {"TMPDIR=" + dir_.path()};
    for (char** e = environ; *e != nullptr; ++e)
      if (std::string_view(*e).rfind("TMPDIR=", 0) != 0)
        env_strings.emplace_back(*e);
    std::vector<char*> env;
    for (auto& e : env_strings) env.push_back(e.data());
    env.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 2, log().c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_EQ(posix_spawn(&ckptrun_, CKPTRUN_PATH, &actions, nullptr,
                          argv.data(), env.data()),
              0);
    posix_spawn_file_actions_destroy(&actions);
  }
  // ckptrun's exit code, or -1 if it is still running after `timeout`.
  int WaitCkptrun(milliseconds timeout) {
    int status = 0;
    bool exited =
        WaitFor([&] { return waitpid(ckptrun_, &status, WNOHANG) == ckptrun_; },
                timeout);
    if (!exited) return -1;
    ckptrun_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::map<std::string, std::string> Env(uint64_t generation, uint32_t rank) {
    std::map<std::string, std::string> env;
    std::istringstream in(ReadFile(EnvFile(generation, rank)));
    for (std::string line; std::getline(in, line);) {
      size_t eq = line.find('=');
      if (eq != std::string::npos)
        env[line.substr(0, eq)] = line.substr(eq + 1);
    }
    return env;
  }
  bool WaitForEnv(uint64_t generation, std::vector<uint32_t> ranks) {
    return WaitFor(
        [&] {
          return std::all_of(ranks.begin(), ranks.end(), [&](uint32_t r) {
            return access(EnvFile(generation, r).c_str(), F_OK) == 0;
          });
        },
        milliseconds(15000));
  }
  std::vector<cv1::EventKind> Events() {
    grpc::ClientContext ctx;
    cv1::EventsRequest req;
    req.set_job("train");
    cv1::EventsResponse resp;
    EXPECT_TRUE(stub_->Events(&ctx, req, &resp).ok());
    std::vector<cv1::EventKind> kinds;
    for (const auto& e : resp.events()) kinds.push_back(e.kind());
    return kinds;
  }
  // Gone, or a zombie nobody reaped yet (an orphan's reaper may be slow).
  static bool Dead(const std::string& pid) {
    if (kill(std::stoi(pid), 0) != 0 && errno == ESRCH) return true;
    std::string stat = ReadFile("/proc/" + pid + "/stat");
    size_t paren = stat.rfind(')');
    return paren != std::string::npos && paren + 2 < stat.size() &&
           stat[paren + 2] == 'Z';
  }

  ckpt::testing::TempDir dir_;
  std::unique_ptr<testing::CoordinatorProcess> coord_;
  std::unique_ptr<cv1::Coordinator::Stub> stub_;
  pid_t ckptrun_ = -1;
  // ckptrun's --poll-ms: how often its loop looks at the newest view
  // when nothing (a trainer's exit, a new view) wakes it sooner.
  std::string poll_ms_ = "50";
};

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_CKPTRUN_FIXTURE_H_
