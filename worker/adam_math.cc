#include "worker/adam_math.h"

#include "absl/strings/str_cat.h"

namespace ckpt::worker {

absl::Status ValidateAdamConfig(const AdamConfig& c) {
  auto bad = [](const char* field, float value, const char* want) {
    return absl::InvalidArgumentError(
        absl::StrCat("adam.", field, " = ", value, ": must be ", want));
  };
  if (!std::isfinite(c.lr) || c.lr < 0)
    return bad("lr", c.lr, "finite and >= 0");
  if (!(c.beta1 >= 0 && c.beta1 < 1)) return bad("beta1", c.beta1, "in [0, 1)");
  if (!(c.beta2 >= 0 && c.beta2 < 1)) return bad("beta2", c.beta2, "in [0, 1)");
  if (!std::isfinite(c.eps) || c.eps <= 0)
    return bad("eps", c.eps, "finite and > 0");
  if (!std::isfinite(c.weight_decay) || c.weight_decay < 0) {
    return bad("weight_decay", c.weight_decay, "finite and >= 0");
  }
  return absl::OkStatus();
}

}  // namespace ckpt::worker
