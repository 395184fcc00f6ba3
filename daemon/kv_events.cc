// KV events (daemon/kv_events.h): the msgpack encoding of vLLM's
// KVEventBatch (msgpack-cxx, Debian's libmsgpack-cxx-dev) and the ZMQ
// publisher (cppzmq over libzmq, Debian's cppzmq-dev and libzmq3-dev): a
// thread that drains the queue onto the PUB socket, keeps the last
// buffer_steps batches and answers replay requests on the ROUTER socket.
//
// Thread-safety: see kv_events.h. The sockets belong to the publishing
// thread once it runs (ZMQ sockets are not thread-safe; Start hands them
// over before the thread starts, which is a full barrier).
#include "daemon/kv_events.h"

#include <chrono>
#include <cstring>
#include <deque>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "msgpack.hpp"
#include "spdlog/spdlog.h"
#include "zmq.hpp"
#include "zmq_addon.hpp"

namespace kvtier::daemon {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void PackStr(Packer& pk, const std::string& s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void PackBin(Packer& pk, const std::string& s) {
  pk.pack_bin(static_cast<uint32_t>(s.size()));
  pk.pack_bin_body(s.data(), static_cast<uint32_t>(s.size()));
}

void PackHashes(Packer& pk, const std::vector<std::string>& hashes) {
  pk.pack_array(static_cast<uint32_t>(hashes.size()));
  for (const std::string& h : hashes) PackBin(pk, h);
}

// msgspec encodes a tagged Struct as a map: the tag ("type": class name)
// first, then the fields in declaration order; with omit_defaults a field
// equal to its default is left out, a field without a default never is.
void PackEvent(Packer& pk, const BlockStored& e) {
  // type, block_hashes, parent_block_hash, token_ids, block_size, lora_id,
  // medium, lora_name (the fields without defaults).
  pk.pack_map(8);
  PackStr(pk, "type");
  PackStr(pk, "BlockStored");
  PackStr(pk, "block_hashes");
  PackHashes(pk, e.block_hashes);
  PackStr(pk, "parent_block_hash");
  if (e.parent_block_hash) {
    PackBin(pk, *e.parent_block_hash);
  } else {
    pk.pack_nil();
  }
  PackStr(pk, "token_ids");
  pk.pack_array(static_cast<uint32_t>(e.token_ids.size()));
  for (uint32_t t : e.token_ids) pk.pack_uint32(t);
  PackStr(pk, "block_size");
  pk.pack_uint32(e.block_size);
  PackStr(pk, "lora_id");
  pk.pack_nil();
  PackStr(pk, "medium");
  PackStr(pk, e.medium);
  PackStr(pk, "lora_name");
  pk.pack_nil();
}

void PackEvent(Packer& pk, const BlockRemoved& e) {
  pk.pack_map(3);
  PackStr(pk, "type");
  PackStr(pk, "BlockRemoved");
  PackStr(pk, "block_hashes");
  PackHashes(pk, e.block_hashes);
  PackStr(pk, "medium");
  PackStr(pk, e.medium);
}

void PackEvent(Packer& pk, const AllBlocksCleared&) {
  pk.pack_map(1);
  PackStr(pk, "type");
  PackStr(pk, "AllBlocksCleared");
}

std::string BigEndian(int64_t v) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<char>(static_cast<uint64_t>(v) & 0xff);
    v = static_cast<int64_t>(static_cast<uint64_t>(v) >> 8);
  }
  return out;
}

int64_t FromBigEndian(const void* p) {
  const auto* b = static_cast<const unsigned char*>(p);
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | b[i];
  return static_cast<int64_t>(v);
}

}  // namespace

std::string EncodeKvEventBatch(double ts, absl::Span<const KvEvent> events,
                               std::optional<int> dp_rank) {
  msgpack::sbuffer buf;
  Packer pk(&buf);
  // KVEventBatch is array_like: [ts, events] plus the rank unless it is
  // the default (None), which omit_defaults drops from the end.
  pk.pack_array(dp_rank ? 3 : 2);
  pk.pack_double(ts);
  pk.pack_array(static_cast<uint32_t>(events.size()));
  for (const KvEvent& e : events) {
    std::visit([&](const auto& v) { PackEvent(pk, v); }, e);
  }
  if (dp_rank) pk.pack_int(*dp_rank);
  return std::string(buf.data(), buf.size());
}

struct KvEventPublisher::Impl {
  zmq::context_t ctx{1};
  zmq::socket_t pub{ctx, zmq::socket_type::pub};
  std::optional<zmq::socket_t> replay;
  // (seq, payload) of the last buffer_steps batches.
  std::deque<std::pair<int64_t, std::string>> buffer;
  int64_t next_seq = 0;
};

KvEventPublisher::KvEventPublisher(const KvEventOptions& options)
    : options_(options), impl_(std::make_unique<Impl>()) {}

absl::StatusOr<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Start(
    const KvEventOptions& options) {
  for (const std::string* e : {&options.endpoint, &options.replay_endpoint}) {
    if (e == &options.replay_endpoint && e->empty()) continue;
    if (!absl::StartsWith(*e, "tcp://") && !absl::StartsWith(*e, "ipc://")) {
      return absl::InvalidArgumentError(
          absl::StrCat("kv events endpoint '", *e,
                       "': expected tcp://HOST:PORT or ipc://PATH (a ZMQ "
                       "endpoint to bind)"));
    }
  }
  if (options.buffer_steps == 0 || options.max_queued == 0) {
    return absl::InvalidArgumentError(
        "kv events: buffer_steps and max_queued must be positive");
  }
  std::unique_ptr<KvEventPublisher> p(new KvEventPublisher(options));
  Impl& impl = *p->impl_;
  try {
    impl.pub.set(zmq::sockopt::sndhwm, options.send_high_water_mark);
    impl.pub.set(zmq::sockopt::linger, 0);
    impl.pub.bind(options.endpoint);
    p->endpoint_ = impl.pub.get(zmq::sockopt::last_endpoint);
    if (!options.replay_endpoint.empty()) {
      impl.replay.emplace(impl.ctx, zmq::socket_type::router);
      impl.replay->set(zmq::sockopt::linger, 0);
      impl.replay->bind(options.replay_endpoint);
      p->replay_endpoint_ = impl.replay->get(zmq::sockopt::last_endpoint);
    }
  } catch (const zmq::error_t& e) {
    return absl::UnavailableError(
        absl::StrCat("kv events: bind '", options.endpoint, "' / '",
                     options.replay_endpoint, "': ", e.what()));
  }
  p->thread_ = std::thread([raw = p.get()] { raw->Run(); });
  return p;
}

KvEventPublisher::~KvEventPublisher() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void KvEventPublisher::Publish(std::string topic, std::vector<KvEvent> events) {
  const double ts = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  absl::MutexLock lock(&mu_);
  if (queue_.size() >= options_.max_queued) {
    dropped_.fetch_add(1);
    return;
  }
  queue_.push_back(Queued{std::move(topic), ts, std::move(events)});
}

void KvEventPublisher::Run() {
  Impl& impl = *impl_;
  const std::string kEnd = BigEndian(-1);
  auto serve_replay = [&] {
    if (!impl.replay) return;
    for (;;) {
      std::vector<zmq::message_t> frames;
      zmq::recv_result_t got;
      try {
        got = zmq::recv_multipart(*impl.replay, std::back_inserter(frames),
                                  zmq::recv_flags::dontwait);
      } catch (const zmq::error_t& e) {
        SPDLOG_WARN("kv events replay: {}", e.what());
        return;
      }
      if (!got) return;
      if (frames.size() != 3 || frames[2].size() != 8) {
        SPDLOG_WARN("kv events replay: a request of {} frames ignored",
                    frames.size());
        continue;
      }
      const int64_t start = FromBigEndian(frames[2].data());
      const std::string id = frames[0].to_string();
      try {
        for (const auto& [seq, payload] : impl.buffer) {
          if (seq < start) continue;
          // Named: a buffer only points at its bytes.
          const std::string seq_bytes = BigEndian(seq);
          std::vector<zmq::const_buffer> reply = {
              zmq::buffer(id), zmq::const_buffer(nullptr, 0),
              zmq::buffer(seq_bytes), zmq::buffer(payload)};
          zmq::send_multipart(*impl.replay, reply);
        }
        std::vector<zmq::const_buffer> end = {
            zmq::buffer(id), zmq::const_buffer(nullptr, 0), zmq::buffer(kEnd),
            zmq::const_buffer(nullptr, 0)};
        zmq::send_multipart(*impl.replay, end);
      } catch (const zmq::error_t& e) {
        SPDLOG_WARN("kv events replay: {}", e.what());
      }
    }
  };
  for (;;) {
    std::deque<Queued> batches;
    bool stopping = false;
    {
      absl::MutexLock lock(&mu_);
      // Wakes for a batch or the stop at once, for replay requests within
      // 20 ms.
      mu_.AwaitWithTimeout(absl::Condition(this, &KvEventPublisher::HasWork),
                           absl::Milliseconds(20));
      batches.swap(queue_);
      stopping = stop_;
    }
    for (Queued& q : batches) {
      std::string payload = EncodeKvEventBatch(q.ts, q.events);
      const int64_t seq = impl.next_seq++;
      const std::string seq_bytes = BigEndian(seq);
      std::vector<zmq::const_buffer> msg = {
          zmq::buffer(q.topic), zmq::buffer(seq_bytes), zmq::buffer(payload)};
      try {
        // PUB never blocks: past the high-water mark ZMQ drops for the slow
        // subscriber, who can replay.
        zmq::send_multipart(impl.pub, msg, zmq::send_flags::dontwait);
        published_.fetch_add(1);
      } catch (const zmq::error_t& e) {
        dropped_.fetch_add(1);
        SPDLOG_WARN("kv events: send: {}", e.what());
      }
      impl.buffer.emplace_back(seq, std::move(payload));
      while (impl.buffer.size() > options_.buffer_steps) {
        impl.buffer.pop_front();
      }
    }
    serve_replay();
    if (stopping && batches.empty()) break;
  }
  impl.replay.reset();
  impl.pub.close();
}

}  // namespace kvtier::daemon
