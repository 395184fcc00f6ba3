/* libkvtier's C ABI: what engines in any language (Python through ctypes,
 * Rust, Go) call. Every function returns a kvt_status; on failure,
 * kvt_last_error() returns a message for the calling thread that names the
 * offending argument. Handles are opaque; each *_close / *_free releases one.
 *
 * Streams are cudaStream_t passed as void*. No call synchronises the device.
 *
 * Thread-safety: kvt_client and kvt_namespace may be used from many threads;
 * a kvt_lease or kvt_reservation by one thread at a time. */
#ifndef KVTIER_KVTIER_H_
#define KVTIER_KVTIER_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

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

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_KVTIER_H_ */
