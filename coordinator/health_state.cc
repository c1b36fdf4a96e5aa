#include "coordinator/health_state.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "util/validate.h"

namespace ckpt::coordinator {

absl::Status ValidateHealthReport(const v1::NodeHealthReport& report,
                                  std::string_view field_view) {
  const std::string field(field_view);
  if (report.checks_size() > kMaxHealthChecks)
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".checks: ", report.checks_size(),
                     " checks, at most ", kMaxHealthChecks));
  for (int i = 0; i < report.checks_size(); ++i)
    if (absl::Status s = ValidateHealthCheck(
            report.checks(i), absl::StrCat(field, ".checks[", i, "]"));
        !s.ok())
      return s;
  return absl::OkStatus();
}

absl::Status ValidateHealthCheck(const v1::HealthCheck& c,
                                 std::string_view field) {
  const std::string at(field);
  absl::Status s = ValidatePrintable(c.name(), at + ".name", 64);
  if (s.ok()) s = ValidatePrintable(c.unit(), at + ".unit", 64, true);
  if (s.ok()) s = ValidatePrintable(c.reason(), at + ".reason", 512, true);
  if (!s.ok()) return s;
  if (!std::isfinite(c.figure()) || c.figure() < 0)
    return absl::InvalidArgumentError(
        absl::StrCat(at, ".figure: ", c.figure(), " is not a finite >= 0"));
  if (!std::isfinite(c.seconds()) || c.seconds() < 0)
    return absl::InvalidArgumentError(
        absl::StrCat(at, ".seconds: ", c.seconds(), " is not a finite >= 0"));
  return absl::OkStatus();
}

bool ComparedAgainstMedian(std::string_view check) {
  return check == "memcpy" || check == "cuda" || check == "network";
}

std::map<std::string, double> MedianFigures(
    const std::vector<const v1::NodeHealthReport*>& reports) {
  std::map<std::string, std::vector<double>> figures;
  for (const v1::NodeHealthReport* r : reports)
    for (const v1::HealthCheck& c : r->checks())
      if (ComparedAgainstMedian(c.name()) && c.passed() && !c.skipped() &&
          c.figure() > 0)
        figures[c.name()].push_back(c.figure());
  std::map<std::string, double> medians;
  for (auto& [check, v] : figures) {
    if (v.size() < 2) continue;
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    medians[check] = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  }
  return medians;
}

bool LowOwnFigure(const v1::NodeHealthReport& report, std::string_view check) {
  if (!ComparedAgainstMedian(check) || check == "network") return false;
  for (const v1::HealthCheck& c : report.checks())
    if (c.name() == check) return c.passed();
  return false;
}

HealthVerdict JudgeHealth(const v1::NodeHealthReport& report,
                          const std::map<std::string, double>& medians,
                          double min_ratio) {
  for (const v1::HealthCheck& c : report.checks())
    if (!c.passed())
      return {false, c.name(), c.reason().empty() ? "failed" : c.reason()};
  for (const v1::HealthCheck& c : report.checks()) {
    auto m = medians.find(c.name());
    if (m == medians.end() || c.skipped() ||
        c.figure() >= min_ratio * m->second)
      continue;
    return {
        false, c.name(),
        absl::StrFormat("%.2f %s is below %.2f x the cluster's median "
                        "%.2f %s",
                        c.figure(), c.unit(), min_ratio, m->second, c.unit())};
  }
  return {};
}

}  // namespace ckpt::coordinator
