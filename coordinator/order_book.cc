#include "coordinator/order_book.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ckpt::coordinator {

void OrderBook::Queue(Batch* batch, v1::Order order) {
  batch->PutOrder(order);
  by_node_[order.node_id()].insert(order.id());
  queued_.insert(order.id());
  const uint64_t id = order.id();
  orders_[id] = std::move(order);
}

std::map<uint64_t, v1::Order>::iterator OrderBook::Erase(
    Batch* batch, std::map<uint64_t, v1::Order>::iterator it) {
  batch->DeleteOrder(it->first);
  queued_.erase(it->first);
  seq_.erase(it->first);
  auto by = by_node_.find(it->second.node_id());
  if (by != by_node_.end()) {
    by->second.erase(it->first);
    if (by->second.empty()) by_node_.erase(by);
  }
  return orders_.erase(it);
}

std::vector<v1::Order> OrderBook::EraseIf(
    Batch* batch, const std::function<bool(const v1::Order&)>& pred) {
  std::vector<v1::Order> gone;
  for (auto it = orders_.begin(); it != orders_.end();) {
    if (pred(it->second)) {
      gone.push_back(it->second);
      it = Erase(batch, it);
    } else {
      ++it;
    }
  }
  return gone;
}

std::vector<v1::Order> OrderBook::EraseOfNode(Batch* batch,
                                              const std::string& node_id) {
  if (!by_node_.count(node_id)) return {};
  return EraseIf(batch,
                 [&](const v1::Order& o) { return o.node_id() == node_id; });
}

absl::Status OrderBook::CheckAcks(const std::string& node_id,
                                  absl::Span<const uint64_t> ids) const {
  for (uint64_t id : ids) {
    auto it = orders_.find(id);
    if (it != orders_.end() && it->second.node_id() != node_id)
      return absl::InvalidArgumentError(
          absl::StrCat("acked_order_ids: order ", id, " is for node ",
                       it->second.node_id(), ", not ", node_id));
  }
  return absl::OkStatus();
}

std::vector<v1::Order> OrderBook::Acknowledge(Batch* batch,
                                              absl::Span<const uint64_t> ids) {
  std::vector<v1::Order> gone;
  for (uint64_t id : ids) {
    auto it = orders_.find(id);
    if (it == orders_.end()) continue;  // acknowledged before: a retry
    gone.push_back(it->second);
    Erase(batch, it);
  }
  return gone;
}

std::vector<uint64_t> OrderBook::Deliverable(const std::string& node_id) const {
  std::vector<uint64_t> ids;
  auto mine = by_node_.find(node_id);
  if (mine == by_node_.end()) return ids;
  // Neither an order of a batch still being built (queued in this locked
  // section, e.g. by a plan the heartbeat that delivers made) nor one of
  // a batch enqueued and not yet durable.
  for (uint64_t id : mine->second)
    if (!queued_.count(id) && !seq_.count(id)) ids.push_back(id);
  return ids;
}

std::vector<OrderBook::Delivery> OrderBook::Deliver(
    Batch* batch, const std::string& node_id) {
  std::vector<Delivery> out;
  for (uint64_t id : Deliverable(node_id)) {
    v1::Order& order = orders_.at(id);
    const bool first = !order.delivered();
    if (first) {
      order.set_delivered(true);
      batch->PutOrder(order);
    }
    out.push_back({order, first});
  }
  return out;
}

bool OrderBook::Has(const std::string& node_id, v1::OrderKind kind) const {
  auto mine = by_node_.find(node_id);
  if (mine == by_node_.end()) return false;
  return std::any_of(mine->second.begin(), mine->second.end(),
                     [&](uint64_t id) {
                       auto o = orders_.find(id);
                       return o != orders_.end() && o->second.kind() == kind;
                     });
}

void OrderBook::Enqueued(uint64_t seq) {
  for (uint64_t id : queued_) seq_[id] = seq;
  queued_.clear();
}

void OrderBook::Durable(uint64_t seq) {
  std::erase_if(seq_, [&](const auto& kv) { return kv.second <= seq; });
}

void OrderBook::Load(std::vector<v1::Order> orders) {
  orders_.clear();
  by_node_.clear();
  queued_.clear();
  seq_.clear();
  for (v1::Order& o : orders) {
    by_node_[o.node_id()].insert(o.id());
    const uint64_t id = o.id();
    orders_[id] = std::move(o);
  }
}

}  // namespace ckpt::coordinator
