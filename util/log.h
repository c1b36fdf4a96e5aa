// Log lines on stderr, one per event, as journald and `kubectl logs` keep
// them: "2026-11-29T18:00:00.123Z ckptd warning: <message>". The program
// named is the executable's (glibc's program_invocation_short_name): the
// daemon's lines say ckptd, a standalone coordinator's ckpt-coordinator,
// and an engine or coordinator inside a test binary the test's name.
// Lines of concurrent threads never interleave.
#ifndef CKPT_UTIL_LOG_H_
#define CKPT_UTIL_LOG_H_

#include <string_view>

namespace ckpt {

void LogInfo(std::string_view msg);
void LogWarning(std::string_view msg);

}  // namespace ckpt

#endif  // CKPT_UTIL_LOG_H_
