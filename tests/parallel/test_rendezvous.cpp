// The TCP rendezvous that bootstraps NCCL across processes and hosts, over localhost: every
// rank gets rank 0's 128-byte id; wrong world sizes, duplicate ranks and an absent rank 0 are
// errors with a message, never a hang.
#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "backend/parallel/tcp_rendezvous.h"
#include "core/error.h"

namespace dsv4 {
namespace {

UniqueIdBytes some_id() {
  UniqueIdBytes id;
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<uint8_t>(i * 7 + 3);
  return id;
}

TEST(Rendezvous, EveryRankGetsTheId) {
  const int W = 6;
  RendezvousServer server(0);
  ASSERT_GT(server.port(), 0);
  std::vector<std::future<UniqueIdBytes>> got;
  for (int r = W - 1; r >= 1; --r)  // arrival order does not matter
    got.push_back(std::async(std::launch::async, [&, r] { return fetch_unique_id("127.0.0.1", server.port(), r, W, 10); }));
  server.serve(W, some_id(), 10);
  for (auto& f : got) EXPECT_EQ(f.get(), some_id());
}

TEST(Rendezvous, ExchangeFromEveryRankAndHostName) {
  // Rank 0 must listen on a known port here: take a free one, release it, reuse it.
  int port;
  {
    RendezvousServer probe(0);
    port = probe.port();
  }
  const int W = 3;
  std::vector<std::future<UniqueIdBytes>> got;
  for (int r = 1; r < W; ++r)  // may start before rank 0 listens: they retry
    got.push_back(std::async(std::launch::async, [&, r] { return exchange_unique_id("localhost", port, r, W, {}, 10); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(exchange_unique_id("localhost", port, 0, W, some_id(), 10), some_id());
  for (auto& f : got) EXPECT_EQ(f.get(), some_id());
}

TEST(Rendezvous, MismatchesAreRefusedWithAMessage) {
  RendezvousServer server(0);
  {
    auto bad = std::async(std::launch::async, [&] { return fetch_unique_id("127.0.0.1", server.port(), 1, 3, 10); });
    try {
      server.serve(2, some_id(), 10);
      ADD_FAILURE() << "world mismatch accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("expects world size 3"), std::string::npos) << e.what();
    }
    try {
      bad.get();
      ADD_FAILURE() << "client not told";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("refused rank 1"), std::string::npos) << e.what();
    }
  }
}

TEST(Rendezvous, DuplicateRankAndTimeouts) {
  RendezvousServer server(0);
  auto first = std::async(std::launch::async, [&] { return fetch_unique_id("127.0.0.1", server.port(), 1, 3, 10); });
  auto serving = std::async(std::launch::async, [&] { server.serve(3, some_id(), 10); });
  EXPECT_EQ(first.get(), some_id());
  EXPECT_THROW(fetch_unique_id("127.0.0.1", server.port(), 1, 3, 10), Error);  // rank 1 again
  EXPECT_THROW(serving.get(), Error);
  // Nobody serving: the client gives up with a message after its timeout.
  int port;
  {
    RendezvousServer probe(0);
    port = probe.port();
  }
  EXPECT_THROW(fetch_unique_id("127.0.0.1", port, 1, 2, 0.3), Error);
  // Ranks missing: rank 0 gives up too.
  RendezvousServer lonely(0);
  EXPECT_THROW(lonely.serve(2, some_id(), 0.3), Error);
}

}  // namespace
}  // namespace dsv4
