// OrderBook alone: an order is delivered only once the batch that queued
// it is durable, marked delivered once, acknowledged only by its own node,
// and dropped with every index it had.
#include "coordinator/order_book.h"

#include <gtest/gtest.h>

namespace ckpt::coordinator {
namespace {

v1::Order MakeOrder(uint64_t id, const std::string& node, v1::OrderKind kind,
                    const std::string& job = "job") {
  v1::Order o;
  o.set_id(id);
  o.set_node_id(node);
  o.set_kind(kind);
  o.set_job(job);
  return o;
}

std::vector<uint64_t> Ids(const std::vector<v1::Order>& orders) {
  std::vector<uint64_t> ids;
  for (const v1::Order& o : orders) ids.push_back(o.id());
  return ids;
}

TEST(OrderBookTest, AnOrderIsDeliverableOnlyOnceItsBatchIsDurable) {
  OrderBook book;
  OrderBook::Batch batch;
  book.Queue(&batch, MakeOrder(1, "a", v1::RESTART));
  EXPECT_FALSE(batch.empty());
  book.Enqueued(7);
  EXPECT_TRUE(book.Deliverable("a").empty());
  book.Durable(6);
  EXPECT_TRUE(book.Deliverable("a").empty()) << "batch 7 is not durable yet";
  book.Durable(7);
  EXPECT_EQ(book.Deliverable("a"), std::vector<uint64_t>{1});
  EXPECT_TRUE(book.Deliverable("b").empty());
}

TEST(OrderBookTest, AnOrderOfTheBatchBeingBuiltIsNotDeliverable) {
  OrderBook book;
  OrderBook::Batch durable;
  book.Queue(&durable, MakeOrder(1, "a", v1::PREFETCH));
  book.Enqueued(1);
  book.Durable(1);
  // The same locked section queues an order and then delivers (a plan
  // made by the heartbeat that answers): that batch is not enqueued yet.
  OrderBook::Batch open;
  book.Queue(&open, MakeOrder(2, "a", v1::RESTART));
  EXPECT_EQ(book.Deliverable("a"), std::vector<uint64_t>{1})
      << "order 2's batch is not durable";
  std::vector<OrderBook::Delivery> d = book.Deliver(&open, "a");
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].order.id(), 1u);
  EXPECT_FALSE(book.all().at(2).delivered());
  book.Enqueued(2);
  EXPECT_EQ(book.Deliverable("a"), std::vector<uint64_t>{1});
  book.Durable(2);
  EXPECT_EQ(book.Deliverable("a"), (std::vector<uint64_t>{1, 2}));
}

TEST(OrderBookTest, DeliveryMarksAnOrderDeliveredTheFirstTimeOnly) {
  OrderBook book;
  OrderBook::Batch queued;
  book.Queue(&queued, MakeOrder(1, "a", v1::PREFETCH));
  book.Queue(&queued, MakeOrder(2, "a", v1::RESTART));
  book.Enqueued(1);
  book.Durable(1);
  OrderBook::Batch first;
  std::vector<OrderBook::Delivery> d = book.Deliver(&first, "a");
  ASSERT_EQ(d.size(), 2u);
  EXPECT_TRUE(d[0].first && d[1].first);
  EXPECT_TRUE(d[0].order.delivered());
  EXPECT_FALSE(first.empty()) << "the delivered marks are written";
  OrderBook::Batch again;
  d = book.Deliver(&again, "a");
  ASSERT_EQ(d.size(), 2u);
  EXPECT_FALSE(d[0].first || d[1].first);
  EXPECT_TRUE(again.empty()) << "a second delivery writes nothing";
}

TEST(OrderBookTest, AcksOfAnotherNodesOrderAreRefusedNamingTheField) {
  OrderBook book;
  OrderBook::Batch batch;
  book.Queue(&batch, MakeOrder(1, "a", v1::RESTART));
  book.Queue(&batch, MakeOrder(2, "b", v1::RESTART));
  const std::vector<uint64_t> ids = {1, 2};
  absl::Status s = book.CheckAcks("a", ids);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("acked_order_ids: order 2 is for node b", 0), 0u)
      << s;
  const std::vector<uint64_t> mine_and_gone = {1, 99};
  EXPECT_TRUE(book.CheckAcks("a", mine_and_gone).ok())
      << "an order acknowledged before (a retried heartbeat) is no refusal";
  EXPECT_EQ(book.all().size(), 2u) << "a check changes nothing";
}

TEST(OrderBookTest, AcknowledgedOrdersGoInTheNodesOrderOnce) {
  OrderBook book;
  OrderBook::Batch batch;
  for (uint64_t id = 1; id <= 3; ++id)
    book.Queue(&batch, MakeOrder(id, "a", v1::PREFETCH));
  book.Enqueued(1);
  book.Durable(1);
  OrderBook::Batch acks;
  const std::vector<uint64_t> ids = {3, 1, 3, 42};
  EXPECT_EQ(Ids(book.Acknowledge(&acks, ids)), (std::vector<uint64_t>{3, 1}));
  EXPECT_FALSE(acks.empty());
  EXPECT_EQ(book.Deliverable("a"), std::vector<uint64_t>{2});
  EXPECT_TRUE(book.Has("a", v1::PREFETCH));
  OrderBook::Batch retry;
  EXPECT_TRUE(book.Acknowledge(&retry, ids).empty());
  EXPECT_TRUE(retry.empty()) << "a retried ack writes nothing";
}

TEST(OrderBookTest, ErasingDropsAnOrderFromEveryIndex) {
  OrderBook book;
  OrderBook::Batch batch;
  book.Queue(&batch, MakeOrder(1, "a", v1::PREFETCH, "j1"));
  book.Queue(&batch, MakeOrder(2, "a", v1::STOP, "j1"));
  book.Queue(&batch, MakeOrder(3, "b", v1::RESTART, "j2"));
  book.Enqueued(1);
  book.Durable(1);
  OrderBook::Batch drop;
  EXPECT_EQ(Ids(book.EraseIf(&drop,
                             [](const v1::Order& o) {
                               return o.job() == "j1" && o.kind() != v1::STOP;
                             })),
            std::vector<uint64_t>{1});
  EXPECT_FALSE(book.Has("a", v1::PREFETCH));
  EXPECT_TRUE(book.Has("a", v1::STOP));
  EXPECT_EQ(Ids(book.EraseOfNode(&drop, "a")), std::vector<uint64_t>{2});
  EXPECT_TRUE(book.Deliverable("a").empty());
  EXPECT_TRUE(book.EraseOfNode(&drop, "a").empty());
  EXPECT_EQ(book.all().size(), 1u);
  EXPECT_EQ(book.Deliverable("b"), std::vector<uint64_t>{3});
}

TEST(OrderBookTest, LoadReplacesEverythingWithDurableOrders) {
  OrderBook book;
  OrderBook::Batch batch;
  book.Queue(&batch, MakeOrder(1, "a", v1::RESTART));
  book.Enqueued(5);  // not durable when the state is loaded again
  book.Load({MakeOrder(2, "b", v1::RESTART)});
  EXPECT_TRUE(book.Deliverable("a").empty());
  EXPECT_EQ(book.Deliverable("b"), std::vector<uint64_t>{2})
      << "a loaded order is durable";
  EXPECT_EQ(book.all().size(), 1u);
}

}  // namespace
}  // namespace ckpt::coordinator
