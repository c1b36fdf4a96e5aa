// The CUDA check of a build without CUDA (see health.h).
#include "daemon/health/health.h"

namespace ckpt::daemon {

HealthCheckResult CheckCuda(uint64_t /*bytes*/) {
  return {"cuda",
          HealthCheckResult::Outcome::kSkipped,
          "ckptd was built without CUDA",
          0,
          "",
          0};
}

}  // namespace ckpt::daemon
