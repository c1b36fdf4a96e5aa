// Object-store settings: the s3:// URL, the config keys, the AWS
// environment variables and the shared credentials file, resolved and
// validated in one place.
#include "storage/object_config.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "util/config_file.h"
#include "util/status.h"
#include "util/strings.h"
#include "util/validate.h"

namespace ckpt::storage {
namespace {

bool IsKeyChar(char c) {
  return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-';
}

absl::Status ValidateBucket(std::string_view b, std::string_view field) {
  if (b.size() < 3 || b.size() > 63)
    return absl::InvalidArgumentError(absl::StrCat(
        AV(field), ": bucket ", QuotePrefix(b), " is not 3 to 63 characters"));
  for (char c : b) {
    if (!(absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '.' ||
          c == '-'))
      return absl::InvalidArgumentError(
          absl::StrCat(AV(field), ": bucket ", QuotePrefix(b),
                       " has a character outside [a-z0-9.-]"));
  }
  return absl::OkStatus();
}

absl::Status ValidatePrefixPath(std::string_view p, std::string_view field) {
  if (p.empty()) return absl::OkStatus();
  if (p.size() > 512)
    return absl::InvalidArgumentError(
        absl::StrCat(AV(field), ": prefix longer than 512"));
  for (absl::string_view part : absl::StrSplit(AV(p), '/')) {
    if (part.empty() || part == "." || part == "..")
      return absl::InvalidArgumentError(
          absl::StrCat(AV(field), ": prefix ", QuotePrefix(p),
                       " has an empty, \".\" or \"..\" component"));
    for (char c : part) {
      if (!IsKeyChar(c))
        return absl::InvalidArgumentError(
            absl::StrCat(AV(field), ": prefix ", QuotePrefix(p),
                         " has a character outside [A-Za-z0-9._-/]"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateEndpoint(std::string_view e, std::string_view field) {
  if (!absl::StartsWith(AV(e), "http://") &&
      !absl::StartsWith(AV(e), "https://"))
    return absl::InvalidArgumentError(
        absl::StrCat(AV(field), ": ", QuotePrefix(e),
                     " does not start with http:// or https://"));
  std::string_view rest = e.substr(e.find("://") + 3);
  if (rest.empty() || rest.size() > 255)
    return absl::InvalidArgumentError(
        absl::StrCat(AV(field), ": ", QuotePrefix(e), " has no host"));
  for (char c : rest) {
    if (!(absl::ascii_isalnum(c) || c == '.' || c == '-' || c == ':' ||
          c == '[' || c == ']'))
      return absl::InvalidArgumentError(
          absl::StrCat(AV(field), ": ", QuotePrefix(e),
                       " is not scheme://host[:port] (no path)"));
  }
  return absl::OkStatus();
}

std::string Env(const EnvLookup& env, const char* name) {
  std::optional<std::string> v = env(name);
  return v ? *v : std::string();
}

// The [profile] section of an AWS shared credentials file (INI: "[name]",
// "key = value", '#' or ';' comments).
absl::StatusOr<ObjectCredentials> ReadCredentialsFile(
    const std::string& path, const std::string& profile) {
  std::ifstream in(path);
  if (!in)
    return absl::NotFoundError(
        absl::StrCat("credentials file ", path, ": cannot open"));
  ObjectCredentials c;
  bool in_profile = false, found = false;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    absl::string_view l = absl::StripAsciiWhitespace(line);
    if (l.empty() || l[0] == '#' || l[0] == ';') continue;
    if (l.front() == '[') {
      if (l.back() != ']')
        return absl::InvalidArgumentError(
            absl::StrCat("credentials file ", path, ": line ", lineno,
                         ": unterminated section"));
      absl::string_view name =
          absl::StripAsciiWhitespace(l.substr(1, l.size() - 2));
      in_profile = name == AV(profile);
      found |= in_profile;
      continue;
    }
    if (!in_profile) continue;
    size_t eq = l.find('=');
    if (eq == absl::string_view::npos)
      return absl::InvalidArgumentError(absl::StrCat(
          "credentials file ", path, ": line ", lineno, ": not key = value"));
    absl::string_view key = absl::StripAsciiWhitespace(l.substr(0, eq));
    std::string value(absl::StripAsciiWhitespace(l.substr(eq + 1)));
    if (key == "aws_access_key_id") c.access_key_id = value;
    if (key == "aws_secret_access_key") c.secret_access_key = value;
    if (key == "aws_session_token") c.session_token = value;
  }
  if (!found)
    return absl::NotFoundError(absl::StrCat(
        "credentials file ", path, ": no profile ", QuotePrefix(profile)));
  return c;
}

absl::Status ValidateCredentials(const ObjectCredentials& c,
                                 std::string_view from) {
  auto printable = [](std::string_view v) {
    for (char ch : v)
      if (!absl::ascii_isgraph(ch)) return false;
    return true;
  };
  if (c.access_key_id.empty() || c.secret_access_key.empty())
    return absl::FailedPreconditionError(absl::StrCat(
        "object store credentials: ", AV(from),
        " has no access key id and secret (set AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY, or a credentials file)"));
  if (c.access_key_id.size() > 128 || !printable(c.access_key_id))
    return absl::InvalidArgumentError(absl::StrCat(
        AV(from), ": access key id is not 1-128 printable characters"));
  // Never quoted: it is a secret.
  if (c.secret_access_key.size() > 256 || !printable(c.secret_access_key) ||
      c.secret_access_key.find(':') != std::string::npos)
    return absl::InvalidArgumentError(absl::StrCat(
        AV(from),
        ": secret access key is not 1-256 printable characters without ':'"));
  if (c.session_token.size() > 8192 || !printable(c.session_token))
    return absl::InvalidArgumentError(
        absl::StrCat(AV(from), ": session token is not printable"));
  return absl::OkStatus();
}

absl::Status ValidateRegion(std::string_view r, std::string_view field) {
  if (r.empty() || r.size() > 32)
    return absl::InvalidArgumentError(
        absl::StrCat(AV(field), ": not 1 to 32 characters"));
  for (char c : r) {
    if (!(absl::ascii_isalnum(c) || c == '-'))
      return absl::InvalidArgumentError(
          absl::StrCat(AV(field), ": ", QuotePrefix(r),
                       " has a character outside [A-Za-z0-9-]"));
  }
  return absl::OkStatus();
}

}  // namespace

bool IsObjectUrl(std::string_view s) {
  return absl::StartsWith(AV(s), AV(kObjectUrlScheme));
}

absl::StatusOr<ObjectUrl> ParseObjectUrl(std::string_view url,
                                         std::string_view field) {
  if (!IsObjectUrl(url))
    return absl::InvalidArgumentError(absl::StrCat(
        AV(field), ": ", QuotePrefix(url), " does not start with s3://"));
  std::string_view rest = url.substr(kObjectUrlScheme.size());
  while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  ObjectUrl out;
  size_t slash = rest.find('/');
  out.bucket = std::string(rest.substr(0, slash));
  if (slash != std::string_view::npos)
    out.prefix = std::string(rest.substr(slash + 1));
  CKPT_RETURN_IF_ERROR(ValidateBucket(out.bucket, field));
  CKPT_RETURN_IF_ERROR(ValidatePrefixPath(out.prefix, field));
  return out;
}

std::optional<std::string> ProcessEnv(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

absl::StatusOr<ObjectStoreOptions> ResolveObjectStoreOptions(
    std::string_view url, const ObjectStoreConfig& config,
    const EnvLookup& env) {
  CKPT_ASSIGN_OR_RETURN(ObjectUrl parsed, ParseObjectUrl(url));
  ObjectStoreOptions o;
  o.bucket = parsed.bucket;
  o.prefix = parsed.prefix;

  std::string region_from = "object_region";
  if (config.region) {
    o.region = *config.region;
  } else if (std::string r = Env(env, "AWS_REGION"); !r.empty()) {
    o.region = r, region_from = "AWS_REGION";
  } else if (std::string d = Env(env, "AWS_DEFAULT_REGION"); !d.empty()) {
    o.region = d, region_from = "AWS_DEFAULT_REGION";
  }
  CKPT_RETURN_IF_ERROR(ValidateRegion(o.region, region_from));

  std::string endpoint_from = "object_endpoint";
  if (config.endpoint) {
    o.endpoint = *config.endpoint;
  } else if (std::string e = Env(env, "AWS_ENDPOINT_URL_S3"); !e.empty()) {
    o.endpoint = e, endpoint_from = "AWS_ENDPOINT_URL_S3";
  } else if (std::string e2 = Env(env, "AWS_ENDPOINT_URL"); !e2.empty()) {
    o.endpoint = e2, endpoint_from = "AWS_ENDPOINT_URL";
  } else {
    o.endpoint = absl::StrCat("https://s3.", o.region, ".amazonaws.com");
    o.addressing = ObjectAddressing::kVirtualHost;
  }
  while (!o.endpoint.empty() && o.endpoint.back() == '/') o.endpoint.pop_back();
  CKPT_RETURN_IF_ERROR(ValidateEndpoint(o.endpoint, endpoint_from));

  if (config.addressing) {
    if (*config.addressing == "path") {
      o.addressing = ObjectAddressing::kPath;
    } else if (*config.addressing == "virtual") {
      o.addressing = ObjectAddressing::kVirtualHost;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("object_addressing: ", QuotePrefix(*config.addressing),
                       " is not \"path\" or \"virtual\""));
    }
  }
  if (config.part_size_mib) {
    if (*config.part_size_mib < 5 || *config.part_size_mib > 5120)
      return absl::InvalidArgumentError("object_part_mib: not in [5, 5120]");
    o.part_size = *config.part_size_mib << 20;
  }
  if (config.concurrency) {
    if (*config.concurrency < 1 || *config.concurrency > 64)
      return absl::InvalidArgumentError("object_concurrency: not in [1, 64]");
    o.concurrency = *config.concurrency;
  }
  if (config.verify_part_md5) o.verify_part_md5 = *config.verify_part_md5;
  if (config.max_attempts) {
    if (*config.max_attempts < 1 || *config.max_attempts > 100)
      return absl::InvalidArgumentError("object_max_attempts: not in [1, 100]");
    o.max_attempts = *config.max_attempts;
  }
  if (config.retry_budget_ms) o.retry_budget_ms = *config.retry_budget_ms;
  if (config.connect_timeout_ms) {
    if (*config.connect_timeout_ms < 1)
      return absl::InvalidArgumentError("object_connect_timeout_ms: 0");
    o.connect_timeout_ms = *config.connect_timeout_ms;
  }
  if (config.stall_timeout_ms) {
    if (*config.stall_timeout_ms < 1000)
      return absl::InvalidArgumentError(
          "object_stall_timeout_ms: less than 1000");
    o.stall_timeout_ms = *config.stall_timeout_ms;
  }

  // Credentials: the environment, else the shared credentials file.
  o.credentials.access_key_id = Env(env, "AWS_ACCESS_KEY_ID");
  o.credentials.secret_access_key = Env(env, "AWS_SECRET_ACCESS_KEY");
  o.credentials.session_token = Env(env, "AWS_SESSION_TOKEN");
  std::string from = "the environment";
  if (o.credentials.access_key_id.empty() &&
      o.credentials.secret_access_key.empty()) {
    std::string file = config.credentials_file.value_or(
        Env(env, "AWS_SHARED_CREDENTIALS_FILE"));
    if (file.empty()) {
      std::string home = Env(env, "HOME");
      if (!home.empty()) file = absl::StrCat(home, "/.aws/credentials");
    }
    std::string profile = config.profile.value_or(Env(env, "AWS_PROFILE"));
    if (profile.empty()) profile = "default";
    if (!file.empty()) {
      absl::StatusOr<ObjectCredentials> c = ReadCredentialsFile(file, profile);
      if (c.ok()) {
        o.credentials = *std::move(c);
        from = absl::StrCat("credentials file ", file, " [", profile, "]");
      } else if (!absl::IsNotFound(c.status()) || config.credentials_file) {
        return c.status();
      } else {
        from = absl::StrCat("the environment (and ", c.status().message(), ")");
      }
    }
  }
  CKPT_RETURN_IF_ERROR(ValidateCredentials(o.credentials, from));
  return o;
}

namespace {

// Every object-store key with its field: the one list the reader and
// ObjectStoreConfigKeys both walk.
template <typename Visit>
absl::Status VisitObjectKeys(ObjectStoreConfig* c, Visit visit) {
  absl::Status s = visit("object_endpoint", &c->endpoint);
  if (s.ok()) s = visit("object_region", &c->region);
  if (s.ok()) s = visit("object_addressing", &c->addressing);
  if (s.ok()) s = visit("object_part_mib", &c->part_size_mib);
  if (s.ok()) s = visit("object_concurrency", &c->concurrency);
  if (s.ok()) s = visit("object_verify_md5", &c->verify_part_md5);
  if (s.ok()) s = visit("object_max_attempts", &c->max_attempts);
  if (s.ok()) s = visit("object_retry_budget_ms", &c->retry_budget_ms);
  if (s.ok()) s = visit("object_connect_timeout_ms", &c->connect_timeout_ms);
  if (s.ok()) s = visit("object_stall_timeout_ms", &c->stall_timeout_ms);
  if (s.ok()) s = visit("object_credentials_file", &c->credentials_file);
  if (s.ok()) s = visit("object_profile", &c->profile);
  return s;
}

}  // namespace

absl::Status ReadObjectStoreConfig(const toml::table& t, ObjectStoreConfig* c) {
  return VisitObjectKeys(c, [&](const char* key, auto* field) -> absl::Status {
    using T = typename std::remove_reference_t<decltype(*field)>::value_type;
    if (!t.get(key)) return absl::OkStatus();
    T v{};
    CKPT_RETURN_IF_ERROR(FromToml(t, key, &v));
    *field = v;
    return absl::OkStatus();
  });
}

std::vector<std::string> ObjectStoreConfigKeys() {
  std::vector<std::string> keys;
  ObjectStoreConfig unused;
  (void)VisitObjectKeys(&unused, [&](const char* key, auto*) {
    keys.emplace_back(key);
    return absl::OkStatus();
  });
  return keys;
}

}  // namespace ckpt::storage
