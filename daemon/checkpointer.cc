// Checkpointer (checkpointer.h): the thread that compacts journals.
//
// Thread-safety: see checkpointer.h.
#include "daemon/checkpointer.h"

#include <unistd.h>

#include <memory>
#include <utility>

#include "absl/time/clock.h"
#include "daemon/tier_namespace.h"
#include "spdlog/spdlog.h"

namespace kvtier::daemon {

Checkpointer::Checkpointer(std::function<void(const char*)> hook)
    : hook_(std::move(hook)), thread_([this] { Run(); }) {}

Checkpointer::~Checkpointer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void Checkpointer::Request(std::weak_ptr<TierNamespace> ns) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(ns));
}

uint64_t Checkpointer::written() const {
  absl::MutexLock lock(&mu_);
  return written_;
}

uint64_t Checkpointer::discarded() const {
  absl::MutexLock lock(&mu_);
  return discarded_;
}

void Checkpointer::Run() {
  for (;;) {
    std::shared_ptr<TierNamespace> ns;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](Checkpointer* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(c->mu_) {
            return c->stop_ || !c->queue_.empty();
          },
          this));
      if (stop_) return;
      ns = queue_.front().lock();
      queue_.pop_front();
    }
    if (ns != nullptr) CheckpointOne(*ns);
  }
}

void Checkpointer::CheckpointOne(TierNamespace& ns) {
  const absl::Time start = absl::Now();
  std::unique_ptr<NamespaceJournal::PendingCheckpoint> pending;
  uint64_t before = 0;
  const NamespaceJournal* journal = nullptr;
  {
    absl::MutexLock lock(&ns.mu);
    ns.checkpoint_queued = false;
    if (ns.dropped || ns.journal == nullptr || !ns.journal->NeedsCheckpoint()) {
      return;
    }
    before = ns.journal->bytes();
    pending = ns.journal->StartCheckpoint(*ns.index);
    if (pending == nullptr) return;  // One in progress, or broken.
    journal = ns.journal.get();
  }
  Hook("checkpoint:writing");
  absl::Status s = NamespaceJournal::WriteCheckpoint(*pending);
  int retired_fd = -1;  // The replaced journal, closed after the lock.
  {
    absl::MutexLock lock(&ns.mu);
    if (ns.journal.get() != journal) {
      // Dropped meanwhile: its journal is gone; the Pending removes its
      // file when it goes.
      s = absl::AbortedError("the namespace was dropped");
    } else if (!s.ok()) {
      ns.journal->DiscardCheckpoint(std::move(pending));  // The old file stays.
    } else {
      s = ns.journal->FinishCheckpoint(std::move(pending), &retired_fd);
    }
    if (!s.ok()) {
      SPDLOG_WARN("namespace '{}': background checkpoint discarded: {}",
                  ns.name, s.ToString());
    } else {
      SPDLOG_INFO("namespace '{}': journal checkpoint {} -> {} bytes in {}",
                  ns.name, before, ns.journal->bytes(),
                  absl::FormatDuration(absl::Now() - start));
    }
  }
  if (retired_fd >= 0) ::close(retired_fd);
  absl::MutexLock lock(&mu_);
  ++(s.ok() ? written_ : discarded_);
}

}  // namespace kvtier::daemon
