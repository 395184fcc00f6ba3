// kv_events_sample: publishes a fixed set of KV event batches through
// daemon/kv_events (the daemon's publisher), for tests that decode them with
// vLLM's own classes (python/tests_vllm/test_vllm_kv_events.py).
//
//   kv_events_sample PUB_ENDPOINT REPLAY_ENDPOINT
//
// Publishes, under topic "llama": batch 0 BlockStored (two first pages with
// their tokens), batch 1 BlockStored (a child page, no tokens), batch 2
// BlockRemoved (medium STORAGE), batch 3 AllBlocksCleared; waits until the
// publisher's thread has sent all four (Publish only queues), then prints
// "ready": a subscriber that connects after "ready" sees only later batches.
// Each stdin line afterwards publishes batch 0 again; EOF exits.
//
// Thread-safety: single-threaded (the publisher has its own thread).
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "daemon/kv_events.h"

using kvtier::daemon::AllBlocksCleared;
using kvtier::daemon::BlockRemoved;
using kvtier::daemon::BlockStored;
using kvtier::daemon::KvEventPublisher;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s PUB_ENDPOINT REPLAY_ENDPOINT\n", argv[0]);
    return 2;
  }
  auto pub = KvEventPublisher::Start(
      {.endpoint = argv[1], .replay_endpoint = argv[2]});
  if (!pub.ok()) {
    std::fprintf(stderr, "%s\n", pub.status().ToString().c_str());
    return 1;
  }
  BlockStored first;
  first.block_hashes = {std::string(32, '\x11'), std::string(32, '\x22')};
  for (uint32_t t = 0; t < 32; ++t) first.token_ids.push_back(1000 + t);
  first.block_size = 16;
  BlockStored child;
  child.block_hashes = {std::string(32, '\x33')};
  child.parent_block_hash = std::string(32, '\x22');
  child.block_size = 16;
  BlockRemoved removed;
  removed.block_hashes = {std::string(32, '\x33')};
  removed.medium = kvtier::daemon::kMediumStorage;
  (*pub)->Publish("llama", {first});
  (*pub)->Publish("llama", {child});
  (*pub)->Publish("llama", {removed});
  (*pub)->Publish("llama", {AllBlocksCleared{}});
  // Bounded: 10 s in 1 ms steps; the sends are to no subscriber, so they
  // cannot block.
  for (int i = 0; i < 10000 && (*pub)->published() < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if ((*pub)->published() < 4) {
    std::fprintf(stderr, "the publisher sent %llu of 4 batches\n",
                 static_cast<unsigned long long>((*pub)->published()));
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  for (std::string line; std::getline(std::cin, line);) {
    (*pub)->Publish("llama", {first});
  }
  return 0;
}
