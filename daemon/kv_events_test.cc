// Tests of daemon/kv_events: the batch encoding (decoded back with
// msgpack-cxx) and the publisher over real ZMQ sockets: PUB delivery with
// topics and sequence numbers, and the replay ROUTER. That vLLM's own
// msgspec classes decode the payloads is tests/kv_events_vllm_test.py's job.
#include "daemon/kv_events.h"

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "msgpack.hpp"
#include "zmq.hpp"
#include "zmq_addon.hpp"

namespace kvtier::daemon {
namespace {

// The value under `key` of a msgpack map, or nullptr.
const msgpack::object* Field(const msgpack::object& map,
                             const std::string& key) {
  if (map.type != msgpack::type::MAP) return nullptr;
  for (uint32_t i = 0; i < map.via.map.size; ++i) {
    const msgpack::object_kv& kv = map.via.map.ptr[i];
    if (kv.key.type == msgpack::type::STR && kv.key.as<std::string>() == key) {
      return &kv.val;
    }
  }
  return nullptr;
}

std::string Bin(const msgpack::object& o) {
  EXPECT_EQ(o.type, msgpack::type::BIN);
  return std::string(o.via.bin.ptr, o.via.bin.size);
}

int64_t Seq(const zmq::message_t& m) {
  EXPECT_EQ(m.size(), 8u);
  const auto* b = static_cast<const unsigned char*>(m.data());
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | b[i];
  return static_cast<int64_t>(v);
}

std::string SeqBytes(int64_t v) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<char>(static_cast<uint64_t>(v) & 0xff);
    v = static_cast<int64_t>(static_cast<uint64_t>(v) >> 8);
  }
  return out;
}

TEST(KvEventsTest, BatchesEncodeAsVllmsKvEventBatch) {
  BlockStored stored;
  stored.block_hashes = {std::string(32, '\x01'), std::string(32, '\x02')};
  stored.token_ids = {1, 2, 3, 4, 5, 6, 7, 8};
  stored.block_size = 4;
  BlockStored child = stored;
  child.parent_block_hash = std::string(32, '\x02');
  child.block_hashes = {std::string(32, '\x03')};
  child.token_ids.clear();
  BlockRemoved removed;
  removed.block_hashes = {std::string(16, '\x09')};
  removed.medium = kMediumStorage;
  const std::vector<KvEvent> events = {stored, child, removed,
                                       AllBlocksCleared{}};
  const std::string payload = EncodeKvEventBatch(1234.5, events);
  msgpack::object_handle h = msgpack::unpack(payload.data(), payload.size());
  const msgpack::object& batch = h.get();
  // [ts, events]: no rank, so the defaulted field is left out.
  ASSERT_EQ(batch.type, msgpack::type::ARRAY);
  ASSERT_EQ(batch.via.array.size, 2u);
  EXPECT_EQ(batch.via.array.ptr[0].as<double>(), 1234.5);
  const msgpack::object& list = batch.via.array.ptr[1];
  ASSERT_EQ(list.type, msgpack::type::ARRAY);
  ASSERT_EQ(list.via.array.size, 4u);

  const msgpack::object& e0 = list.via.array.ptr[0];
  ASSERT_NE(Field(e0, "type"), nullptr);
  EXPECT_EQ(Field(e0, "type")->as<std::string>(), "BlockStored");
  const msgpack::object* hashes = Field(e0, "block_hashes");
  ASSERT_NE(hashes, nullptr);
  ASSERT_EQ(hashes->via.array.size, 2u);
  EXPECT_EQ(Bin(hashes->via.array.ptr[1]), std::string(32, '\x02'));
  EXPECT_EQ(Field(e0, "parent_block_hash")->type, msgpack::type::NIL);
  EXPECT_EQ(Field(e0, "token_ids")->as<std::vector<uint32_t>>(),
            stored.token_ids);
  EXPECT_EQ(Field(e0, "block_size")->as<uint32_t>(), 4u);
  EXPECT_EQ(Field(e0, "medium")->as<std::string>(), "CPU");
  EXPECT_EQ(Field(e0, "lora_id")->type, msgpack::type::NIL);

  const msgpack::object& e1 = list.via.array.ptr[1];
  EXPECT_EQ(Bin(*Field(e1, "parent_block_hash")), std::string(32, '\x02'));
  EXPECT_EQ(Field(e1, "token_ids")->via.array.size, 0u);

  const msgpack::object& e2 = list.via.array.ptr[2];
  EXPECT_EQ(Field(e2, "type")->as<std::string>(), "BlockRemoved");
  EXPECT_EQ(Bin(Field(e2, "block_hashes")->via.array.ptr[0]),
            std::string(16, '\x09'));
  EXPECT_EQ(Field(e2, "medium")->as<std::string>(), "STORAGE");

  const msgpack::object& e3 = list.via.array.ptr[3];
  EXPECT_EQ(Field(e3, "type")->as<std::string>(), "AllBlocksCleared");
  EXPECT_EQ(e3.via.map.size, 1u);

  // With a rank: [ts, events, rank].
  const std::string ranked = EncodeKvEventBatch(1.0, {}, 3);
  msgpack::object_handle r = msgpack::unpack(ranked.data(), ranked.size());
  ASSERT_EQ(r.get().via.array.size, 3u);
  EXPECT_EQ(r.get().via.array.ptr[2].as<int>(), 3);
}

class KvEventsSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvtier-kv-events-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(KvEventsSocketTest, RefusesWhatItCannotBind) {
  EXPECT_EQ(KvEventPublisher::Start({.endpoint = "udp://x"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvEventPublisher::Start(
                {.endpoint = "ipc://" + dir_ + "/a", .replay_endpoint = "x"})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KvEventPublisher::Start({.endpoint = "ipc:///no/such/dir/sock"})
                .status()
                .code(),
            absl::StatusCode::kUnavailable);
}

// A subscriber gets every batch in order, under its topic, numbered from 0;
// a replay request for seq 1 streams 1.. and then the end marker.
TEST_F(KvEventsSocketTest, PublishesInOrderAndReplays) {
  auto pub =
      KvEventPublisher::Start({.endpoint = "ipc://" + dir_ + "/pub",
                               .replay_endpoint = "ipc://" + dir_ + "/replay"});
  ASSERT_TRUE(pub.ok()) << pub.status();
  zmq::context_t ctx;
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "llama");
  sub.set(zmq::sockopt::rcvtimeo, 100);
  sub.connect((*pub)->endpoint());
  // PUB drops what it sends before the subscription arrives: publish a
  // probe until one comes through (bounded by count, not by a clock).
  std::vector<zmq::message_t> got;
  int probes = 0;
  while (got.empty() && probes < 200) {
    (*pub)->Publish("llama", {AllBlocksCleared{}});
    ++probes;
    (void)zmq::recv_multipart(sub, std::back_inserter(got));
  }
  ASSERT_EQ(got.size(), 3u) << "no probe arrived after " << probes;
  // Drain the probes sent after the one that came through: every one of
  // them arrives (a wait of up to 10 s each only bounds a failure).
  int64_t last = Seq(got[1]);
  sub.set(zmq::sockopt::rcvtimeo, 10000);
  while (last < probes - 1) {
    std::vector<zmq::message_t> more;
    ASSERT_TRUE(zmq::recv_multipart(sub, std::back_inserter(more)))
        << "probe " << last + 1 << " of " << probes << " never came";
    last = Seq(more[1]);
  }
  EXPECT_EQ(last, probes - 1);
  // Another topic is filtered out; ours arrives next, in order.
  (*pub)->Publish("other", {AllBlocksCleared{}});
  BlockStored s;
  s.block_hashes = {std::string(32, 'a')};
  s.block_size = 16;
  for (int i = 0; i < 3; ++i) (*pub)->Publish("llama", {s});
  for (int i = 0; i < 3; ++i) {
    std::vector<zmq::message_t> m;
    ASSERT_TRUE(zmq::recv_multipart(sub, std::back_inserter(m)));
    ASSERT_EQ(m.size(), 3u);
    EXPECT_EQ(m[0].to_string(), "llama");
    EXPECT_EQ(Seq(m[1]), probes + 1 + i);  // "other" took probes.
    msgpack::object_handle h =
        msgpack::unpack(static_cast<const char*>(m[2].data()), m[2].size());
    const msgpack::object& e = h.get().via.array.ptr[1].via.array.ptr[0];
    EXPECT_EQ(Field(e, "type")->as<std::string>(), "BlockStored");
  }
  zmq::socket_t replay(ctx, zmq::socket_type::dealer);
  replay.set(zmq::sockopt::rcvtimeo, 5000);
  replay.connect((*pub)->replay_endpoint());
  const int64_t start = probes + 1;  // the first BlockStored batch
  const std::string start_bytes = SeqBytes(start);  // a buffer only points
  std::vector<zmq::const_buffer> req = {zmq::const_buffer(nullptr, 0),
                                        zmq::buffer(start_bytes)};
  ASSERT_TRUE(zmq::send_multipart(replay, req));
  std::vector<int64_t> seqs;
  for (;;) {
    std::vector<zmq::message_t> m;
    ASSERT_TRUE(zmq::recv_multipart(replay, std::back_inserter(m)));
    ASSERT_EQ(m.size(), 3u);  // "", seq, payload
    EXPECT_EQ(m[0].size(), 0u);
    if (Seq(m[1]) == -1) {
      EXPECT_EQ(m[2].size(), 0u);
      break;
    }
    seqs.push_back(Seq(m[1]));
  }
  EXPECT_EQ(seqs, (std::vector<int64_t>{start, start + 1, start + 2}));
  // Counted after the send a subscriber may see first; the replay is
  // served after them, so by now every count is in.
  EXPECT_EQ((*pub)->published(), static_cast<uint64_t>(probes) + 4);
  EXPECT_EQ((*pub)->dropped(), 0u);
}

}  // namespace
}  // namespace kvtier::daemon
