// The catalog's records left the public RPC proto (ckpt.v1.JobRecord,
// ShardRecord, DeleteIntent in ckpt.proto) for proto/catalog.proto
// (ckpt.catalog.v1). Catalogs written before the move must keep working:
// the bytes below were serialized with the OLD types (protoc --encode of
// ckpt.proto at 017e579, from the text records quoted beside them), and
// they must parse with the new types to the same values, re-serialize to
// the same bytes, and come back through a real Catalog (RocksDB) opened on
// a database that holds them. Recovery from a catalog on disk is covered by
// the restart tests (crash_test, engine_test).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/strings/escaping.h"
#include "daemon/core/catalog.h"
#include "google/protobuf/util/message_differencer.h"
#include "rocksdb/db.h"
#include "tests/temp_dir.h"
#include "util/rocks.h"

namespace ckpt::testing {
namespace {

namespace catv1 = daemon::catv1;
using google::protobuf::util::MessageDifferencer;

// job: "job-a" world_size: 8 uid: 1000 slot_bytes: 268435456 num_slots: 3
// arena_slot_bytes { key: 7 value: 536870912 }
constexpr char kOldJob[] =
    "0a056a6f622d61100818e807208080808001280332080807108080808002";

// job: "job-a" step: 1234567890123 rank: 7 state: DURABLE slot: 3
// image_bytes: 1048576 path: "job-a/step-0001234567890123/shard-00007.ckpt"
// tensors { name: "model.w" dtype: 7 shape: [4, 256] offset: 4096
//           bytes: 4096 checksum: 18364758544493064720 has_checksum: true }
// tensors { name: "opt.m" dtype: 1 shape: [3] offset: 8192 bytes: 12 }
// error: "persist failed once" world_size: 8 uploaded: true
// local_gone: true created_unix_ns: 1764140000123456789 generation: 0
constexpr char kOldShard[] =
    "0a056a6f622d6110cb89ec8ff723180720022803308080403a2c6a6f622d612f737465"
    "702d303030313233343536373839303132332f73686172642d30303030372e636b70"
    "7442230a076d6f64656c2e7710071a030480022080202880203090e4d0b287d3aeee"
    "fe01380142110a056f70742e6d10011a0103208040280c4a1370657273697374206661"
    "696c6564206f6e636550085801600168959aaacbbbffdebd187000";

// job: "j" step: 2 rank: 0 state: STAGED slot: 0 (no generation)
constexpr char kOldStagedShard[] = "0a016a10022001";

// tier: OBJECT keys: ["job-a/step-0000000000000005/MANIFEST",
// "job-a/step-0000000000000005/shard-00007.ckpt"] prefix: true
// job: "job-a" step: 5
constexpr char kOldIntent[] =
    "080112246a6f622d612f737465702d303030303030303030303030303030352f4d414e"
    "4946455354122c6a6f622d612f737465702d303030303030303030303030303030352f"
    "73686172642d30303030372e636b7074180122056a6f622d612805";

std::string Bytes(const char* hex) { return absl::HexStringToBytes(hex); }

catv1::JobRecord ExpectedJob() {
  catv1::JobRecord j;
  j.set_job("job-a");
  j.set_world_size(8);
  j.set_uid(1000);
  j.set_slot_bytes(268435456);
  j.set_num_slots(3);
  (*j.mutable_arena_slot_bytes())[7] = 536870912;
  return j;
}

catv1::ShardRecord ExpectedShard() {
  catv1::ShardRecord s;
  s.set_job("job-a");
  s.set_step(1234567890123);
  s.set_rank(7);
  s.set_state(catv1::ShardRecord::DURABLE);
  s.set_slot(3);
  s.set_image_bytes(1048576);
  s.set_path("job-a/step-0001234567890123/shard-00007.ckpt");
  v1::TensorMeta* t = s.add_tensors();
  t->set_name("model.w");
  t->set_dtype(7);
  t->add_shape(4);
  t->add_shape(256);
  t->set_offset(4096);
  t->set_bytes(4096);
  t->set_checksum(18364758544493064720ull);
  t->set_has_checksum(true);
  t = s.add_tensors();
  t->set_name("opt.m");
  t->set_dtype(1);
  t->add_shape(3);
  t->set_offset(8192);
  t->set_bytes(12);
  s.set_error("persist failed once");
  s.set_world_size(8);
  s.set_uploaded(true);
  s.set_local_gone(true);
  s.set_created_unix_ns(1764140000123456789ull);
  s.set_generation(0);  // present, and zero
  return s;
}

catv1::ShardRecord ExpectedStagedShard() {
  catv1::ShardRecord s;
  s.set_job("j");
  s.set_step(2);
  s.set_state(catv1::ShardRecord::STAGED);
  return s;
}

catv1::DeleteIntent ExpectedIntent() {
  catv1::DeleteIntent d;
  d.set_tier(catv1::DeleteIntent::OBJECT);
  d.add_keys("job-a/step-0000000000000005/MANIFEST");
  d.add_keys("job-a/step-0000000000000005/shard-00007.ckpt");
  d.set_prefix(true);
  d.set_job("job-a");
  d.set_step(5);
  return d;
}

template <typename Record>
void ExpectSameRecord(const char* old_hex, const Record& want) {
  const std::string old = Bytes(old_hex);
  Record got;
  ASSERT_TRUE(got.ParseFromString(old)) << Record::descriptor()->full_name();
  std::string diff;
  MessageDifferencer d;
  d.ReportDifferencesToString(&diff);
  EXPECT_TRUE(d.Compare(got, want)) << diff;
  // Nothing the old type wrote is unknown to the new one.
  EXPECT_TRUE(got.GetReflection()->GetUnknownFields(got).empty());
  // Written again, the same bytes: same field numbers and wire types.
  EXPECT_EQ(absl::BytesToHexString(want.SerializeAsString()), old_hex);
}

TEST(CatalogCompatTest, RecordsWrittenWithTheOldTypesParseToTheSameValues) {
  ExpectSameRecord(kOldJob, ExpectedJob());
  ExpectSameRecord(kOldShard, ExpectedShard());
  ExpectSameRecord(kOldStagedShard, ExpectedStagedShard());
  ExpectSameRecord(kOldIntent, ExpectedIntent());
  catv1::ShardRecord staged;
  ASSERT_TRUE(staged.ParseFromString(Bytes(kOldStagedShard)));
  EXPECT_FALSE(staged.has_generation());
  catv1::ShardRecord durable;
  ASSERT_TRUE(durable.ParseFromString(Bytes(kOldShard)));
  EXPECT_TRUE(durable.has_generation());
}

// The records as an old daemon left them in RocksDB (the catalog's keys),
// read through the Catalog.
TEST(CatalogCompatTest, CatalogOpensADatabaseWrittenWithTheOldTypes) {
  TempDir dir;
  const std::string path = dir.path() + "/catalog";
  {
    auto db = OpenRocksDb(path, "catalog");
    ASSERT_TRUE(db.ok()) << db.status();
    rocksdb::WriteOptions wo;
    wo.sync = true;
    ASSERT_TRUE((*db)->Put(wo, "J/job-a", Bytes(kOldJob)).ok());
    ASSERT_TRUE(
        (*db)
            ->Put(wo, "S/job-a/00000001234567890123/00007", Bytes(kOldShard))
            .ok());
    ASSERT_TRUE(
        (*db)->Put(wo, "D/00000000000000000004", Bytes(kOldIntent)).ok());
  }
  auto catalog = daemon::Catalog::Open(path);
  ASSERT_TRUE(catalog.ok()) << catalog.status();
  auto jobs = (*catalog)->Jobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_TRUE(MessageDifferencer::Equals(jobs->front(), ExpectedJob()));
  auto shards = (*catalog)->Shards("job-a");
  ASSERT_TRUE(shards.ok()) << shards.status();
  ASSERT_EQ(shards->size(), 1u);
  EXPECT_TRUE(MessageDifferencer::Equals(shards->front(), ExpectedShard()));
  auto intents = (*catalog)->DeleteIntents();
  ASSERT_TRUE(intents.ok()) << intents.status();
  ASSERT_EQ(intents->size(), 1u);
  EXPECT_EQ(intents->front().first, 4u);
  EXPECT_TRUE(
      MessageDifferencer::Equals(intents->front().second, ExpectedIntent()));
  // A new intent does not reuse the old one's id.
  EXPECT_GT((*catalog)->NewIntentId(), 4u);
}

}  // namespace
}  // namespace ckpt::testing
