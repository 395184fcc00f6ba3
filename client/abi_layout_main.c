/* kvtier_abi_layout: prints the layout of every struct of the C ABI
 * (kvtier/kvtier.h) as the C compiler sees it, as one JSON object:
 *
 *   {"api_version": 1,
 *    "structs": {"kvt_layout": {"size": 56, "align": 8,
 *                               "fields": {"model": [0, 8], ...}}, ...},
 *    "constants": {"KVT_OK": 0, ...}}
 *
 * A field is [offset, size], in declaration order. python/tests/
 * test_abi_layout.py compares it with the ctypes structures of
 * python/kvtier/_lib.py, which mirror the header by hand. Built as C11, so
 * it also proves the header is plain C.
 *
 * Thread-safety: a single-threaded program. */
#include <stddef.h>
#include <stdio.h>

#include "kvtier/kvtier.h"

static int first_struct = 1;
static int first_field = 1;

static void begin_struct(const char* name, size_t size, size_t align) {
  printf("%s\n    \"%s\": {\"size\": %zu, \"align\": %zu, \"fields\": {",
         first_struct ? "" : ",", name, size, align);
  first_struct = 0;
  first_field = 1;
}

static void field(const char* name, size_t offset, size_t size) {
  printf("%s\"%s\": [%zu, %zu]", first_field ? "" : ", ", name, offset, size);
  first_field = 0;
}

static void end_struct(void) { printf("}}"); }

#define BEGIN(T) begin_struct(#T, sizeof(T), _Alignof(T))
#define FIELD(T, f) field(#f, offsetof(T, f), sizeof(((T*)0)->f))

static int first_constant = 1;
static void constant(const char* name, long value) {
  printf("%s\n    \"%s\": %ld", first_constant ? "" : ",", name, value);
  first_constant = 0;
}
#define CONSTANT(c) constant(#c, (long)(c))

/* The structs of kvtier.h, section by section, in the header's order. */

/* Namespaces: layouts, attach options, bank mappings. */
static void namespace_structs(void) {
  BEGIN(kvt_bank_layout);
  FIELD(kvt_bank_layout, name);
  FIELD(kvt_bank_layout, row_bytes);
  FIELD(kvt_bank_layout, dtype);
  end_struct();

  BEGIN(kvt_layout);
  FIELD(kvt_layout, model);
  FIELD(kvt_layout, tokens_per_page);
  FIELD(kvt_layout, num_layers);
  FIELD(kvt_layout, page_banks);
  FIELD(kvt_layout, num_page_banks);
  FIELD(kvt_layout, snapshot_row_bytes);
  FIELD(kvt_layout, tp_size);
  FIELD(kvt_layout, replicated);
  FIELD(kvt_layout, hash_kind);
  end_struct();

  BEGIN(kvt_attach_options);
  FIELD(kvt_attach_options, name);
  FIELD(kvt_attach_options, layout);
  FIELD(kvt_attach_options, tp_rank);
  FIELD(kvt_attach_options, page_rows);
  FIELD(kvt_attach_options, snapshot_rows);
  FIELD(kvt_attach_options, max_replay_tokens);
  FIELD(kvt_attach_options, tenant_salt);
  FIELD(kvt_attach_options, tenant_salt_len);
  FIELD(kvt_attach_options, register_with_cuda);
  end_struct();

  BEGIN(kvt_bank_info);
  FIELD(kvt_bank_info, name);
  FIELD(kvt_bank_info, base);
  FIELD(kvt_bank_info, rows);
  FIELD(kvt_bank_info, row_bytes);
  FIELD(kvt_bank_info, row_stride);
  FIELD(kvt_bank_info, cuda_registered);
  FIELD(kvt_bank_info, huge_pages);
  end_struct();
}

/* Commits: snapshot placements and the result. */
static void commit_structs(void) {
  BEGIN(kvt_snapshot_placement);
  FIELD(kvt_snapshot_placement, index);
  FIELD(kvt_snapshot_placement, hash);
  end_struct();

  BEGIN(kvt_commit_result);
  FIELD(kvt_commit_result, committed_pages);
  FIELD(kvt_commit_result, deduplicated_pages);
  FIELD(kvt_commit_result, committed_snapshots);
  FIELD(kvt_commit_result, deduplicated_snapshots);
  end_struct();
}

/* Transfers: the GPU pool descriptor. */
static void pool_structs(void) {
  BEGIN(kvt_pool_tensor);
  FIELD(kvt_pool_tensor, base);
  FIELD(kvt_pool_tensor, page_stride);
  FIELD(kvt_pool_tensor, bytes_per_page);
  end_struct();

  BEGIN(kvt_bank_pool);
  FIELD(kvt_bank_pool, bank);
  FIELD(kvt_bank_pool, tensors);
  FIELD(kvt_bank_pool, num_tensors);
  end_struct();

  BEGIN(kvt_pool);
  FIELD(kvt_pool, device);
  FIELD(kvt_pool, num_pages);
  FIELD(kvt_pool, banks);
  FIELD(kvt_pool, num_banks);
  FIELD(kvt_pool, snapshot);
  FIELD(kvt_pool, num_snapshot_tensors);
  FIELD(kvt_pool, num_snapshot_slots);
  end_struct();
}

/* Device pools. */
static void device_pool_structs(void) {
  BEGIN(kvt_device_pool_info);
  FIELD(kvt_device_pool_info, device_ordinal);
  FIELD(kvt_device_pool_info, pci_bus_id);
  FIELD(kvt_device_pool_info, ipc_handle);
  FIELD(kvt_device_pool_info, ipc_handle_len);
  FIELD(kvt_device_pool_info, rows);
  FIELD(kvt_device_pool_info, row_bytes);
  FIELD(kvt_device_pool_info, row_stride);
  FIELD(kvt_device_pool_info, withheld);
  end_struct();
}

/* Mirrors. */
static void mirror_structs(void) {
  BEGIN(kvt_mirror_entry);
  FIELD(kvt_mirror_entry, logical);
  FIELD(kvt_mirror_entry, slot);
  FIELD(kvt_mirror_entry, token);
  end_struct();

  BEGIN(kvt_mirror_options);
  FIELD(kvt_mirror_options, logical_pages);
  FIELD(kvt_mirror_options, gpu_slots);
  FIELD(kvt_mirror_options, max_batch);
  FIELD(kvt_mirror_options, max_selected);
  FIELD(kvt_mirror_options, max_store_entries);
  FIELD(kvt_mirror_options, copy_ctas);
  FIELD(kvt_mirror_options, store_ctas);
  FIELD(kvt_mirror_options, backend);
  end_struct();
}

/* Cluster tier. */
static void cluster_structs(void) {
  BEGIN(kvt_prefetch_result);
  FIELD(kvt_prefetch_result, local_pages);
  FIELD(kvt_prefetch_result, remote_pages);
  FIELD(kvt_prefetch_result, prefetching_pages);
  end_struct();
}

/* The status codes, hash kinds and backends. */
static void constants(void) {
  CONSTANT(KVT_OK);
  CONSTANT(KVT_CANCELLED);
  CONSTANT(KVT_UNKNOWN);
  CONSTANT(KVT_INVALID_ARGUMENT);
  CONSTANT(KVT_DEADLINE_EXCEEDED);
  CONSTANT(KVT_NOT_FOUND);
  CONSTANT(KVT_ALREADY_EXISTS);
  CONSTANT(KVT_PERMISSION_DENIED);
  CONSTANT(KVT_RESOURCE_EXHAUSTED);
  CONSTANT(KVT_FAILED_PRECONDITION);
  CONSTANT(KVT_ABORTED);
  CONSTANT(KVT_OUT_OF_RANGE);
  CONSTANT(KVT_UNIMPLEMENTED);
  CONSTANT(KVT_INTERNAL);
  CONSTANT(KVT_UNAVAILABLE);
  CONSTANT(KVT_DATA_LOSS);
  CONSTANT(KVT_UNAUTHENTICATED);
  CONSTANT(KVT_HASH_SHA256);
  CONSTANT(KVT_HASH_XXH3_128);
  CONSTANT(KVT_BACKEND_CUDA);
  CONSTANT(KVT_BACKEND_REFERENCE);
}

int main(void) {
  printf("{\"api_version\": %d,\n  \"structs\": {", KVT_API_VERSION);
  namespace_structs();
  commit_structs();
  pool_structs();
  device_pool_structs();
  mirror_structs();
  cluster_structs();
  printf("\n  },\n  \"enum_size\": %zu,\n  \"constants\": {",
         sizeof(kvt_status));
  constants();
  printf("\n  }\n}\n");
  return 0;
}
