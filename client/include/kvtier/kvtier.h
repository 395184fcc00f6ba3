/* libkvtier's C ABI: what engines in any language (Python through ctypes,
 * Rust, Go) call. Every function returns a kvt_status; on failure,
 * kvt_last_error() returns a message for the calling thread that names the
 * offending argument. Handles are opaque; each *_close / *_free releases one.
 *
 * Streams are cudaStream_t passed as void*. No call synchronises the device.
 *
 * Thread-safety: kvt_client, kvt_namespace and kvt_device_pool_handle may be
 * used from many threads; a kvt_lease, kvt_reservation or kvt_mirror by one
 * thread at a time. */
#ifndef KVTIER_KVTIER_H_
#define KVTIER_KVTIER_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The C ABI's version (docs/abi.md). Within it the ABI only grows:
 * functions are added (a variant such as kvt_lookup_with_device beside
 * kvt_lookup, never a changed signature or meaning), and no struct changes
 * its layout. libkvtier.so exports these functions alone, at version node
 * KVTIER_1. */
#define KVT_API_VERSION 1

/* The canonical status codes (the same numbers as gRPC and absl). */
typedef enum kvt_status {
  KVT_OK = 0,
  KVT_CANCELLED = 1,
  KVT_UNKNOWN = 2,
  KVT_INVALID_ARGUMENT = 3,
  KVT_DEADLINE_EXCEEDED = 4,
  KVT_NOT_FOUND = 5,
  KVT_ALREADY_EXISTS = 6,
  KVT_PERMISSION_DENIED = 7,
  KVT_RESOURCE_EXHAUSTED = 8,
  KVT_FAILED_PRECONDITION = 9,
  KVT_ABORTED = 10,
  KVT_OUT_OF_RANGE = 11,
  KVT_UNIMPLEMENTED = 12,
  KVT_INTERNAL = 13,
  KVT_UNAVAILABLE = 14,
  KVT_DATA_LOSS = 15,
  KVT_UNAUTHENTICATED = 16
} kvt_status;

typedef enum kvt_hash_kind {
  KVT_HASH_SHA256 = 1,
  KVT_HASH_XXH3_128 = 2
} kvt_hash_kind;
typedef enum kvt_backend {
  KVT_BACKEND_CUDA = 0,
  KVT_BACKEND_REFERENCE = 1
} kvt_backend;

typedef struct kvt_client kvt_client;
typedef struct kvt_namespace kvt_namespace;
typedef struct kvt_lease kvt_lease;
typedef struct kvt_reservation kvt_reservation;
typedef struct kvt_pending_commit kvt_pending_commit;
typedef struct kvt_transfer kvt_transfer;

typedef struct kvt_bank_layout {
  const char* name;   /* [a-z0-9_]{1,32} */
  uint64_t row_bytes; /* > 0 */
  const char* dtype;  /* may be NULL */
} kvt_bank_layout;

typedef struct kvt_layout {
  const char* model; /* may be NULL */
  uint32_t tokens_per_page;
  uint32_t num_layers;
  const kvt_bank_layout* page_banks;
  uint32_t num_page_banks;
  uint64_t snapshot_row_bytes; /* 0: no snapshots */
  uint32_t tp_size;            /* 0 means 1 */
  int32_t replicated;          /* non-zero: one copy for the whole group */
  int32_t hash_kind;           /* kvt_hash_kind; 0 means SHA-256 */
} kvt_layout;

typedef struct kvt_attach_options {
  const char* name;
  const kvt_layout* layout;
  uint32_t tp_rank;
  uint64_t page_rows;     /* 0: daemon default */
  uint64_t snapshot_rows; /* 0: daemon default (hybrid only) */
  uint32_t max_replay_tokens;
  const void* tenant_salt; /* may be NULL */
  size_t tenant_salt_len;
  int32_t register_with_cuda; /* non-zero: cudaHostRegister when a GPU exists */
} kvt_attach_options;

typedef struct kvt_bank_info {
  const char* name; /* valid while the namespace is open */
  void* base;       /* row 0; also the device address when registered */
  uint64_t rows;
  uint64_t row_bytes;
  uint64_t row_stride;
  int32_t cuda_registered;
  int32_t huge_pages;
} kvt_bank_info;

typedef struct kvt_snapshot_placement {
  uint32_t index;      /* into the reservation's snapshot rows */
  const uint8_t* hash; /* hash_bytes long: the page the state follows */
} kvt_snapshot_placement;

typedef struct kvt_commit_result {
  uint32_t committed_pages;
  uint32_t deduplicated_pages;
  uint32_t committed_snapshots;
  uint32_t deduplicated_snapshots;
} kvt_commit_result;

typedef struct kvt_pool_tensor {
  uint64_t base; /* device address of page 0 (16-aligned) */
  uint64_t page_stride;
  uint64_t bytes_per_page;
} kvt_pool_tensor;

typedef struct kvt_bank_pool {
  const char* bank;
  const kvt_pool_tensor* tensors;
  uint32_t num_tensors;
} kvt_bank_pool;

typedef struct kvt_pool {
  int32_t device;
  uint64_t num_pages;
  const kvt_bank_pool* banks; /* one per page bank, in namespace order */
  uint32_t num_banks;
  const kvt_pool_tensor* snapshot; /* may be NULL */
  uint32_t num_snapshot_tensors;
  uint64_t num_snapshot_slots;
} kvt_pool;

/* The message of the calling thread's last failure ("" if none). */
const char* kvt_last_error(void);
/* The library's version string, e.g. "0.1.0". */
const char* kvt_version(void);

/* socket: NULL for the default. timeout_ms: 0 for 5000. */
kvt_status kvt_connect(const char* socket, const char* client_name,
                       uint32_t timeout_ms, kvt_client** out);
/* kvt_connect as one process of a client instance (fence protocol; see
 * ConnectOptions::instance_id): instance_len 16, or 0 for a fresh one. */
kvt_status kvt_connect_instance(const char* socket, const char* client_name,
                                uint32_t timeout_ms, const uint8_t* instance_id,
                                size_t instance_len, kvt_client** out);
void kvt_client_close(kvt_client* client);
uint64_t kvt_session_id(const kvt_client* client);
int32_t kvt_session_alive(const kvt_client* client);
kvt_status kvt_drop(kvt_client* client, const char* name, const uint8_t* hash,
                    size_t hash_len, int32_t force);

kvt_status kvt_attach(kvt_client* client, const kvt_attach_options* options,
                      kvt_namespace** out);
void kvt_namespace_close(kvt_namespace* ns);
uint64_t kvt_namespace_id(const kvt_namespace* ns);
uint32_t kvt_hash_bytes(const kvt_namespace* ns);
/* The pattern of the daemon's --namespace_acl entry that governs the
 * namespace (as its first attach reported it), valid while the namespace is
 * open; "" when no entry governs it: every engine that reaches the daemon
 * may then attach it and write its rows. */
const char* kvt_namespace_acl(const kvt_namespace* ns);
/* Page banks (index < kvt_num_page_banks) and the snapshot bank. */
uint32_t kvt_num_page_banks(const kvt_namespace* ns);
kvt_status kvt_page_bank(const kvt_namespace* ns, uint32_t index,
                         kvt_bank_info* out);
kvt_status kvt_snapshot_bank(const kvt_namespace* ns, kvt_bank_info* out);

/* Hashes every full page of tokens (continuing from parent when given) into
 * out (capacity out_cap bytes); *num_hashes gets the page count. */
kvt_status kvt_hash_tokens(const kvt_namespace* ns, const int32_t* tokens,
                           size_t num_tokens, const uint8_t* parent,
                           size_t parent_len, const uint8_t* extra_key,
                           size_t extra_key_len, uint8_t* out, size_t out_cap,
                           size_t* num_hashes);

kvt_status kvt_lookup(kvt_namespace* ns, const uint8_t* hashes,
                      size_t num_hashes, int32_t pin, kvt_lease** out);
uint32_t kvt_lease_matched_pages(const kvt_lease* lease);
uint32_t kvt_lease_usable_pages(const kvt_lease* lease);
const uint32_t* kvt_lease_rows(const kvt_lease* lease);
int32_t kvt_lease_has_snapshot(const kvt_lease* lease);
uint32_t kvt_lease_snapshot_row(const kvt_lease* lease);
/* Releases the pin and frees the handle. stream NULL: now, synchronously
 * (REQUIRES the copies from the rows to have finished). Otherwise once the
 * work queued on `stream` so far has finished, without blocking; to wait for
 * CUDA's legacy default stream pass cudaStreamLegacy ((void*)0x1). */
kvt_status kvt_lease_release(kvt_lease* lease, void* stream);

kvt_status kvt_reserve(kvt_namespace* ns, uint32_t pages, uint32_t snapshots,
                       kvt_reservation** out);
uint64_t kvt_reservation_id(const kvt_reservation* r);
uint32_t kvt_reservation_num_page_rows(const kvt_reservation* r);
const uint32_t* kvt_reservation_page_rows(const kvt_reservation* r);
uint32_t kvt_reservation_num_snapshot_rows(const kvt_reservation* r);
const uint32_t* kvt_reservation_snapshot_rows(const kvt_reservation* r);
/* The pages' token ids (tokens_per_page per page, in order), sent with the
 * reservation's commit for the daemon's KV events (routers hash blocks from
 * them); never stored. Optional; copied. */
kvt_status kvt_reservation_set_token_ids(kvt_reservation* r,
                                         const uint32_t* token_ids,
                                         size_t num_token_ids);
/* Commits now and frees the handle on success (on failure the reservation
 * stays open: retry, or kvt_abort). */
kvt_status kvt_commit(kvt_reservation* r, const uint8_t* parent,
                      size_t parent_len, const uint8_t* hashes,
                      size_t num_hashes, const kvt_snapshot_placement* snaps,
                      size_t num_snaps, kvt_commit_result* result);
/* Commits once `stream`'s queued work has finished, without blocking; frees
 * the reservation handle and returns a pending handle to wait on. NULL is
 * CUDA's default stream when the process has a GPU (as in CUDA itself), and
 * "at once" in a process without one. */
kvt_status kvt_commit_after(kvt_reservation* r, void* stream,
                            const uint8_t* parent, size_t parent_len,
                            const uint8_t* hashes, size_t num_hashes,
                            const kvt_snapshot_placement* snaps,
                            size_t num_snaps, kvt_pending_commit** out);
/* Waits (timeout_ms 0: forever) and frees the pending handle unless
 * DEADLINE_EXCEEDED. */
kvt_status kvt_pending_wait(kvt_pending_commit* p, uint32_t timeout_ms,
                            kvt_commit_result* result);
/* Frees the pending handle without waiting: the commit still happens, its
 * result is not reported. NULL is ignored. */
void kvt_pending_free(kvt_pending_commit* p);
/* Aborts and frees the handle. */
kvt_status kvt_abort(kvt_reservation* r);
/* Frees the handle of a reservation neither committed nor aborted the way
 * the library's own handles drop one: aborted now, or, in a process where
 * copies into the rows may still be queued (a CUDA device, a reference
 * stream), kept fenced until the process exits. NULL is ignored. */
void kvt_reservation_free(kvt_reservation* r);
/* Frees the handle and returns the rows once the work queued on `stream`
 * so far has finished (NULL: now, as kvt_abort). See Reservation::
 * AbortAfter. */
kvt_status kvt_abort_after(kvt_reservation* r, void* stream);

kvt_status kvt_transfer_create(const kvt_namespace* ns, int32_t backend,
                               const kvt_pool* pool, uint32_t max_ctas,
                               kvt_transfer** out);
void kvt_transfer_free(kvt_transfer* t);
kvt_status kvt_evict(kvt_transfer* t, const uint32_t* gpu_pages,
                     const uint32_t* rows, size_t n, void* stream);
kvt_status kvt_rehydrate(kvt_transfer* t, const uint32_t* gpu_pages,
                         const uint32_t* rows, size_t n, void* stream);
kvt_status kvt_snapshot_save(kvt_transfer* t, uint32_t slot, uint32_t row,
                             void* stream);
kvt_status kvt_snapshot_restore(kvt_transfer* t, uint32_t slot, uint32_t row,
                                void* stream);
/* A snapshot row of several groups (the namespace's snapshot_row_bytes a
 * multiple of the pool's snapshot tensors' bytes, e.g. vLLM's hybrid models
 * with several Mamba groups): slots[g] goes to (comes from) group g's part
 * of `row`, num_slots the number of groups, as one copy on `stream`.
 * kvt_snapshot_save / _restore are these with one slot. */
kvt_status kvt_snapshot_save_groups(kvt_transfer* t, const uint32_t* slots,
                                    uint32_t num_slots, uint32_t row,
                                    void* stream);
kvt_status kvt_snapshot_restore_groups(kvt_transfer* t, const uint32_t* slots,
                                       uint32_t num_slots, uint32_t row,
                                       void* stream);

/* ------------------------------------------------------ device pools --
 * The daemon's device pools (kvtierd --device_pool_bytes: daemon-owned GPU
 * memory of snapshot slots, opened over CUDA IPC), as the namespace's first
 * attach reported them (in the source tree: client/device_pool_client.h,
 * its internal C++ class). A pool is valid only for the daemon session
 * that reported it: once kvt_device_pools_valid turns 0 (the daemon stopped
 * or restarted) every use of a pool handle answers UNAVAILABLE; attach
 * again. */

typedef struct kvt_device_pool_handle kvt_device_pool_handle;

typedef struct kvt_device_pool_info {
  int32_t device_ordinal;    /* in the daemon's CUDA numbering */
  const char* pci_bus_id;    /* match GPUs by this; valid while ns is open */
  const uint8_t* ipc_handle; /* a cudaIpcMemHandle_t; valid while ns is open */
  size_t ipc_handle_len;     /* 64; 0 when withheld */
  uint64_t rows;             /* snapshot slots */
  uint64_t row_bytes;        /* usable bytes of one slot */
  uint64_t row_stride;       /* bytes from slot s to s + 1 */
  /* Non-zero: the pool does not serve this namespace (kvtierd
   * --device_pool_namespaces) and cannot be opened; listed so that indices
   * stay the daemon's. */
  int32_t withheld;
} kvt_device_pool_info;

/* How many device pools the daemon reported (0 unless it runs with
 * --device_pool_bytes), and whether the session that reported them is still
 * the current, open one (0 forever once it ended). */
uint32_t kvt_num_device_pools(const kvt_namespace* ns);
int32_t kvt_device_pools_valid(const kvt_namespace* ns);
/* Pool `index` as the daemon reported it; OUT_OF_RANGE unless index <
 * kvt_num_device_pools. */
kvt_status kvt_device_pool(const kvt_namespace* ns, uint32_t index,
                           kvt_device_pool_info* out);
/* Opens pool `index` on the current CUDA device, which must be the pool's
 * GPU (matched by PCI bus id). INVALID_ARGUMENT naming `index`;
 * PERMISSION_DENIED when withheld; FAILED_PRECONDITION without a device (or a
 * CUDA build) or on another GPU; UNAVAILABLE once the exporting session
 * ended. REQUIRES: ns outlives the handle. The handle is thread-safe. */
kvt_status kvt_device_pool_open(const kvt_namespace* ns, uint32_t index,
                                kvt_device_pool_handle** out);
/* cudaIpcCloseMemHandle and frees the handle. REQUIRES: no queued copy uses
 * the pool's memory. */
void kvt_device_pool_close(kvt_device_pool_handle* pool);
/* The opened pool's description (strings valid while the handle is open). */
kvt_status kvt_device_pool_describe(const kvt_device_pool_handle* pool,
                                    kvt_device_pool_info* out);
/* KVT_OK while the exporting daemon session is open; UNAVAILABLE after. */
kvt_status kvt_device_pool_check(const kvt_device_pool_handle* pool);
/* Device address of slot `row` (row 0: the pool's base; slot s starts at
 * base + s * row_stride). INVALID_ARGUMENT naming row; UNAVAILABLE as
 * kvt_device_pool_check. */
kvt_status kvt_device_pool_slot(const kvt_device_pool_handle* pool,
                                uint32_t row, void** out);
/* Queues a copy of `bytes` (<= row_bytes) from device memory `src` into
 * slot `row` on `stream` (cudaStream_t; NULL: the default stream). */
kvt_status kvt_device_pool_save(const kvt_device_pool_handle* pool,
                                uint32_t row, const void* src, size_t bytes,
                                void* stream);
/* Queues the restore of the lease's snapshot into device memory `dst`: from
 * the pool's slot when kvt_lease_has_device_snapshot, else from the host
 * snapshot bank (over UVA). FAILED_PRECONDITION when the lease holds no
 * snapshot. */
kvt_status kvt_device_pool_restore(const kvt_device_pool_handle* pool,
                                   const kvt_lease* lease, void* dst,
                                   size_t bytes, void* stream);

/* kvt_lookup that also asks device pool `device_pool` for the usable
 * snapshot (kvt_lease_has_device_snapshot). Always a protobuf Lookup call,
 * never the binary lookup frame. While !kvt_device_pools_valid: a host-only
 * lookup. INVALID_ARGUMENT when device_pool is not below
 * kvt_num_device_pools. */
kvt_status kvt_lookup_with_device(kvt_namespace* ns, const uint8_t* hashes,
                                  size_t num_hashes, uint32_t device_pool,
                                  int32_t pin, kvt_lease** out);
/* The lease's snapshot is also in the device pool the lookup named, in this
 * slot (pinned with the lease): restore it device-to-device. */
int32_t kvt_lease_has_device_snapshot(const kvt_lease* lease);
uint32_t kvt_lease_device_snapshot_row(const kvt_lease* lease);

/* kvt_reserve plus `device_snapshots` slots of device pool `device_pool`.
 * UNAVAILABLE with device_snapshots > 0 while !kvt_device_pools_valid. */
kvt_status kvt_reserve_with_device(kvt_namespace* ns, uint32_t pages,
                                   uint32_t snapshots,
                                   uint32_t device_snapshots,
                                   uint32_t device_pool, kvt_reservation** out);
/* The reserved device pool slots. */
uint32_t kvt_reservation_num_device_snapshot_rows(const kvt_reservation* r);
const uint32_t* kvt_reservation_device_snapshot_rows(const kvt_reservation* r);
/* kvt_commit that also places device slots: device_snaps[i].index indexes
 * kvt_reservation_device_snapshot_rows. A device slot is served only where
 * the host index holds the same snapshot. Frees the handle on success. */
kvt_status kvt_commit_with_device(kvt_reservation* r, const uint8_t* parent,
                                  size_t parent_len, const uint8_t* hashes,
                                  size_t num_hashes,
                                  const kvt_snapshot_placement* snaps,
                                  size_t num_snaps,
                                  const kvt_snapshot_placement* device_snaps,
                                  size_t num_device_snaps,
                                  kvt_commit_result* result);

/* ------------------------------------------------------------ mirrors --
 * The sparse-attention write-through mirror (client/mirror.h in the
 * source tree, its internal C++ class): L logical pages in session-private
 * rows (a reservation, invisible to lookups), a graph-capturable store
 * kernel from the engine's pool into them, and a device-side LRU (ensure)
 * that makes P pool pages a cache over them. When
 * the session ends (the daemon restarted) the mirror is revoked: its store,
 * in captured graphs too, writes nothing more, and the daemon keeps the rows
 * fenced until this process reports them or exits; a new mirror is needed.
 * A kvt_mirror is used by one thread and one stream at a time. */

typedef struct kvt_mirror kvt_mirror;

/* One stored token: the engine's logical page,
 * the pool page ("slot") it sits in, the token's offset in the page.
 * logical < 0: padding, skipped. */
typedef struct kvt_mirror_entry {
  int32_t logical;
  int32_t slot;
  int32_t token;
} kvt_mirror_entry;

typedef struct kvt_mirror_options {
  uint32_t logical_pages;     /* L: rows reserved for the mirror; > 0 */
  uint32_t gpu_slots;         /* P: pool pages the ensure manages, from 0;
                                 <= pool.num_pages */
  uint32_t max_batch;         /* sequences per ensure */
  uint32_t max_selected;      /* selected pages per sequence */
  uint32_t max_store_entries; /* entries per store; > 0 */
  uint32_t copy_ctas;         /* CTAs of the miss copy; 0: 32 */
  uint32_t store_ctas;        /* CTAs of the mirror store; 0: 16 */
  /* kvt_backend. KVT_BACKEND_REFERENCE (tests without a GPU): the pool's
   * "device addresses" are host pointers and store and ensure run the
   * kernels' references at once (pass a NULL stream); no graph capture. */
  int32_t backend;
} kvt_mirror_options;

/* Reserves options.logical_pages rows in ns, uploads the logical -> row table
 * and allocates the ensure state on pool.device, initialised on `stream`
 * (cudaStream_t). INVALID_ARGUMENT naming the field for a bad option or a
 * pool that does not match the namespace's banks (or max_batch x
 * max_selected > gpu_slots); FAILED_PRECONDITION without CUDA or with banks
 * not registered with CUDA (unless the reference backend); kvt_reserve's
 * errors. REQUIRES: ns outlives the mirror. */
kvt_status kvt_mirror_create(kvt_namespace* ns, const kvt_pool* pool,
                             const kvt_mirror_options* options, void* stream,
                             kvt_mirror** out);
/* Frees the device state, returns the rows and frees the handle. REQUIRES:
 * no launch that uses the mirror is pending (synchronise the stream). */
void kvt_mirror_close(kvt_mirror* m);
/* Row of each logical page (index = logical page, kvt_mirror_num_rows = L);
 * valid until kvt_mirror_close. */
uint32_t kvt_mirror_num_rows(const kvt_mirror* m);
const uint32_t* kvt_mirror_rows(const kvt_mirror* m);
/* The id of the reservation holding the rows (names the mirror to the
 * daemon). */
uint64_t kvt_mirror_reservation_id(const kvt_mirror* m);
/* Enqueues the mirror store on `stream`: entries[0, min(*count,
 * max_store_entries)) (device pointers; host pointers for the reference)
 * go from the pool to the mirror rows. Graph-capturable. */
kvt_status kvt_mirror_store(kvt_mirror* m, const kvt_mirror_entry* entries,
                            const uint32_t* count, void* stream);
/* Enqueues one ensure step over `selected` (device, max_batch x
 * max_selected logical pages, -1 padded); writes the slots to `translated`
 * (device, same shape; -1 for padding and drops). Graph-capturable. */
kvt_status kvt_mirror_ensure(kvt_mirror* m, const int32_t* selected,
                             int32_t* translated, void* stream);
/* Counters (one uint64_t each, device memory; host memory for the
 * reference): entries the store dropped (malformed), entries the ensure
 * dropped (out-of-range pages). Valid until kvt_mirror_close. */
const void* kvt_mirror_store_drops(const kvt_mirror* m);
const void* kvt_mirror_ensure_drops(const kvt_mirror* m);
/* Non-zero once the session that reserved the rows ended. */
int32_t kvt_mirror_revoked(const kvt_mirror* m);
/* Adopts mirrored pages into the prefix index: the daemon copies rows
 * kvt_mirror_rows()[logical_pages[i]] host-to-host into fresh rows and
 * commits them under `hashes` (num_hashes == num_pages, packed) below
 * `parent`. The mirror keeps its rows. REQUIRES: the pages' stores have
 * completed. INVALID_ARGUMENT naming logical_pages[i] when not below L;
 * UNAVAILABLE when the mirror's session ended. */
kvt_status kvt_mirror_adopt(kvt_mirror* m, const uint32_t* logical_pages,
                            size_t num_pages, const uint8_t* parent,
                            size_t parent_len, const uint8_t* hashes,
                            size_t num_hashes, kvt_commit_result* result);
/* The same for a reservation of this session used as a mirror (rows written
 * by any means): commits copies of mirror's page rows
 * [mirror_indices[i]] under `hashes`; `mirror` stays reserved. */
kvt_status kvt_adopt_mirror(kvt_namespace* ns, const kvt_reservation* mirror,
                            const uint32_t* mirror_indices, size_t num_indices,
                            const uint8_t* parent, size_t parent_len,
                            const uint8_t* hashes, size_t num_hashes,
                            kvt_commit_result* result);

/* ------------------------------------------------------- cluster tier --
 * The daemon's cluster tier (kvtierd --cluster_redis): pages that the
 * daemons of other nodes spilled to a shared Redis Cluster. A remote lookup
 * tells how far a chain continues there past the local match; a prefetch
 * brings that continuation into this node's host tier asynchronously, where
 * later lookups find it. A daemon without a cluster tier answers that it
 * holds nothing there. */

typedef struct kvt_prefetch_result {
  uint32_t local_pages; /* the local match (complete on every rank) */
  /* Pages past local_pages that this prefetch brings in: 0 when the cluster
   * tier holds none, or when a running prefetch already brings them in
   * (prefetching_pages then says how many). */
  uint32_t remote_pages;
  uint32_t prefetching_pages;
} kvt_prefetch_result;

/* kvt_lookup that also asks the cluster tier how far the chain continues
 * past the local match (kvt_lease_remote_pages, kvt_lease_prefetching_pages).
 * Always a protobuf Lookup call, never the binary lookup frame. The local
 * part is kvt_lookup's, pinned as `pin` asks; while the daemon is
 * unreachable, a miss (no remote pages either). */
kvt_status kvt_lookup_remote(kvt_namespace* ns, const uint8_t* hashes,
                             size_t num_hashes, int32_t pin, kvt_lease** out);
/* From kvt_lookup_remote (0 for any other lookup): the pages past
 * kvt_lease_matched_pages that the cluster tier holds for every rank, and
 * those a running prefetch is bringing into the host tier (each consecutive
 * from the local match; neither pinned nor readable through the lease). */
uint32_t kvt_lease_remote_pages(const kvt_lease* lease);
uint32_t kvt_lease_prefetching_pages(const kvt_lease* lease);
/* Starts bringing the continuation of the chain `hashes` (num_hashes
 * hashes from the chain's first page, as for kvt_lookup) past the local
 * match from the cluster tier into the host tier, and returns at once:
 * later lookups see the pages locally. Without a cluster tier nothing
 * starts (remote_pages 0). `out` may be NULL. UNAVAILABLE while the daemon
 * is unreachable; INVALID_ARGUMENT naming a bad argument. */
kvt_status kvt_prefetch(kvt_namespace* ns, const uint8_t* hashes,
                        size_t num_hashes, kvt_prefetch_result* out);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_KVTIER_H_ */
