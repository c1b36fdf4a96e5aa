// What the coordinator subcommands of ckptctl share (ctl_coord.cc,
// ctl_events.cc, ctl_cordon.cc): the --coordinator check, the RPC
// deadline, and how events are written (--json) and printed. Not
// thread-safe (stdout).
#ifndef CKPT_TOOLS_CTL_COORD_H_
#define CKPT_TOOLS_CTL_COORD_H_

#include <chrono>
#include <string>

#include "absl/status/status.h"
#include "coordinator.pb.h"
#include "tools/json_writer.h"

namespace ckpt::tools {

inline constexpr std::chrono::seconds kRpcTimeout{5};

// InvalidArgument naming --coordinator when it is empty or not
// HOST:PORT[,HOST:PORT...].
[[nodiscard]] absl::Status CheckCoordinator(const std::string& coordinator);

// An array of events, with each kind's own fields (fallbacks, hangs,
// health, cordons).
void WriteEvents(
    JsonWriter& w,
    const google::protobuf::RepeatedPtrField<coord::v1::Event>& events);
void PrintEvents(
    const google::protobuf::RepeatedPtrField<coord::v1::Event>& events);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_CTL_COORD_H_
