#include "util/log.h"

#include <errno.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace ckpt {
namespace {

// What `write` puts on stderr, read back from a temporary file.
template <typename F>
std::string Stderr(F write) {
  std::fflush(stderr);
  FILE* tmp = std::tmpfile();
  EXPECT_NE(tmp, nullptr);
  const int saved = ::dup(STDERR_FILENO);
  ::dup2(::fileno(tmp), STDERR_FILENO);
  write();
  std::fflush(stderr);
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  std::string out;
  std::rewind(tmp);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, tmp)) > 0) out.append(buf, n);
  std::fclose(tmp);
  return out;
}

TEST(LogTest, ALineHasTheTimeTheProgramTheLevelAndTheMessage) {
  const std::string out = Stderr([] {
    LogInfo("hello");
    LogWarning(std::string_view("disk full\0ignored", 9));
  });
  const std::string program = program_invocation_short_name;
  const std::string time = R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z )";
  EXPECT_TRUE(std::regex_match(
      out, std::regex(time + program + " info: hello\n" + time + program +
                      " warning: disk full\n")))
      << out;
}

TEST(LogTest, LinesOfConcurrentThreadsNeverInterleave) {
  const std::string out = Stderr([] {
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([t] {
        for (int i = 0; i < 200; ++i)
          LogInfo(std::string(100, static_cast<char>('a' + t)));
      });
    for (auto& th : threads) th.join();
  });
  int lines = 0;
  size_t start = 0;
  for (size_t end; (end = out.find('\n', start)) != std::string::npos;
       start = end + 1, ++lines) {
    const std::string line = out.substr(start, end - start);
    const std::string msg = line.substr(line.rfind(' ') + 1);
    ASSERT_EQ(msg.size(), 100u) << line;
    EXPECT_EQ(msg.find_first_not_of(msg[0]), std::string::npos) << line;
  }
  EXPECT_EQ(lines, 800);
  EXPECT_EQ(start, out.size());
}

}  // namespace
}  // namespace ckpt
