// ReferenceStream: a host stand-in for a CUDA stream, for the reference
// transfer backend (Backend::kReference) and tests without a GPU.
//
// Pass stream.handle() wherever libkvtier takes a `void* stream`: a
// reference-backend copy enqueued on it runs on the stream's own thread, in
// order, after everything enqueued before it, exactly as a kernel would on
// a CUDA stream; CommitAfter, ReleaseAfter and AbortAfter wait for what was
// enqueued before them. Hold() stops the stream before its next item, so a
// test can keep copies queued (say, across a daemon restart) and let them
// land later with Resume().
//
//   kvtier::client::ReferenceStream stream;
//   stream.Hold();
//   (void)engine->Evict(gpu_pages, res->page_rows(), stream.handle());
//   res->AbortAfter(stream.handle());  // returns the rows after the copy
//   ... kill -9 the daemon, restart it ...
//   stream.Resume();                   // the queued copy lands now
//
// Thread-safety: thread-safe.
#ifndef KVTIER_CLIENT_REFERENCE_STREAM_H_
#define KVTIER_CLIENT_REFERENCE_STREAM_H_

#include <cstddef>
#include <functional>
#include <memory>

namespace kvtier::client {

class ReferenceStream {
 public:
  ReferenceStream();
  // Resumes a held stream, runs what is queued, and stops the thread.
  ~ReferenceStream();
  ReferenceStream(const ReferenceStream&) = delete;
  ReferenceStream& operator=(const ReferenceStream&) = delete;

  // The value to pass as `void* stream`.
  void* handle() { return this; }
  // The live ReferenceStream behind `stream`, or nullptr when `stream` is
  // not one (a CUDA stream, null).
  static ReferenceStream* FromHandle(void* stream);
  // How many ReferenceStreams exist in this process: while any does, work
  // may be queued behind the library's back (see Reservation's destructor).
  static size_t live_count();

  // Appends `work`; it runs after everything appended before it.
  void Enqueue(std::function<void()> work);
  // Stops before the next item until Resume(); the item running now ends.
  void Hold();
  void Resume();
  // Blocks until everything appended so far has run. REQUIRES: not held
  // (else it waits for Resume from another thread).
  void Synchronize();
  // Items appended and not yet finished.
  size_t pending() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_REFERENCE_STREAM_H_
