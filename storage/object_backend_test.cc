// ObjectBackend against a real S3-compatible server (s3rver, started by the
// test on a free loopback port), directly and through the fault proxy,
// which also verifies every request's SigV4 signature with botocore.
#include "storage/object_backend.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "storage/object_http.h"
#include "storage/shard_reader.h"
#include "storage/shard_testing.h"
#include "tests/s3_server.h"
#include "tests/smaps.h"

namespace ckpt::storage {
namespace {

using ::ckpt::testing::FaultProxy;
using ::ckpt::testing::S3Server;

std::vector<char> RandomBytes(size_t n, uint32_t seed) {
  std::vector<char> v(n);
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i + 8 <= n; i += 8) {
    uint64_t x = rng();
    std::memcpy(v.data() + i, &x, 8);
  }
  for (size_t i = n / 8 * 8; i < n; ++i) v[i] = static_cast<char>(rng());
  return v;
}

// One server for the suite (each test under its own prefix, its name);
// the test that kills the server starts its own.
class ObjectBackendTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (S3Server::Unavailable().empty()) shared_ = new S3Server();
  }
  static void TearDownTestSuite() {
    delete shared_;
    shared_ = nullptr;
  }
  void SetUp() override {
    if (std::string why = S3Server::Unavailable(); !why.empty())
      GTEST_SKIP() << why;
    server_ = shared_;
    ASSERT_TRUE(server_ != nullptr && server_->ok()) << "s3rver did not start";
  }
  // The server's options under "<test name>/<prefix>".
  ObjectStoreOptions Options(const std::string& prefix) const {
    std::string name =
        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    return server_->Options(prefix.empty() ? name : name + "/" + prefix);
  }
  std::unique_ptr<Backend> Open(ObjectStoreOptions o) {
    absl::StatusOr<std::unique_ptr<Backend>> b = NewObjectBackend(std::move(o));
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? *std::move(b) : nullptr;
  }
  // Writes data as pieces of `piece` bytes, last piece first (parts become
  // ready out of order), and commits.
  static absl::Status WriteReversed(Backend& b, const std::string& key,
                                    const std::vector<char>& data,
                                    uint64_t piece) {
    absl::StatusOr<std::unique_ptr<ObjectWriter>> w =
        b.NewObjectWriter(key, data.size());
    if (!w.ok()) return w.status();
    std::vector<uint64_t> offsets;
    for (uint64_t off = 0; off < data.size(); off += piece)
      offsets.push_back(off);
    std::reverse(offsets.begin(), offsets.end());
    for (uint64_t off : offsets) {
      absl::Status s = (*w)->WriteAt(
          off, data.data() + off, std::min<uint64_t>(piece, data.size() - off));
      if (!s.ok()) return s;
    }
    return (*w)->Commit();
  }
  static std::vector<char> ReadAll(Backend& b, const std::string& key) {
    absl::StatusOr<std::unique_ptr<ObjectReader>> r = b.NewObjectReader(key);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    std::vector<char> out((*r)->size());
    absl::Status s = (*r)->ReadAt(0, out.data(), out.size());
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }
  // Multipart uploads the server still holds (ListMultipartUploads).
  size_t PendingUploads() {
    internal::ObjectHttp http(server_->Options(""));
    internal::HttpRequest req;
    req.method = "GET";
    req.query = {{"uploads", ""}};
    absl::StatusOr<internal::HttpResponse> r = http.Perform(req);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return 999;
    absl::StatusOr<internal::XmlReply> xml =
        internal::XmlReply::Parse(r->body, "uploads");
    EXPECT_TRUE(xml.ok()) << xml.status();
    absl::StatusOr<std::vector<std::string>> keys =
        xml->Each("ListMultipartUploadsResult", "Upload", "Key");
    if (!keys.ok()) return 999;
    for (const std::string& k : *keys)
      ADD_FAILURE() << "pending upload of " << k;
    return keys->size();
  }

  static S3Server* shared_;
  S3Server* server_ = nullptr;
};

S3Server* ObjectBackendTest::shared_ = nullptr;

TEST_F(ObjectBackendTest, SmallObjectRoundTripIsBitExact) {
  auto b = Open(Options("pre/fix"));
  std::vector<char> data = RandomBytes(1 << 20, 1);
  ASSERT_TRUE(WriteReversed(*b,
                            "job/step-00000000000000000001/rank-00000.shard",
                            data, 100000)
                  .ok());
  EXPECT_EQ(ReadAll(*b, "job/step-00000000000000000001/rank-00000.shard"),
            data);
  // The object name carries the prefix.
  EXPECT_TRUE(std::filesystem::exists(
      server_->data_dir() +
      "/ckpt-test/SmallObjectRoundTripIsBitExact/pre/fix/job"));
}

TEST_F(ObjectBackendTest, MultipartRoundTripIsBitExactAndLeavesNoUpload) {
  auto b = Open(Options("p"));
  std::vector<char> data =
      RandomBytes((23 << 20) + 12345, 2);  // 5 parts, the last ragged
  ASSERT_TRUE(WriteReversed(*b, "j/big.shard", data, 3 << 20 | 777).ok());
  EXPECT_EQ(ReadAll(*b, "j/big.shard"), data);
  // Ranged reads at odd offsets.
  absl::StatusOr<std::unique_ptr<ObjectReader>> r =
      b->NewObjectReader("j/big.shard");
  ASSERT_TRUE(r.ok());
  std::vector<char> piece(11 << 20);
  ASSERT_TRUE((*r)->ReadAt(4097, piece.data(), piece.size()).ok());
  EXPECT_TRUE(std::equal(piece.begin(), piece.end(), data.begin() + 4097));
  EXPECT_EQ(PendingUploads(), 0u);
  EXPECT_EQ(b->stats().objects_committed, 1u);
}

TEST_F(ObjectBackendTest, ReadAtNotifyReportsEachPieceOnceWhenItsBytesAreIn) {
  auto b = Open(Options("p"));
  std::vector<char> data = RandomBytes((23 << 20) + 12345, 3);
  ASSERT_TRUE(WriteReversed(*b, "j/notify.shard", data, 3 << 20).ok());
  absl::StatusOr<std::unique_ptr<ObjectReader>> r =
      b->NewObjectReader("j/notify.shard");
  ASSERT_TRUE(r.ok()) << r.status();
  const uint64_t off = 4097, len = data.size() - off - 5;
  std::vector<char> out(len);
  std::mutex mu;
  std::vector<std::pair<uint64_t, uint64_t>> pieces;
  uint64_t wrong = 0;  // reported bytes that were not yet the object's
  absl::Status s =
      (*r)->ReadAtNotify(off, out.data(), len, [&](uint64_t o, uint64_t n) {
        bool same = std::equal(out.begin() + (o - off),
                               out.begin() + (o - off + n), data.begin() + o);
        std::lock_guard<std::mutex> l(mu);
        pieces.emplace_back(o, n);
        if (!same) wrong += n;
      });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(wrong, 0u);
  // The pieces tile the range: every byte reported exactly once.
  std::sort(pieces.begin(), pieces.end());
  ASSERT_GT(pieces.size(), 1u) << "one piece: nothing reported early";
  uint64_t at = off;
  for (const auto& [o, n] : pieces) {
    EXPECT_EQ(o, at);
    at = o + n;
  }
  EXPECT_EQ(at, off + len);
  EXPECT_TRUE(std::equal(out.begin(), out.end(), data.begin() + off));
}

// Into memory that maps a /dev/shm file (an arena's slot): the bytes are
// written into the file, not stored through the mapping, which no byte
// faults in; every piece is reported once and the file holds the object.
// Each piece's bytes are shown to `received` in order as they come in.
TEST_F(ObjectBackendTest, ReadAtNotifyToFileWritesTheFileNotTheMapping) {
  auto b = Open(Options("p"));
  std::vector<char> data = RandomBytes((9 << 20) + 777, 4);
  ASSERT_TRUE(WriteReversed(*b, "j/tofile.shard", data, 3 << 20).ok());
  absl::StatusOr<std::unique_ptr<ObjectReader>> r =
      b->NewObjectReader("j/tofile.shard");
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string name = absl::StrCat("/ckpt-tofile-", ::getpid());
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ::shm_unlink(name.c_str());
  const uint64_t at = 2 << 20;  // dst's offset in the file
  const uint64_t file_bytes = at + data.size() + 4096;
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(file_bytes)), 0);
  ASSERT_EQ(
      ::fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(file_bytes)),
      0);
  void* m =
      ::mmap(nullptr, file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(m, MAP_FAILED);
  char* dst = static_cast<char*>(m) + at;
  std::mutex mu;
  uint64_t reported = 0;
  std::vector<char> shown(data.size());
  std::map<uint64_t, uint64_t> next;  // piece -> the next offset to show
  bool in_order = true;
  absl::Status s = (*r)->ReadAtNotifyToFile(
      0, dst, data.size(), {fd, at},
      [&](uint64_t, uint64_t n) {
        std::lock_guard<std::mutex> l(mu);
        reported += n;
      },
      [&](uint64_t piece, uint64_t from, const char* p, size_t n) {
        std::lock_guard<std::mutex> l(mu);
        if (from == piece) next[piece] = piece;  // a piece (re)starts
        if (!next.count(piece) || next[piece] != from ||
            from + n > shown.size()) {
          in_order = false;
          return;
        }
        std::memcpy(shown.data() + from, p, n);
        next[piece] = from + n;
      });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(reported, data.size());
  EXPECT_TRUE(in_order);
  uint64_t shown_bytes = 0;
  for (const auto& [piece, end] : next) shown_bytes += end - piece;
  EXPECT_EQ(shown_bytes, data.size());
  EXPECT_TRUE(shown == data) << "shown bytes differ from the object's";
  EXPECT_EQ(::ckpt::testing::PresentPages(dst, data.size() / 4096 * 4096), 0)
      << "stored through the mapping";
  std::vector<char> back(data.size());
  ASSERT_EQ(::pread(fd, back.data(), back.size(), static_cast<off_t>(at)),
            static_cast<ssize_t>(back.size()));
  EXPECT_TRUE(back == data);
  EXPECT_EQ(std::memcmp(dst, data.data(), data.size()), 0);
  ::munmap(m, file_bytes);
  ::close(fd);
}

TEST_F(ObjectBackendTest, EmptyObjectRoundTrips) {
  auto b = Open(Options(""));
  ASSERT_TRUE(b->PutSmallObject("j/empty", "").ok());
  absl::StatusOr<ObjectInfo> info = b->Stat("j/empty");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->size, 0u);
}

TEST_F(ObjectBackendTest, ListPaginatesStatAndDeleteWork) {
  ObjectStoreOptions o = Options("root");
  o.list_page_size = 3;
  auto b = Open(o);
  std::vector<std::string> keys;
  for (int i = 0; i < 7; ++i)
    keys.push_back("job/step-0000000000000000000" + std::to_string(i) +
                   "/MANIFEST");
  for (const std::string& k : keys)
    ASSERT_TRUE(b->PutSmallObject(k, "x" + k).ok());
  ASSERT_TRUE(b->PutSmallObject("other/a", "y").ok());
  absl::StatusOr<std::vector<std::string>> listed = b->List("job/");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(*listed, keys);
  absl::StatusOr<ObjectInfo> info = b->Stat(keys[2]);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->size, keys[2].size() + 1);
  EXPECT_FALSE(info->owner_uid.has_value());
  EXPECT_TRUE(absl::IsNotFound(b->Stat("job/nope").status()));
  EXPECT_TRUE(absl::IsNotFound(b->NewObjectReader("job/nope").status()));
  ASSERT_TRUE(b->Delete(keys[0]).ok());
  ASSERT_TRUE(b->Delete(keys[0]).ok());  // absent: still OK
  ASSERT_TRUE(b->DeletePrefix("job/").ok());
  listed = b->List("");
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(*listed, std::vector<std::string>{"other/a"});
}

TEST_F(ObjectBackendTest, BadKeysAndWritesAreRefused) {
  auto b = Open(Options(""));
  EXPECT_TRUE(absl::IsInvalidArgument(b->PutSmallObject("../x", "a")));
  absl::StatusOr<std::unique_ptr<ObjectWriter>> w =
      b->NewObjectWriter("j/x", 10);
  ASSERT_TRUE(w.ok());
  char buf[16] = {};
  EXPECT_TRUE(
      absl::IsInvalidArgument((*w)->WriteAt(8, buf, 4)));  // past the size
  ASSERT_TRUE((*w)->WriteAt(0, buf, 6).ok());
  EXPECT_TRUE(absl::IsInvalidArgument((*w)->WriteAt(4, buf, 2)));  // overlaps
  EXPECT_TRUE(absl::IsFailedPrecondition((*w)->Commit()));  // 6 of 10 bytes
  EXPECT_TRUE(absl::IsNotFound(b->Stat("j/x").status()));
}

TEST_F(ObjectBackendTest, ServerErrorsAndSlowDownAreRetriedAndSucceed) {
  FaultProxy proxy(*server_);
  ASSERT_TRUE(proxy.ok());
  ObjectStoreOptions o = Options("f");
  o.endpoint = proxy.endpoint();
  auto b = Open(o);
  ASSERT_TRUE(proxy.Fault(
      "kind=status&status=503&code=SlowDown&count=2&match=partNumber=2"));
  ASSERT_TRUE(proxy.Fault(
      "kind=status&status=500&code=InternalError&count=1&match=POST"));
  ASSERT_TRUE(proxy.Fault(
      "kind=status&status=429&code=TooManyRequests&count=1&match=GET"));
  std::vector<char> data = RandomBytes(12 << 20, 3);
  ASSERT_TRUE(WriteReversed(*b, "j/s.shard", data, 1 << 20).ok());
  EXPECT_EQ(ReadAll(*b, "j/s.shard"), data);
  EXPECT_EQ(proxy.Stat("faults_left"), 0);
  EXPECT_GE(GetObjectStoreStats(*b).retries, 4u);
  EXPECT_EQ(proxy.Stat("rejected"), 0)
      << "a request's SigV4 signature did not verify";
}

TEST_F(ObjectBackendTest, StalledAndCutConnectionsAreRetried) {
  FaultProxy proxy(*server_);
  ASSERT_TRUE(proxy.ok());
  ObjectStoreOptions o = Options("f");
  o.endpoint = proxy.endpoint();
  auto b = Open(o);
  ASSERT_TRUE(proxy.Fault("kind=stall&seconds=6&count=1&match=partNumber=1"));
  ASSERT_TRUE(proxy.Fault("kind=cut&count=1&match=partNumber=2"));
  ASSERT_TRUE(proxy.Fault("kind=cut&count=1&match=GET"));
  std::vector<char> data = RandomBytes(11 << 20, 4);
  ASSERT_TRUE(WriteReversed(*b, "j/c.shard", data, 5 << 20).ok());
  EXPECT_EQ(ReadAll(*b, "j/c.shard"), data);
  EXPECT_EQ(proxy.Stat("faults_left"), 0);
  EXPECT_GE(GetObjectStoreStats(*b).retries, 3u);
}

TEST_F(ObjectBackendTest, LostCreateReplyLeavesNoOrphanUpload) {
  FaultProxy proxy(*server_);
  ASSERT_TRUE(proxy.ok());
  ObjectStoreOptions o = Options("f");
  o.endpoint = proxy.endpoint();
  auto b = Open(o);
  // The store creates the upload but its reply never arrives; the retry
  // creates a second one, and the first must not be left behind.
  ASSERT_TRUE(proxy.Fault("kind=drop&count=1&match=uploads="));
  std::vector<char> data = RandomBytes(11 << 20, 8);
  ASSERT_TRUE(WriteReversed(*b, "j/lost.shard", data, 11 << 20).ok());
  EXPECT_EQ(proxy.Stat("faults_left"), 0);
  EXPECT_EQ(PendingUploads(), 0u);
  EXPECT_EQ(ReadAll(*b, "j/lost.shard"), data);
}

TEST_F(ObjectBackendTest, PersistentFailureAbortsTheUploadAndNamesTheKey) {
  FaultProxy proxy(*server_);
  ASSERT_TRUE(proxy.ok());
  ObjectStoreOptions o = Options("f");
  o.endpoint = proxy.endpoint();
  o.max_attempts = 3;
  auto b = Open(o);
  ASSERT_TRUE(
      proxy.Fault("kind=status&status=503&code=ServiceUnavailable&count=1000&"
                  "match=partNumber=2"));
  std::vector<char> data = RandomBytes(12 << 20, 5);
  absl::Status s = WriteReversed(*b, "j/fail.shard", data, 12 << 20);
  ASSERT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_NE(s.message().find(proxy.endpoint()), std::string::npos) << s;
  EXPECT_NE(s.message().find("bucket ckpt-test"), std::string::npos) << s;
  EXPECT_NE(s.message().find("/f/j/fail.shard"), std::string::npos) << s;
  EXPECT_NE(s.message().find("3 attempts"), std::string::npos) << s;
  EXPECT_TRUE(absl::IsNotFound(b->Stat("j/fail.shard").status()));
  EXPECT_EQ(PendingUploads(), 0u);
  EXPECT_EQ(GetObjectStoreStats(*b).aborted_uploads, 1u);
}

TEST_F(ObjectBackendTest, WrongAccessKeyFailsOnceWithAClearError) {
  FaultProxy proxy(*server_, /*verify=*/false);
  ASSERT_TRUE(proxy.ok());
  ObjectStoreOptions o = Options("f");
  o.endpoint = proxy.endpoint();
  o.credentials.access_key_id = "NOT-A-KEY";
  auto b = Open(o);
  absl::Status s = b->PutSmallObject("j/MANIFEST", "{}");
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_NE(s.message().find("InvalidAccessKeyId"), std::string::npos) << s;
  EXPECT_NE(s.message().find("/f/j/MANIFEST"), std::string::npos) << s;
  EXPECT_EQ(proxy.Stat("requests"), 1) << "no retry storm";
}

TEST_F(ObjectBackendTest,
       WrongSecretAndCorruptedSignatureAreRejectedWithoutRetry) {
  FaultProxy proxy(*server_);
  ASSERT_TRUE(proxy.ok());
  ObjectStoreOptions o = Options("f");
  o.endpoint = proxy.endpoint();
  o.credentials.secret_access_key = "wrong-secret";
  auto wrong = Open(o);
  absl::Status s = wrong->PutSmallObject("j/a", "{}");
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_NE(s.message().find("SignatureDoesNotMatch"), std::string::npos) << s;
  EXPECT_EQ(proxy.Stat("requests"), 1);

  o.credentials.secret_access_key = ::ckpt::testing::kS3SecretKey;
  auto right = Open(o);
  ASSERT_TRUE(right->PutSmallObject("j/b", "{}").ok());
  ASSERT_TRUE(proxy.Fault("kind=badsig&count=1"));
  s = right->PutSmallObject("j/c", "{}");
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_EQ(proxy.Stat("requests"), 3);
  EXPECT_EQ(proxy.Stat("rejected"), 2);
}

TEST_F(ObjectBackendTest, ServerKilledMidUploadAndRestartedCompletesTheUpload) {
  S3Server own;  // killed and restarted: not the suite's
  ASSERT_TRUE(own.ok());
  server_ = &own;
  ObjectStoreOptions o = Options("k");
  o.concurrency = 2;
  o.max_attempts = 40;  // rides out the restart (node takes ~0.5 s)
  auto b = Open(o);
  std::vector<char> data = RandomBytes(60 << 20, 6);
  absl::Status result;
  std::thread upload(
      [&] { result = WriteReversed(*b, "j/killed.shard", data, 60 << 20); });
  // Kill once the server holds a part, then bring it back on the same port.
  for (int i = 0; i < 400 && GetObjectStoreStats(*b).requests < 3; ++i)
    usleep(5000);
  server_->Kill();
  usleep(300000);
  ASSERT_TRUE(server_->Restart());
  upload.join();
  ASSERT_TRUE(result.ok()) << result;
  EXPECT_GE(GetObjectStoreStats(*b).retries, 1u);
  EXPECT_EQ(ReadAll(*b, "j/killed.shard"), data);
  EXPECT_EQ(PendingUploads(), 0u);
}

TEST_F(ObjectBackendTest, TruncatedOrFlippedShardIsDataLossNamingTheKey) {
  auto b = Open(Options("d"));
  Shard shard = MakeShard({{1024, 1024}, {4096}});
  const std::string key = "job-a/step-00000000000000000042/rank-00001.shard";
  ASSERT_TRUE(b->PutSmallObject(key, std::string_view(shard.image.data(),
                                                      shard.image.size()))
                  .ok());
  ASSERT_TRUE(VerifyShard(*b, key).ok());

  std::string flipped(shard.image.data(), shard.image.size());
  flipped[shard.info.tensors[0].offset + 1000] ^= 0x10;
  ASSERT_TRUE(b->PutSmallObject(key, flipped).ok());
  absl::Status s = VerifyShard(*b, key);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find(key), std::string::npos) << s;

  ASSERT_TRUE(
      b->PutSmallObject(
           key, std::string_view(shard.image.data(), shard.image.size() - 4096))
          .ok());
  s = VerifyShard(*b, key);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find(key), std::string::npos) << s;
  // A reader asked past the (now shorter) end.
  absl::StatusOr<std::unique_ptr<ObjectReader>> r = b->NewObjectReader(key);
  ASSERT_TRUE(r.ok());
  std::vector<char> all(shard.image.size());
  s = (*r)->ReadAt(0, all.data(), all.size());
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find(key), std::string::npos) << s;
}

}  // namespace
}  // namespace ckpt::storage
