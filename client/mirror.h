// Sparse-attention offload over a namespace's banks: a session-private
// write-through mirror of L logical pages and a device-side LRU (ensure)
// that makes P GPU slots a cache over them.
//
//   auto mirror = kvtier::client::Mirror::Create(*ns, pool, {.logical_pages =
//   20000,
//       .gpu_slots = pool.num_pages, .max_batch = 8, .max_selected = 512},
//       stream);
//   // every decode/prefill step, inside the engine's CUDA graph:
//   (*mirror)->Store(entries, count, stream);     // after store_kv
//   (*mirror)->Ensure(selected, translated, stream);  // before attention
//
// The mirror rows are a reservation of the session (Namespace::Reserve):
// invisible to lookups, released when the Mirror is destroyed. When the
// session ends (the daemon restarted) the mirror is revoked: its store
// kernel, in captured graphs too, reads a device-visible flag and writes
// nothing more, and the daemon keeps the rows fenced until this process
// reports them or exits (the fence protocol). Logical page l lives in row
// rows()[l] of every page bank, laid out as the pool descriptor's row format
// (client/pool.h). Store treats a pool tensor whose
// bytes_per_page divides by tokens_per_page as token-major (token t's bytes at
// t * bytes_per_page / tokens_per_page) and copies just the token; any other
// tensor (per-page side data) is copied whole on every store of one of its
// page's tokens.
//
// Thread-safety: a Mirror is used by one thread and one stream at a time.

#ifndef KVTIER_CLIENT_MIRROR_H_
#define KVTIER_CLIENT_MIRROR_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/client.h"
#include "client/pool.h"

namespace kvtier::client {

// One stored token (same layout as kernels::MirrorEntry): the engine's
// logical page, the GPU slot (pool page id) it sits in, the token's offset in
// the page. logical < 0: padding, skipped.
struct MirrorStoreEntry {
  int32_t logical = -1;
  int32_t slot = -1;
  int32_t token = 0;
};

struct MirrorOptions {
  uint32_t logical_pages = 0;      // L: rows reserved for the mirror; > 0
  uint32_t gpu_slots = 0;          // P: pool pages the ensure manages, from 0;
                                   // <= pool.num_pages
  uint32_t max_batch = 0;          // sequences per Ensure
  uint32_t max_selected = 0;       // selected pages per sequence
  uint32_t max_store_entries = 0;  // entries per Store; > 0
  uint32_t copy_ctas = 32;         // CTAs of the miss copy
  uint32_t store_ctas = 16;        // CTAs of the mirror store
  // The reference backend (tests without a GPU): the pool's "device
  // addresses" are host pointers and Store / Ensure run the kernels'
  // reference implementations, queued on a kvtier::client::ReferenceStream
  // passed as the stream, or at once for a null stream. Graph capture is
  // CUDA's.
  bool reference = false;
};

class Mirror {
 public:
  // REQUIRES: `ns` outlives the Mirror.
  // Reserves options.logical_pages rows in `ns`, uploads the logical -> row
  // table and allocates the ensure state on the current device (once).
  // INVALID_ARGUMENT naming the field for a bad option or a pool that does
  // not match the namespace's banks (or max_batch x max_selected >
  // gpu_slots); FAILED_PRECONDITION without CUDA or unregistered banks
  // (unless options.reference);
  // Reserve's errors. `stream` (a cudaStream_t) initialises the state.
  static absl::StatusOr<std::unique_ptr<Mirror>> Create(
      Namespace& ns, const GpuPoolDescriptor& pool,
      const MirrorOptions& options, void* stream);
  // Frees the device state and releases the rows. REQUIRES: no launch that
  // uses this mirror is pending (synchronise the engine's stream first).
  ~Mirror();
  Mirror(const Mirror&) = delete;
  Mirror& operator=(const Mirror&) = delete;

  // Row of each logical page (index = logical page id).
  absl::Span<const uint32_t> rows() const;
  // The reservation holding the rows (its id names the mirror to the daemon).
  const Reservation& reservation() const;

  // Enqueues the mirror store: entries[0, min(*count, max_store_entries))
  // (device pointers) go from the pool to the mirror. Graph-capturable.
  absl::Status Store(const MirrorStoreEntry* entries, const uint32_t* count,
                     void* stream);
  // Enqueues one ensure step over `selected` (device, max_batch x
  // max_selected logical pages, -1 padded); writes the slots to
  // `translated` (device, same shape; -1 for padding and drops).
  // Graph-capturable.
  absl::Status Ensure(const int32_t* selected, int32_t* translated,
                      void* stream);
  // Device counters (unsigned long long): entries the ensure dropped
  // (out-of-range pages), entries the store dropped (malformed).
  const void* ensure_drops() const;
  const void* store_drops() const;
  // True once the session that reserved the rows ended: Store writes
  // nothing from then on. A new Mirror (new rows) is needed.
  bool revoked() const;

  // Adopts mirrored pages into the prefix index: the daemon copies mirror
  // rows rows()[logical_pages[i]] host-to-host into fresh rows and commits
  // them under `hashes` (one per page, packed) below `parent_hash`. The
  // mirror keeps its rows. REQUIRES: the pages' stores have completed.
  absl::StatusOr<CommitResult> Adopt(absl::Span<const uint32_t> logical_pages,
                                     std::string_view parent_hash,
                                     std::string_view hashes);

 private:
  struct Impl;
  explicit Mirror(std::unique_ptr<Impl> impl);
  // Create's second half for options.reference.
  static absl::StatusOr<std::unique_ptr<Mirror>> CreateReference(
      std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier::client

#endif  // KVTIER_CLIENT_MIRROR_H_
