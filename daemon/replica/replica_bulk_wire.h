// The bulk path's wire (doc/replicas.md "Transport"): what goes over the
// plain TCP connection that carries a replica's bytes once the
// authenticated gRPC channel agreed on them (replica_bulk.h: the holder's
// tokens and listener; replica_bulk_client.h: the caller's side).
//
//   caller -> holder   a 64-byte header: magic "CKPTBLK1", kind (1 put,
//                      2 get), 4 reserved zero bytes, the 16-byte token
//                      of the offer, offset (0), length (the offer's
//                      image_bytes), 16 reserved zero bytes; integers
//                      little-endian
//   holder -> caller   a reply: accepted, or refused naming the field
//   the image's bytes  put: caller -> holder; get: holder -> caller
//   holder -> caller   a reply: put, the verification's outcome and the
//                      digest; get, whether the source stayed unchanged
//
// A reply is 32 bytes: magic "CKPTBRS1", the status code (absl's), the
// message's length (at most kMaxBulkMessage), the digest, 8 reserved zero
// bytes; then the message. Every field read from a socket is checked, a
// refusal names it. Free functions, thread-compatible.
#ifndef CKPT_DAEMON_REPLICA_REPLICA_BULK_WIRE_H_
#define CKPT_DAEMON_REPLICA_REPLICA_BULK_WIRE_H_

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ckpt::daemon {

inline constexpr size_t kBulkTokenBytes = 16;
inline constexpr size_t kBulkHeaderBytes = 64;
inline constexpr size_t kBulkReplyBytes = 32;
inline constexpr uint32_t kMaxBulkMessage = 1024;
// Bytes a sender hands the kernel (or a receiver asks of it) in one call.
inline constexpr uint64_t kBulkIoBytes = 8ull << 20;

enum class BulkKind : uint32_t { kPut = 1, kGet = 2 };
const char* BulkKindName(BulkKind kind);

struct BulkHeader {
  BulkKind kind = BulkKind::kPut;
  std::string token;  // kBulkTokenBytes raw bytes
  uint64_t offset = 0;
  uint64_t length = 0;
};

using BulkDeadline = std::chrono::steady_clock::time_point;

std::array<char, kBulkHeaderBytes> EncodeBulkHeader(const BulkHeader& h);
// The header's fixed fields checked (magic, kind, reserved; the token's
// and the sizes' meaning is the holder's to check): InvalidArgument naming
// the field.
[[nodiscard]] absl::StatusOr<BulkHeader> DecodeBulkHeader(const char* p);

// Writes a reply (`status`'s code and message, cut to kMaxBulkMessage).
[[nodiscard]] absl::Status WriteBulkReply(int fd, const absl::Status& status,
                                          uint64_t digest,
                                          BulkDeadline deadline);
// Reads a reply: the holder's status (its code and message, prefixed with
// `what`), with *digest set; DataLoss naming the field when the reply is
// malformed, Unavailable when the connection failed.
[[nodiscard]] absl::Status ReadBulkReply(
    int fd, BulkDeadline deadline, std::string_view what, uint64_t* digest,
    const std::atomic<bool>* cancel = nullptr);

// Every byte, or an error: DeadlineExceeded past `deadline` or after
// `stall` without progress, Unavailable when the peer left, Cancelled
// within one socket wakeup of *cancel turning true (optional). `what`
// names the transfer in the message.
inline constexpr std::chrono::milliseconds kNoStallLimit{std::chrono::hours(1)};
[[nodiscard]] absl::Status SendAll(
    int fd, const char* p, uint64_t n, BulkDeadline deadline,
    std::string_view what, std::chrono::milliseconds stall = kNoStallLimit,
    const std::atomic<bool>* cancel = nullptr);
[[nodiscard]] absl::Status RecvAll(
    int fd, char* p, uint64_t n, BulkDeadline deadline, std::string_view what,
    std::chrono::milliseconds stall = kNoStallLimit,
    const std::atomic<bool>* cancel = nullptr);

// A connected socket's options for the loops above: blocking calls that
// wake every 250 ms to look at the deadline, no Nagle delay.
void PrepareBulkSocket(int fd);

// A connected TCP socket to host:port (Unavailable naming both).
[[nodiscard]] absl::StatusOr<int> ConnectBulk(const std::string& host,
                                              uint32_t port,
                                              BulkDeadline deadline);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_REPLICA_REPLICA_BULK_WIRE_H_
