#include "coordinator/etcd/etcd_kv.h"

#include <string_view>
#include <unordered_map>

#include "absl/strings/str_cat.h"

namespace ckpt::coordinator::etcd {
namespace {

constexpr int64_t kPage = 1000;
constexpr size_t kTxnOps = 128;            // etcd's default --max-txn-ops
constexpr size_t kTxnBytes = 1024 * 1024;  // under its 1.5 MiB default

class EtcdKv final : public KvBackend {
 public:
  EtcdKv(std::shared_ptr<EtcdClient> client, std::string prefix, Fence fence,
         std::function<void(const std::string&)> on_fenced)
      : client_(std::move(client)),
        prefix_(std::move(prefix)),
        fence_(std::move(fence)),
        on_fenced_(std::move(on_fenced)) {}

  absl::StatusOr<std::optional<std::string>> Get(
      const std::string& key) override {
    etcdserverpb::RangeRequest req;
    req.set_key(prefix_ + key);
    absl::StatusOr<etcdserverpb::RangeResponse> resp = client_->Range(req);
    if (!resp.ok()) return resp.status();
    if (resp->kvs_size() == 0) return std::nullopt;
    return resp->kvs(0).value();
  }

  absl::Status Scan(
      const std::string& prefix,
      const std::function<absl::Status(const std::string&, const std::string&)>&
          visit) override {
    const std::string end = PrefixEnd(prefix_ + prefix);
    std::string from = prefix_ + prefix;
    int64_t revision =
        0;  // every page from the first page's revision: one consistent view
    while (true) {
      etcdserverpb::RangeRequest req;
      req.set_key(from);
      req.set_range_end(end);
      req.set_limit(kPage);
      req.set_revision(revision);
      absl::StatusOr<etcdserverpb::RangeResponse> resp = client_->Range(req);
      if (!resp.ok()) return resp.status();
      if (revision == 0) revision = resp->header().revision();
      for (const mvccpb::KeyValue& kv : resp->kvs()) {
        absl::Status s = visit(kv.key().substr(prefix_.size()), kv.value());
        if (!s.ok()) return s;
      }
      if (!resp->more() || resp->kvs_size() == 0) return absl::OkStatus();
      from = resp->kvs(resp->kvs_size() - 1).key() + std::string(1, '\0');
    }
  }

  absl::Status Write(const KvBatch& batch) override {
    return WriteTxn({&batch});
  }

  // Consecutive batches share one fenced Txn while they fit etcd's default
  // limits (--max-txn-ops 128, --max-request-bytes 1.5 MiB); otherwise the
  // Txns go in order, each fenced. A batch larger than the limits alone is
  // one Txn, as with Write.
  absl::Status WriteGroup(const std::vector<const KvBatch*>& batches) override {
    std::vector<const KvBatch*> txn;
    size_t ops = 0, bytes = 0;
    for (const KvBatch* b : batches) {
      if (b->empty()) continue;
      size_t b_bytes = 0;
      for (const KvOp& op : *b)
        b_bytes += prefix_.size() + op.key.size() + op.value.size() + 16;
      if (!txn.empty() &&
          (ops + b->size() > kTxnOps || bytes + b_bytes > kTxnBytes)) {
        if (absl::Status s = WriteTxn(txn); !s.ok()) return s;
        txn.clear();
        ops = bytes = 0;
      }
      txn.push_back(b);
      ops += b->size();
      bytes += b_bytes;
    }
    if (txn.empty()) return absl::OkStatus();
    return WriteTxn(txn);
  }

  std::string Describe() const override { return "etcd " + prefix_; }

 private:
  // One Txn for `batches` (in order), fenced by the leadership compare.
  absl::Status WriteTxn(const std::vector<const KvBatch*>& batches) {
    etcdserverpb::TxnRequest txn;
    etcdserverpb::Compare* leader = txn.add_compare();
    leader->set_result(etcdserverpb::Compare::EQUAL);
    leader->set_target(etcdserverpb::Compare::CREATE);
    leader->set_key(fence_.election_key);
    leader->set_create_revision(fence_.create_revision);
    // etcd refuses a Txn that names one key twice; a batch may (a record
    // updated twice by one operation): the last op of each key wins, as in
    // a RocksDB WriteBatch.
    std::vector<const KvOp*> all;
    for (const KvBatch* b : batches)
      for (const KvOp& op : *b) all.push_back(&op);
    std::unordered_map<std::string_view, size_t> last;
    for (size_t i = 0; i < all.size(); ++i) last[all[i]->key] = i;
    for (size_t i = 0; i < all.size(); ++i) {
      const KvOp& op = *all[i];
      if (last[op.key] != i) continue;
      etcdserverpb::RequestOp* r = txn.add_success();
      if (op.is_delete) {
        r->mutable_request_delete_range()->set_key(prefix_ + op.key);
      } else {
        r->mutable_request_put()->set_key(prefix_ + op.key);
        r->mutable_request_put()->set_value(op.value);
      }
    }
    absl::StatusOr<etcdserverpb::TxnResponse> resp = client_->Txn(txn);
    if (!resp.ok()) return resp.status();
    if (resp->succeeded()) return absl::OkStatus();
    std::string why = absl::StrCat(
        "not leader: etcd ", prefix_,
        ": write refused: this coordinator is no longer the leader (",
        fence_.election_key, " is not the key it created at revision ",
        fence_.create_revision, ")");
    std::call_once(fenced_once_, [&] {
      if (on_fenced_) on_fenced_(why);
    });
    return absl::UnavailableError(why);
  }

  const std::shared_ptr<EtcdClient> client_;
  const std::string prefix_;
  const Fence fence_;
  const std::function<void(const std::string&)> on_fenced_;
  std::once_flag fenced_once_;
};

}  // namespace

std::unique_ptr<KvBackend> NewEtcdKv(
    std::shared_ptr<EtcdClient> client, std::string prefix, Fence fence,
    std::function<void(const std::string&)> on_fenced) {
  return std::make_unique<EtcdKv>(std::move(client), std::move(prefix),
                                  std::move(fence), std::move(on_fenced));
}

}  // namespace ckpt::coordinator::etcd
