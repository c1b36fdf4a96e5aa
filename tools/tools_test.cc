// Runs the real ckptctl binary against shard files written through the
// storage backend, intact and damaged, and checks exit codes and output.
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "storage/backend.h"
#include "storage/keys.h"
#include "storage/layout.h"
#include "storage/layout_format.h"
#include "storage/manifest.h"
#include "storage/shard_testing.h"
#include "tests/temp_dir.h"
#include "tests/test_util.h"
#include "util/checksum.h"

namespace ckpt::tools {
namespace {

using CtlRun = ::ckpt::testing::CommandResult;

CtlRun Ckptctl(const std::string& args) {
  return ::ckpt::testing::RunCommand(std::string(CKPTCTL_PATH) + " " + args,
                                     /*with_stderr=*/false);
}

std::string ReadFile(const std::string& path) {
  return ::ckpt::testing::ReadFileToString(path);
}

class CkptctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    shard_ = storage::MakeShard({{256, 1024}, {3, 5}, {2048, 600}}, 7);
    key_ =
        storage::ShardKey(shard_.info.job, shard_.info.step, shard_.info.rank);
    storage::LocalBackendOptions o;
    o.root = dir_.path();
    auto backend = storage::NewLocalBackend(o);
    ASSERT_TRUE(backend.ok()) << backend.status();
    auto w = (*backend)->NewObjectWriter(key_, shard_.image.size());
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE(
        (*w)->WriteAt(0, shard_.image.data(), shard_.image.size()).ok());
    ASSERT_TRUE((*w)->Commit().ok());
    path_ = dir_.path() + "/" + key_;
  }

  void Overwrite(uint64_t offset, const std::string& bytes) {
    FILE* f = fopen(path_.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    fseek(f, static_cast<long>(offset), SEEK_SET);
    fwrite(bytes.data(), 1, bytes.size(), f);
    fclose(f);
  }

  std::string Selector() const {
    return absl::StrFormat("--root %s --job %s --step %d --rank %d",
                           dir_.path(), shard_.info.job, shard_.info.step,
                           shard_.info.rank);
  }

  ckpt::testing::TempDir dir_;
  storage::Shard shard_;
  std::string key_;
  std::string path_;
};

TEST_F(CkptctlTest, VerifySucceedsOnIntactShard) {
  CtlRun r = Ckptctl("verify --root " + dir_.path());
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("OK"), std::string::npos) << r.out;
}

TEST_F(CkptctlTest, VerifyNamesTheDamagedTensor) {
  const storage::ShardTensor& t = shard_.info.tensors[2];
  Overwrite(
      t.offset + t.bytes / 2,
      std::string(1, static_cast<char>(~shard_.image[t.offset + t.bytes / 2])));
  CtlRun r = Ckptctl("verify --root " + dir_.path());
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("layer2.weight"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("layer0.weight"), std::string::npos) << r.out;
}

TEST_F(CkptctlTest, VerifyFailsOnTruncatedShard) {
  ASSERT_EQ(
      truncate(path_.c_str(), static_cast<off_t>(shard_.image.size() - 4096)),
      0);
  CtlRun r = Ckptctl("verify --root " + dir_.path() + " --job job-a --step 42");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("truncated"), std::string::npos) << r.out;
}

TEST_F(CkptctlTest, VerifyFailsOnGarbageHeader) {
  Overwrite(0, "garbage!");
  CtlRun r = Ckptctl("verify --root " + dir_.path() + " --json");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("\"ok\":false"), std::string::npos) << r.out;
}

TEST_F(CkptctlTest, VerifyFailsWhenManifestSizeDisagrees) {
  std::string manifest = absl::StrFormat(
      R"({"format":"ckptd-manifest-v1","job":"job-a","step":42,"world_size":1,"shards":[{"rank":1,"key":"%s","bytes":%d,"tensors":3}]})",
      key_, shard_.image.size() + 4096);
  std::ofstream(dir_.path() + "/" + storage::ManifestKey("job-a", 42))
      << manifest;
  CtlRun r = Ckptctl("verify --root " + dir_.path());
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("manifest says"), std::string::npos) << r.out;
}

TEST_F(CkptctlTest, VerifyFailsOnUnknownStep) {
  EXPECT_EQ(Ckptctl("verify --root " + dir_.path() + " --job job-a --step 7")
                .exit_code,
            1);
}

// A root with nothing in it (an empty directory, or the parent of the real
// root typed by mistake) is not "0 problems": nothing was verified.
TEST(CkptctlVerifyTest, RootWithNothingToVerifyFailsSayingSo) {
  ::ckpt::testing::TempDir dir;
  CtlRun r = ::ckpt::testing::RunCommand(
      std::string(CKPTCTL_PATH) + " verify --root " + dir.path(),
      /*with_stderr=*/true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("nothing to verify under " + dir.path()),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("0 problem(s)"), std::string::npos) << r.out;
}

TEST_F(CkptctlTest, InspectListsEveryTensor) {
  CtlRun r = Ckptctl("inspect --json " + path_);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  for (const auto& t : shard_.info.tensors)
    EXPECT_NE(r.out.find(t.name), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"shape\":[3,5]"), std::string::npos) << r.out;
}

// A version-2 shard (a tensor placed in a global tensor): verify passes and
// inspect shows the layout.
TEST(CkptctlLayoutTest, InspectShowsTheLayoutAndVerifyPasses) {
  ::ckpt::testing::TempDir dir;
  storage::Shard shard =
      storage::MakeShard({{3, 4}, {5}}, 3, [](storage::ShardInfo& info) {
        info.tensors[0].global_shape = {9, 4};
        info.tensors[0].piece_offsets = {6, 0};
        info.tensors[0].global_name = "w";
      });
  const std::string key =
      storage::ShardKey(shard.info.job, shard.info.step, shard.info.rank);
  storage::LocalBackendOptions o;
  o.root = dir.path();
  auto backend = storage::NewLocalBackend(o);
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto w = (*backend)->NewObjectWriter(key, shard.image.size());
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->WriteAt(0, shard.image.data(), shard.image.size()).ok());
  ASSERT_TRUE((*w)->Commit().ok());
  CtlRun r = Ckptctl("inspect --json " + dir.path() + "/" + key);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("\"format_version\":2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"global_shape\":[9,4],\"piece_offsets\":[6,0],"
                       "\"global_name\":\"w\""),
            std::string::npos)
      << r.out;
  r = Ckptctl("verify --root " + dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.out;
}

TEST_F(CkptctlTest, RestoreWritesOneFilePerTensor) {
  std::string out = dir_.path() + "/out/";
  CtlRun r = Ckptctl("restore " + Selector() + " --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  for (const auto& t : shard_.info.tensors)
    EXPECT_EQ(ReadFile(out + t.name + ".bin"),
              std::string(shard_.image.data() + t.offset, t.bytes));
  EXPECT_NE(ReadFile(out + "index.json").find("layer1.weight"),
            std::string::npos);
}

TEST_F(CkptctlTest, RestoreCopiesShardFile) {
  std::string out = dir_.path() + "/copy.shard";
  ASSERT_EQ(Ckptctl("restore " + Selector() + " --out " + out).exit_code, 0);
  EXPECT_EQ(ReadFile(out),
            std::string(shard_.image.data(), shard_.image.size()));
}

TEST_F(CkptctlTest, RestoreRefusesDamagedTensor) {
  const storage::ShardTensor& t = shard_.info.tensors[0];
  Overwrite(t.offset,
            std::string(1, static_cast<char>(~shard_.image[t.offset])));
  std::string out = dir_.path() + "/copy.shard";
  EXPECT_EQ(Ckptctl("restore " + Selector() + " --out " + out).exit_code, 1);
  EXPECT_FALSE(std::ifstream(out).good());
}

TEST_F(CkptctlTest, ListWithoutDaemonFailsClearly) {
  EXPECT_EQ(Ckptctl("--socket " + dir_.path() + "/nope.sock list").exit_code,
            1);
}

// A cluster root, written through the storage API as a two-node job does:
// node n1 hosts ranks 0-1, n2 ranks 2-3; each node writes
// "rank-R.<node>.shard" and "MANIFEST.<node>", the coordinator
// "MANIFEST.global".
class ClusterRootTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kStep = 42;
  void SetUp() override {
    storage::LocalBackendOptions o;
    o.root = dir_.path();
    auto backend = storage::NewLocalBackend(o);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(*backend);
    storage::v1::GlobalManifest global;
    global.set_format(storage::kGlobalManifestFormat);
    global.set_job("job-c");
    global.set_step(kStep);
    global.set_world_size(4);
    for (const char* node : {"n1", "n2"}) {
      storage::v1::NodeManifest m;
      m.set_job("job-c");
      m.set_step(kStep);
      m.set_world_size(4);
      for (uint32_t rank : node == std::string("n1")
                               ? std::vector<uint32_t>{0, 1}
                               : std::vector<uint32_t>{2, 3}) {
        storage::Shard shard =
            storage::MakeShard({{64, 256}, {1000}}, 10 + rank);
        shard.info.job = "job-c";
        shard.info.rank = rank;
        ASSERT_TRUE(storage::EncodeShardMetadata(shard.info, shard.image).ok());
        const std::string key = storage::ShardKey("job-c", kStep, rank, node);
        auto w = backend_->NewObjectWriter(key, shard.image.size());
        ASSERT_TRUE(w.ok()) << w.status();
        ASSERT_TRUE(
            (*w)->WriteAt(0, shard.image.data(), shard.image.size()).ok());
        ASSERT_TRUE((*w)->Commit().ok());
        std::vector<uint64_t> sums;
        for (const auto& t : shard.info.tensors) sums.push_back(t.checksum);
        const std::string digest =
            storage::DigestHex(storage::ChecksumsDigest(sums));
        auto* s = m.add_shards();
        s->set_rank(rank);
        s->set_key(key);
        s->set_bytes(shard.image.size());
        s->set_tensors(static_cast<uint32_t>(shard.info.tensors.size()));
        s->set_checksums_digest(digest);
        auto* g = global.add_shards();
        g->set_rank(rank);
        g->set_key(key);
        g->set_bytes(shard.image.size());
        g->set_checksum_digest(digest);
        g->set_node_id(node);
        shards_[rank] = shard;
      }
      ASSERT_TRUE(storage::WriteNodeManifest(*backend_, m, node).ok());
    }
    ASSERT_TRUE(storage::WriteGlobalManifest(*backend_, global).ok());
  }
  std::string PathOf(const std::string& key) const {
    return *backend_->LocalPath(key);
  }

  ckpt::testing::TempDir dir_;
  std::unique_ptr<storage::Backend> backend_;
  std::map<uint32_t, storage::Shard> shards_;
};

TEST_F(ClusterRootTest,
       VerifyChecksNodeSuffixedShardsNodeManifestsAndTheGlobalManifest) {
  CtlRun r = Ckptctl("verify --root " + dir_.path());
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("4 shard(s)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("3 manifest(s); 0 problem(s)"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("OK      " + storage::ShardKey("job-c", kStep, 3, "n2")),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("note:"), std::string::npos)
      << r.out;  // every step has its manifests
}

TEST_F(ClusterRootTest, VerifyNamesTheKeyOfAFlippedByteInANodeSuffixedShard) {
  const std::string key = storage::ShardKey("job-c", kStep, 3, "n2");
  const storage::ShardTensor& t = shards_[3].info.tensors[1];
  FILE* f = fopen(PathOf(key).c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  fseek(f, static_cast<long>(t.offset + 10), SEEK_SET);
  fputc(~shards_[3].image[t.offset + 10], f);
  fclose(f);
  CtlRun r = Ckptctl("verify --root " + dir_.path());
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("DAMAGED " + key), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(key + ": tensor \"layer1.weight\": checksum mismatch"),
            std::string::npos)
      << r.out;
}

// A node manifest's chunk hashes (doc/resharding.md, "A lost node's saved
// rank") are checked against the shard they list: right ones pass, one
// that does not combine into its tensor's checksum is a problem naming
// the field and the tensor.
TEST_F(ClusterRootTest, VerifyChecksTheNodeManifestsChunkHashes) {
  const std::string mkey = storage::ManifestKey("job-c", kStep, "n2");
  auto m = storage::ReadNodeManifest(*backend_, mkey);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->shards(1).rank(), 3u);
  const storage::ShardTensor& t = shards_[3].info.tensors[0];
  ASSERT_EQ(ChecksumChunks(t.bytes), 1u);  // its checksum: of one hash
  const uint64_t hash = Hash64(shards_[3].image.data() + t.offset, t.bytes);
  ASSERT_EQ(CombineChunkHashes({{hash}}), t.checksum);
  storage::AddChunkHashes(m->mutable_shards(1), 0, {{hash}});
  ASSERT_TRUE(storage::WriteNodeManifest(*backend_, *m, "n2").ok());
  CtlRun r = Ckptctl("verify --root " + dir_.path());
  EXPECT_EQ(r.exit_code, 0) << r.out;
  m->mutable_shards(1)->clear_chunk_hashes();
  storage::AddChunkHashes(m->mutable_shards(1), 0, {{hash ^ 1}});
  ASSERT_TRUE(storage::WriteNodeManifest(*backend_, *m, "n2").ok());
  r = Ckptctl("verify --root " + dir_.path());
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("shards[1].chunk_hashes[0].hashes (tensor \"" + t.name +
                       "\"): they do not combine"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(mkey), std::string::npos) << r.out;
}

TEST_F(ClusterRootTest, VerifyFlagsAShardTheManifestsListButStorageLacks) {
  ASSERT_TRUE(
      backend_->Delete(storage::ShardKey("job-c", kStep, 0, "n1")).ok());
  CtlRun r = Ckptctl("verify --root " + dir_.path() + " --json");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("\"key\":\"" +
                       storage::ManifestKey("job-c", kStep, "n1") + "\""),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("\"key\":\"" +
                       storage::GlobalManifestKey("job-c", kStep) + "\""),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("rank 0: listed shard"), std::string::npos) << r.out;
}

// A node manifest carrying the step's layout index: inspect shows every
// piece, verify still accepts the root.
TEST_F(ClusterRootTest, InspectOfAManifestShowsItsLayoutIndex) {
  const std::string key = storage::ManifestKey("job-c", kStep, "n1");
  auto text = storage::ReadManifestText(*backend_, key);
  ASSERT_TRUE(text.ok()) << text.status();
  auto m = storage::DecodeNodeManifest(*text, key);
  ASSERT_TRUE(m.ok()) << m.status();
  storage::LayoutIndexBuilder b(4);
  const uint64_t shape[] = {8};
  auto w = b.AddTensor("w", DType::kFloat32, shape);
  ASSERT_TRUE(w.ok()) << w.status();
  for (uint32_t rank : {0u, 1u}) {
    const uint64_t off[] = {4 * rank}, len[] = {4};
    ASSERT_TRUE(b.AddPiece(*w, rank, 8192, off, len).ok());
  }
  auto index = std::move(b).Finish();
  ASSERT_TRUE(index.ok()) << index.status();
  m->set_layout_index(storage::SerializeLayoutIndex(*index));
  ASSERT_TRUE(storage::WriteNodeManifest(*backend_, *m, "n1").ok());

  CtlRun r = Ckptctl("inspect --json " + PathOf(key));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("\"pieces\":2,\"tensors\":[{\"name\":\"w\","
                       "\"dtype\":\"float32\",\"global_shape\":[8],"
                       "\"pieces\":[{\"rank\":0,\"offsets\":[0],"
                       "\"lengths\":[4]},{\"rank\":1,\"offsets\":[4],"
                       "\"lengths\":[4]}]}]"),
            std::string::npos)
      << r.out;
  CtlRun t = Ckptctl("inspect " + PathOf(key));
  EXPECT_NE(t.out.find("index of 1 tensors, 2 pieces"), std::string::npos)
      << t.out;
  EXPECT_EQ(Ckptctl("verify --root " + dir_.path()).exit_code, 0);
}

TEST_F(ClusterRootTest, ListRootShowsEveryNodesShardsAndManifests) {
  CtlRun r = Ckptctl("list --root " + dir_.path() + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  for (const char* want :
       {"\"job\":\"job-c\"", "\"step\":42", "\"node\":\"n2\"",
        "\"MANIFEST.global\"", "\"MANIFEST.n1\"", "\"MANIFEST.n2\""})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << " in " << r.out;
  CtlRun table = Ckptctl("list --root " + dir_.path() + " --job job-c");
  EXPECT_EQ(table.exit_code, 0) << table.out;
  EXPECT_NE(table.out.find("n1,n2"), std::string::npos) << table.out;
}

TEST_F(ClusterRootTest,
       InspectFindsARanksShardOnAClusterRootAndReadsManifests) {
  CtlRun r = Ckptctl(
      absl::StrFormat("inspect --json --root %s --job job-c --step %d --rank 2",
                      dir_.path(), kStep));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("rank-00002.n2.shard"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"rank\":2"), std::string::npos) << r.out;
  CtlRun g = Ckptctl("inspect --json " +
                     PathOf(storage::GlobalManifestKey("job-c", kStep)));
  EXPECT_EQ(g.exit_code, 0) << g.out;
  EXPECT_NE(g.out.find("\"global\":true"), std::string::npos) << g.out;
  EXPECT_NE(g.out.find(storage::ShardKey("job-c", kStep, 1, "n1")),
            std::string::npos)
      << g.out;
  CtlRun n =
      Ckptctl("inspect " + PathOf(storage::ManifestKey("job-c", kStep, "n2")));
  EXPECT_EQ(n.exit_code, 0) << n.out;
  EXPECT_NE(n.out.find(storage::ShardKey("job-c", kStep, 3, "n2")),
            std::string::npos)
      << n.out;
}

// Which write of a MANIFEST.global the coordinator committed is in its state,
// not on the root; what the root can show is each manifest's stamp, and a
// stamp older than an earlier step's (a deposed leader's late write, or a
// timeline a rollback abandoned) is flagged.
TEST_F(ClusterRootTest, ListRootShowsStampsAndFlagsAManifestOlderThanItsPast) {
  auto m = storage::ReadGlobalManifest(*backend_, "job-c", kStep);
  ASSERT_TRUE(m.ok()) << m.status();
  m->set_generation(1);
  m->set_fence(1);
  ASSERT_TRUE(storage::WriteGlobalManifest(*backend_, *m).ok());
  m->set_step(kStep - 2);
  m->set_generation(3);
  m->set_fence(2);
  ASSERT_TRUE(storage::WriteGlobalManifest(*backend_, *m).ok());
  CtlRun r = Ckptctl("list --root " + dir_.path() + " --json");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(
      r.out.find(
          "\"generation\":1,\"fence\":1,\"suspect\":\"older than step 40's"),
      std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("\"generation\":3,\"fence\":2,\"suspect\":\"\""),
            std::string::npos)
      << r.out;
  CtlRun table = Ckptctl("list --root " + dir_.path() + " --job job-c");
  EXPECT_EQ(table.exit_code, 0) << table.out;
  EXPECT_NE(
      table.out.find("note: " + storage::GlobalManifestKey("job-c", kStep) +
                     ": generation 1 fence 1, older than step 40's"),
      std::string::npos)
      << table.out;
  CtlRun g =
      Ckptctl("inspect " + PathOf(storage::GlobalManifestKey("job-c", kStep)));
  EXPECT_EQ(g.exit_code, 0) << g.out;
  EXPECT_NE(g.out.find("generation 1\nfence      1\n"), std::string::npos)
      << g.out;
}

// A step read whole (export, reshard) from a cluster root goes by
// MANIFEST.global; its ranks' whole tensors of one name are replicas only
// if they hold the same bytes. Here every rank's are random: refused,
// naming the tensor and the ranks, and nothing is written.
TEST_F(ClusterRootTest, ExportOfAStepRefusesWholeTensorsThatDifferByRank) {
  const std::string out = dir_.path() + "/step.safetensors";
  CtlRun r = ::ckpt::testing::RunCommand(
      absl::StrFormat("%s export --root %s --job job-c --step %d --out %s",
                      CKPTCTL_PATH, dir_.path(), kStep, out),
      /*with_stderr=*/true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("tensor \"layer0.weight\": ranks 0 and 1 both hold "
                       "offsets [0, 0] lengths [64, 256] with other bytes"),
            std::string::npos)
      << r.out;
  EXPECT_FALSE(std::ifstream(out).good());
}

// A node manifest whose layout index is not the one its shards' layouts
// make is damaged: export refuses it, naming the manifest.
TEST(CkptctlLayoutTest, ExportRefusesAManifestWhoseLayoutIndexDisagrees) {
  ::ckpt::testing::TempDir dir;
  storage::LocalBackendOptions o;
  o.root = dir.path();
  auto backend = storage::NewLocalBackend(o);
  ASSERT_TRUE(backend.ok()) << backend.status();
  storage::v1::NodeManifest m;
  m.set_job("job-a");
  m.set_step(42);
  m.set_world_size(2);
  storage::LayoutIndexBuilder b(2);
  const uint64_t global[] = {6, 4};
  auto w = b.AddTensor("layer0.weight", DType::kFloat32, global);
  ASSERT_TRUE(w.ok()) << w.status();
  std::string expected;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    storage::Shard shard = storage::MakeShard(
        {{3, 4}}, 5 + rank,
        rank == 0 ? +[](storage::ShardInfo& i) {
          i.tensors[0].global_shape = {6, 4};
          i.tensors[0].piece_offsets = {0, 0};
        }
                  : +[](storage::ShardInfo& i) {
                      i.tensors[0].global_shape = {6, 4};
                      i.tensors[0].piece_offsets = {3, 0};
                    });
    shard.info.rank = rank;
    shard.info.world_size = 2;
    ASSERT_TRUE(storage::EncodeShardMetadata(shard.info, shard.image).ok());
    const std::string key = storage::ShardKey("job-a", 42, rank);
    ASSERT_TRUE((*backend)
                    ->PutSmallObject(key, std::string_view(shard.image.data(),
                                                           shard.image.size()))
                    .ok());
    auto* s = m.add_shards();
    s->set_rank(rank);
    s->set_key(key);
    s->set_bytes(shard.image.size());
    // The index says rank 1 holds rows [2, 5): not what its shard says.
    const uint64_t off[] = {rank == 0 ? 0u : 2u, 0}, len[] = {3, 4};
    ASSERT_TRUE(
        b.AddPiece(*w, rank, shard.info.tensors[0].offset, off, len).ok());
  }
  auto index = std::move(b).Finish();
  ASSERT_TRUE(index.ok()) << index.status();
  m.set_layout_index(storage::SerializeLayoutIndex(*index));
  ASSERT_TRUE(storage::WriteNodeManifest(**backend, m).ok());
  CtlRun r = ::ckpt::testing::RunCommand(
      absl::StrFormat("%s export --root %s --job job-a --step 42 --out %s/x",
                      CKPTCTL_PATH, dir.path(), dir.path()),
      /*with_stderr=*/true);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find(storage::ManifestKey("job-a", 42) +
                       ": layout_index does not match the layouts its "
                       "shards record"),
            std::string::npos)
      << r.out;
  EXPECT_FALSE(std::ifstream(dir.path() + "/x").good());
}

// After a prefetch two nodes may hold a copy of one rank: --node picks one.
TEST_F(ClusterRootTest, InspectAsksForNodeWhenTwoNodesWroteTheRank) {
  const storage::Shard& shard = shards_[2];
  ASSERT_TRUE(backend_
                  ->PutSmallObject(
                      storage::ShardKey("job-c", kStep, 2, "n1"),
                      std::string_view(shard.image.data(), shard.image.size()))
                  .ok());
  const std::string sel = absl::StrFormat(
      "inspect --root %s --job job-c --step %d --rank 2", dir_.path(), kStep);
  CtlRun both = Ckptctl(sel);
  EXPECT_EQ(both.exit_code, 1) << both.out;
  CtlRun n1 = Ckptctl(sel + " --node n1");
  EXPECT_EQ(n1.exit_code, 0) << n1.out;
  EXPECT_NE(n1.out.find("rank-00002.n1.shard"), std::string::npos) << n1.out;
}

}  // namespace
}  // namespace ckpt::tools
