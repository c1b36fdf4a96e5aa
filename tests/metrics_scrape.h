// Test support for the metrics tests: an HTTP GET through libcurl, a free
// loopback port and a command runner that captures exit status and output
// (the text-format parser is metrics_text.h). Header-only; not
// thread-safe.
#ifndef CKPT_TESTS_METRICS_SCRAPE_H_
#define CKPT_TESTS_METRICS_SCRAPE_H_

#include <curl/curl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <optional>
#include <string>

#include "tests/metrics_text.h"
#include "tests/test_util.h"

namespace ckpt::testing {

// The body of http://<host_port><path>, or nullopt when the request fails
// or the status is not 200.
inline std::optional<std::string> HttpGet(const std::string& url) {
  static const bool init = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
  if (!init) return std::nullopt;
  CURL* curl = curl_easy_init();
  if (!curl) return std::nullopt;
  std::string body;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_TIMEOUT, 10L);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(
      curl, CURLOPT_WRITEFUNCTION,
      +[](char* p, size_t size, size_t n, void* out) {
        static_cast<std::string*>(out)->append(p, size * n);
        return size * n;
      });
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
  CURLcode rc = curl_easy_perform(curl);
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_cleanup(curl);
  if (rc != CURLE_OK || status != 200) return std::nullopt;
  return body;
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_METRICS_SCRAPE_H_
