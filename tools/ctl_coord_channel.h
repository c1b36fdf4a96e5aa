// The tools use the coordinator client helpers under their own namespace.
#ifndef CKPT_TOOLS_CTL_COORD_CHANNEL_H_
#define CKPT_TOOLS_CTL_COORD_CHANNEL_H_

#include "daemon/coordinator/channel.h"

namespace ckpt::tools {
using coordinator::CoordStatus;
using coordinator::IsUnreachable;
using coordinator::NewCoordinatorStub;
using coordinator::SetDeadline;
using coordinator::ValidateHostPort;
}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_CTL_COORD_CHANNEL_H_
