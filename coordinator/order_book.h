// OrderBook: the orders a plan queued for the nodes (PREFETCH, RESTART,
// STOP), from queueing to delivery in a heartbeat and the node's
// acknowledgement in a later one. It owns the pending orders, their index
// by node and when each becomes deliverable: an order goes out only once
// the batch that queued it is durable (a node never acts on an order a
// crash could take back). Every change goes into the caller's batch.
// Events, plans and replica placement stay the caller's: the methods
// return the orders they touched. Not thread-safe: the Coordinator keeps
// it under its state mutex.
#ifndef CKPT_COORDINATOR_ORDER_BOOK_H_
#define CKPT_COORDINATOR_ORDER_BOOK_H_

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "coordinator.pb.h"
#include "coordinator/store.h"

namespace ckpt::coordinator {

class OrderBook {
 public:
  using Batch = CoordStore::Batch;

  // Every pending order, by id.
  const std::map<uint64_t, v1::Order>& all() const { return orders_; }
  // Queues `order` (its id set) into `batch`; deliverable once Durable
  // covers the batch Enqueued is called for next.
  void Queue(Batch* batch, v1::Order order);
  // Drops the orders `pred` selects (EraseOfNode: every order of
  // `node_id`) from memory and `batch`; returns them.
  std::vector<v1::Order> EraseIf(
      Batch* batch, const std::function<bool(const v1::Order&)>& pred);
  std::vector<v1::Order> EraseOfNode(Batch* batch, const std::string& node_id);

  // A heartbeat's acknowledgements: each a pending order must be the
  // node's own (InvalidArgument naming acked_order_ids otherwise, checked
  // before any is applied).
  [[nodiscard]] absl::Status CheckAcks(const std::string& node_id,
                                       absl::Span<const uint64_t> ids) const;
  // Drops the acknowledged orders; returns them (an id not pending was
  // acknowledged before: a retried heartbeat).
  std::vector<v1::Order> Acknowledge(Batch* batch,
                                     absl::Span<const uint64_t> ids);
  // The orders `node_id` may be given now: queued, durable and not yet
  // acknowledged (what a heartbeat answers with and WatchNode shows). An
  // order queued since the last Enqueued is not: its batch is the one
  // being built, so it goes out on a call after that batch is durable.
  std::vector<uint64_t> Deliverable(const std::string& node_id) const;
  // Delivers them: the deliverable orders, each marked delivered (into
  // `batch`) the first time it goes out.
  struct Delivery {
    v1::Order order;
    bool first = false;  // sent for the first time
  };
  std::vector<Delivery> Deliver(Batch* batch, const std::string& node_id);
  // Whether `node_id` has a pending order of `kind`.
  bool Has(const std::string& node_id, v1::OrderKind kind) const;

  // The batch holding the orders queued since the last call got group
  // commit sequence `seq`; Durable: every batch up to `seq` is durable.
  void Enqueued(uint64_t seq);
  void Durable(uint64_t seq);
  // Replaces everything with the durable `orders` (a load of the state).
  void Load(std::vector<v1::Order> orders);

 private:
  std::map<uint64_t, v1::Order>::iterator Erase(
      Batch* batch, std::map<uint64_t, v1::Order>::iterator it);

  std::map<uint64_t, v1::Order> orders_;  // pending, by id
  std::map<std::string, std::set<uint64_t>> by_node_;
  // Queued since the last Enqueued, and the batch sequence of each order
  // whose batch is not yet durable.
  std::set<uint64_t> queued_;
  std::map<uint64_t, uint64_t> seq_;
};

}  // namespace ckpt::coordinator

#endif  // CKPT_COORDINATOR_ORDER_BOOK_H_
