// libkvtier's C ABI over the C++ API: argument checks, status codes and a
// thread-local last-error string. Nothing here throws across the boundary.
// The cluster tier's remote lookup and prefetch are here beside kvt_lookup.
// Device pools and device snapshots are in c_api_device_pool.cc, mirrors in
// c_api_mirror.cc.
//
// Thread-safety: as kvtier/kvtier.h says for each handle; the last error is
// per thread.
#include <chrono>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/c_api_internal.h"
#include "client/client.h"
#include "client/transfer_engine.h"
#include "kvtier/kvtier.h"

namespace kvtier::capi {

namespace {
thread_local std::string last_error;
}  // namespace

const char* LastError() { return last_error.c_str(); }

kvt_status Set(const absl::Status& s) {
  if (s.ok()) {
    last_error.clear();
    return KVT_OK;
  }
  // Code and message; payloads (an ErrorReason) are for the C++ layer.
  last_error = s.ToString(absl::StatusToStringMode::kWithNoExtraData);
  return static_cast<kvt_status>(s.code());
}

void Fill(kvt_commit_result* out, const kvtier::client::CommitResult& r) {
  if (out == nullptr) return;
  out->committed_pages = r.committed_pages;
  out->deduplicated_pages = r.deduplicated_pages;
  out->committed_snapshots = r.committed_snapshots;
  out->deduplicated_snapshots = r.deduplicated_snapshots;
}

absl::StatusOr<std::vector<kvtier::client::SnapshotPlacement>> Placements(
    const kvt_snapshot_placement* snaps, size_t n, uint32_t hash_bytes,
    absl::string_view what) {
  std::vector<kvtier::client::SnapshotPlacement> out;
  if (n > 0 && snaps == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": NULL with num_", what, " > 0"));
  }
  for (size_t i = 0; i < n; ++i) {
    if (snaps[i].hash == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, "[", i, "].hash: NULL"));
    }
    out.push_back({snaps[i].index,
                   std::string(reinterpret_cast<const char*>(snaps[i].hash),
                               hash_bytes)});
  }
  return out;
}

absl::StatusOr<kvtier::client::GpuPoolDescriptor> Descriptor(
    const kvt_pool* pool) {
  if (pool->num_banks > 0 && pool->banks == nullptr) {
    return absl::InvalidArgumentError("pool.banks: NULL with num_banks > 0");
  }
  if (pool->num_snapshot_tensors > 0 && pool->snapshot == nullptr) {
    return absl::InvalidArgumentError(
        "pool.snapshot: NULL with num_snapshot_tensors > 0");
  }
  kvtier::client::GpuPoolDescriptor d;
  d.device = pool->device;
  d.num_pages = pool->num_pages;
  for (uint32_t i = 0; i < pool->num_banks; ++i) {
    const kvt_bank_pool& b = pool->banks[i];
    if (b.bank == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("pool.banks[", i, "].bank: NULL"));
    }
    if (b.num_tensors > 0 && b.tensors == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("pool.banks[", i, "].tensors: NULL"));
    }
    kvtier::client::BankPool bp;
    bp.bank = b.bank;
    for (uint32_t t = 0; t < b.num_tensors; ++t) {
      bp.tensors.push_back({b.tensors[t].base, b.tensors[t].page_stride,
                            b.tensors[t].bytes_per_page});
    }
    d.banks.push_back(std::move(bp));
  }
  for (uint32_t t = 0; t < pool->num_snapshot_tensors; ++t) {
    d.snapshot.push_back({pool->snapshot[t].base, pool->snapshot[t].page_stride,
                          pool->snapshot[t].bytes_per_page});
  }
  d.num_snapshot_slots = pool->num_snapshot_slots;
  return d;
}

}  // namespace kvtier::capi

namespace {

using kvtier::capi::Bytes;
using kvtier::capi::Fill;
using kvtier::capi::Invalid;
using kvtier::capi::Placements;
using kvtier::capi::Set;

void Fill(kvt_bank_info* out, const kvtier::client::BankMapping& b) {
  out->name = b.name.c_str();
  out->base = b.base;
  out->rows = b.rows;
  out->row_bytes = b.row_bytes;
  out->row_stride = b.row_stride;
  out->cuda_registered = b.cuda_registered;
  out->huge_pages = b.huge_pages;
}

}  // namespace

// libkvtier.so is built with hidden visibility; the C ABI is its face.
#pragma GCC visibility push(default)
extern "C" {

const char* kvt_last_error(void) { return kvtier::capi::LastError(); }
const char* kvt_version(void) { return KVTIER_VERSION; }

kvt_status kvt_connect(const char* socket, const char* client_name,
                       uint32_t timeout_ms, kvt_client** out) {
  return kvt_connect_instance(socket, client_name, timeout_ms, nullptr, 0, out);
}

kvt_status kvt_connect_instance(const char* socket, const char* client_name,
                                uint32_t timeout_ms, const uint8_t* instance_id,
                                size_t instance_len, kvt_client** out) {
  KVT_REQUIRE(out != nullptr, "out: NULL");
  KVT_REQUIRE(
      instance_len == 0 || (instance_id != nullptr && instance_len == 16),
      "instance_id: must be 16 bytes (or instance_len 0)");
  kvtier::client::ConnectOptions o;
  if (instance_len > 0) {
    o.instance_id.assign(reinterpret_cast<const char*>(instance_id),
                         instance_len);
  }
  if (socket != nullptr) o.socket = socket;
  if (client_name != nullptr) o.client_name = client_name;
  o.timeout = absl::Milliseconds(timeout_ms == 0 ? 5000 : timeout_ms);
  auto c = kvtier::client::Client::Connect(o);
  if (!c.ok()) return Set(c.status());
  *out = new kvt_client{*std::move(c)};
  return Set(absl::OkStatus());
}

void kvt_client_close(kvt_client* client) { delete client; }

uint64_t kvt_session_id(const kvt_client* client) {
  return client == nullptr ? 0 : client->client->session_id();
}

int32_t kvt_session_alive(const kvt_client* client) {
  return client != nullptr && client->client->session_alive();
}

kvt_status kvt_drop(kvt_client* client, const char* name, const uint8_t* hash,
                    size_t hash_len, int32_t force) {
  KVT_REQUIRE(client != nullptr, "client: NULL");
  KVT_REQUIRE(name != nullptr, "name: NULL");
  auto r = client->client->Drop(name, Bytes(hash, hash_len), force != 0);
  return Set(r.status());
}

kvt_status kvt_attach(kvt_client* client, const kvt_attach_options* options,
                      kvt_namespace** out) {
  KVT_REQUIRE(client != nullptr, "client: NULL");
  KVT_REQUIRE(options != nullptr, "options: NULL");
  KVT_REQUIRE(out != nullptr, "out: NULL");
  KVT_REQUIRE(options->name != nullptr, "options.name: NULL");
  KVT_REQUIRE(options->layout != nullptr, "options.layout: NULL");
  const kvt_layout& l = *options->layout;
  KVT_REQUIRE(l.num_page_banks == 0 || l.page_banks != nullptr,
              "options.layout.page_banks: NULL with num_page_banks > 0");
  kvtier::client::AttachOptions o;
  o.name = options->name;
  o.layout.model = l.model == nullptr ? "" : l.model;
  o.layout.tokens_per_page = l.tokens_per_page;
  o.layout.num_layers = l.num_layers;
  for (uint32_t i = 0; i < l.num_page_banks; ++i) {
    const kvt_bank_layout& b = l.page_banks[i];
    if (b.name == nullptr) {
      return Invalid(
          absl::StrCat("options.layout.page_banks[", i, "].name: NULL"));
    }
    o.layout.page_banks.push_back(
        {b.name, b.row_bytes, b.dtype == nullptr ? "" : b.dtype});
  }
  o.layout.snapshot_row_bytes = l.snapshot_row_bytes;
  o.layout.tp_size = l.tp_size == 0 ? 1 : l.tp_size;
  o.layout.replicated = l.replicated != 0;
  KVT_REQUIRE(l.hash_kind == 0 || l.hash_kind == KVT_HASH_SHA256 ||
                  l.hash_kind == KVT_HASH_XXH3_128,
              "options.layout.hash_kind: unknown value");
  o.layout.hash_kind = l.hash_kind == KVT_HASH_XXH3_128
                           ? kvtier::client::HashKind::kXxh3_128
                           : kvtier::client::HashKind::kSha256;
  o.tp_rank = options->tp_rank;
  o.capacity.page_rows = options->page_rows;
  o.capacity.snapshot_rows = options->snapshot_rows;
  o.capacity.max_replay_tokens = options->max_replay_tokens;
  KVT_REQUIRE(options->tenant_salt_len == 0 || options->tenant_salt != nullptr,
              "options.tenant_salt: NULL with tenant_salt_len > 0");
  o.tenant_salt = std::string(static_cast<const char*>(options->tenant_salt),
                              options->tenant_salt_len);
  o.register_with_cuda = options->register_with_cuda != 0;
  auto ns = client->client->Attach(o);
  if (!ns.ok()) return Set(ns.status());
  *out = new kvt_namespace{*std::move(ns)};
  return Set(absl::OkStatus());
}

void kvt_namespace_close(kvt_namespace* ns) { delete ns; }

uint64_t kvt_namespace_id(const kvt_namespace* ns) {
  return ns == nullptr ? 0 : ns->ns->id();
}

uint32_t kvt_hash_bytes(const kvt_namespace* ns) {
  return ns == nullptr ? 0 : ns->ns->hasher().hash_bytes();
}

const char* kvt_namespace_acl(const kvt_namespace* ns) {
  return ns == nullptr ? "" : ns->ns->acl_entry().c_str();
}

uint32_t kvt_num_page_banks(const kvt_namespace* ns) {
  return ns == nullptr ? 0 : static_cast<uint32_t>(ns->ns->page_banks().size());
}

kvt_status kvt_page_bank(const kvt_namespace* ns, uint32_t index,
                         kvt_bank_info* out) {
  KVT_REQUIRE(ns != nullptr, "ns: NULL");
  KVT_REQUIRE(out != nullptr, "out: NULL");
  if (index >= ns->ns->page_banks().size()) {
    return Set(absl::OutOfRangeError(
        absl::StrCat("index: ", index, " is not below ",
                     ns->ns->page_banks().size(), " page banks")));
  }
  Fill(out, ns->ns->page_banks()[index]);
  return Set(absl::OkStatus());
}

kvt_status kvt_snapshot_bank(const kvt_namespace* ns, kvt_bank_info* out) {
  KVT_REQUIRE(ns != nullptr, "ns: NULL");
  KVT_REQUIRE(out != nullptr, "out: NULL");
  const kvtier::client::BankMapping* b = ns->ns->snapshot_bank();
  if (b == nullptr) {
    return Set(absl::NotFoundError("the namespace has no snapshot bank"));
  }
  Fill(out, *b);
  return Set(absl::OkStatus());
}

kvt_status kvt_hash_tokens(const kvt_namespace* ns, const int32_t* tokens,
                           size_t num_tokens, const uint8_t* parent,
                           size_t parent_len, const uint8_t* extra_key,
                           size_t extra_key_len, uint8_t* out, size_t out_cap,
                           size_t* num_hashes) {
  KVT_REQUIRE(ns != nullptr, "ns: NULL");
  KVT_REQUIRE(tokens != nullptr || num_tokens == 0, "tokens: NULL");
  KVT_REQUIRE(num_hashes != nullptr, "num_hashes: NULL");
  const kvtier::client::BlockHasher& h = ns->ns->hasher();
  absl::Span<const int32_t> span(tokens, num_tokens);
  std::string hashes;
  if (parent != nullptr) {
    auto r = h.HashChainFrom(Bytes(parent, parent_len), span,
                             Bytes(extra_key, extra_key_len));
    if (!r.ok()) return Set(r.status());
    hashes = *std::move(r);
  } else {
    hashes = h.HashChain(span, Bytes(extra_key, extra_key_len));
  }
  if (hashes.size() > out_cap || (out == nullptr && !hashes.empty())) {
    return Set(absl::OutOfRangeError(
        absl::StrCat("out_cap: ", out_cap, " bytes, need ", hashes.size())));
  }
  if (!hashes.empty()) std::memcpy(out, hashes.data(), hashes.size());
  *num_hashes = hashes.size() / h.hash_bytes();
  return Set(absl::OkStatus());
}

kvt_status kvt_lookup(kvt_namespace* ns, const uint8_t* hashes,
                      size_t num_hashes, int32_t pin, kvt_lease** out) {
  KVT_REQUIRE(ns != nullptr, "ns: NULL");
  KVT_REQUIRE(out != nullptr, "out: NULL");
  KVT_REQUIRE(hashes != nullptr || num_hashes == 0, "hashes: NULL");
  auto lease = ns->ns->Lookup(
      Bytes(hashes, num_hashes * ns->ns->hasher().hash_bytes()), pin != 0);
  if (!lease.ok()) return Set(lease.status());
  *out = new kvt_lease{*std::move(lease)};
  return Set(absl::OkStatus());
}

uint32_t kvt_lease_matched_pages(const kvt_lease* l) {
  return l == nullptr ? 0 : l->lease.matched_pages();
}
uint32_t kvt_lease_usable_pages(const kvt_lease* l) {
  return l == nullptr ? 0 : l->lease.usable_pages();
}
const uint32_t* kvt_lease_rows(const kvt_lease* l) {
  return l == nullptr ? nullptr : l->lease.rows().data();
}
int32_t kvt_lease_has_snapshot(const kvt_lease* l) {
  return l != nullptr && l->lease.has_snapshot();
}
uint32_t kvt_lease_snapshot_row(const kvt_lease* l) {
  return l == nullptr ? 0 : l->lease.snapshot_row();
}

kvt_status kvt_lookup_remote(kvt_namespace* ns, const uint8_t* hashes,
                             size_t num_hashes, int32_t pin, kvt_lease** out) {
  KVT_REQUIRE(ns != nullptr, "ns: NULL");
  KVT_REQUIRE(out != nullptr, "out: NULL");
  KVT_REQUIRE(hashes != nullptr || num_hashes == 0, "hashes: NULL");
  auto lease = ns->ns->LookupRemote(
      Bytes(hashes, num_hashes * ns->ns->hasher().hash_bytes()), pin != 0);
  if (!lease.ok()) return Set(lease.status());
  *out = new kvt_lease{*std::move(lease)};
  return Set(absl::OkStatus());
}

uint32_t kvt_lease_remote_pages(const kvt_lease* l) {
  return l == nullptr ? 0 : l->lease.remote_pages();
}
uint32_t kvt_lease_prefetching_pages(const kvt_lease* l) {
  return l == nullptr ? 0 : l->lease.prefetching_pages();
}

kvt_status kvt_prefetch(kvt_namespace* ns, const uint8_t* hashes,
                        size_t num_hashes, kvt_prefetch_result* out) {
  KVT_REQUIRE(ns != nullptr, "ns: NULL");
  KVT_REQUIRE(hashes != nullptr || num_hashes == 0, "hashes: NULL");
  auto r = ns->ns->Prefetch(
      Bytes(hashes, num_hashes * ns->ns->hasher().hash_bytes()));
  if (!r.ok()) return Set(r.status());
  if (out != nullptr) {
    out->local_pages = r->local_pages;
    out->remote_pages = r->remote_pages;
    out->prefetching_pages = r->prefetching_pages;
  }
  return Set(absl::OkStatus());
}

kvt_status kvt_lease_release(kvt_lease* lease, void* stream) {
  KVT_REQUIRE(lease != nullptr, "lease: NULL");
  absl::Status s;
  if (stream != nullptr) {
    lease->lease.ReleaseAfter(stream);
  } else {
    s = lease->lease.Release();
  }
  delete lease;
  return Set(s);
}

kvt_status kvt_reserve(kvt_namespace* ns, uint32_t pages, uint32_t snapshots,
                       kvt_reservation** out) {
  KVT_REQUIRE(ns != nullptr, "ns: NULL");
  KVT_REQUIRE(out != nullptr, "out: NULL");
  auto r = ns->ns->Reserve(pages, snapshots);
  if (!r.ok()) return Set(r.status());
  *out = new kvt_reservation{*std::move(r)};
  return Set(absl::OkStatus());
}

uint64_t kvt_reservation_id(const kvt_reservation* r) {
  return r == nullptr ? 0 : r->reservation.id();
}
uint32_t kvt_reservation_num_page_rows(const kvt_reservation* r) {
  return r == nullptr ? 0 : r->reservation.page_rows().size();
}
const uint32_t* kvt_reservation_page_rows(const kvt_reservation* r) {
  return r == nullptr ? nullptr : r->reservation.page_rows().data();
}
uint32_t kvt_reservation_num_snapshot_rows(const kvt_reservation* r) {
  return r == nullptr ? 0 : r->reservation.snapshot_rows().size();
}
const uint32_t* kvt_reservation_snapshot_rows(const kvt_reservation* r) {
  return r == nullptr ? nullptr : r->reservation.snapshot_rows().data();
}

kvt_status kvt_reservation_set_token_ids(kvt_reservation* r,
                                         const uint32_t* token_ids,
                                         size_t num_token_ids) {
  KVT_REQUIRE(r != nullptr, "reservation: NULL");
  KVT_REQUIRE(token_ids != nullptr || num_token_ids == 0, "token_ids: NULL");
  r->reservation.SetTokenIds(
      std::vector<uint32_t>(token_ids, token_ids + num_token_ids));
  return Set(absl::OkStatus());
}

kvt_status kvt_commit(kvt_reservation* r, const uint8_t* parent,
                      size_t parent_len, const uint8_t* hashes,
                      size_t num_hashes, const kvt_snapshot_placement* snaps,
                      size_t num_snaps, kvt_commit_result* result) {
  KVT_REQUIRE(r != nullptr, "reservation: NULL");
  KVT_REQUIRE(hashes != nullptr || num_hashes == 0, "hashes: NULL");
  const size_t hash_bytes = r->reservation.hash_bytes();
  auto placements = Placements(snaps, num_snaps, r->reservation.hash_bytes());
  if (!placements.ok()) return Set(placements.status());
  auto c = r->reservation.Commit(Bytes(parent, parent_len),
                                 Bytes(hashes, num_hashes * hash_bytes),
                                 *placements);
  if (!c.ok()) return Set(c.status());
  Fill(result, *c);
  delete r;
  return Set(absl::OkStatus());
}

kvt_status kvt_commit_after(kvt_reservation* r, void* stream,
                            const uint8_t* parent, size_t parent_len,
                            const uint8_t* hashes, size_t num_hashes,
                            const kvt_snapshot_placement* snaps,
                            size_t num_snaps, kvt_pending_commit** out) {
  KVT_REQUIRE(r != nullptr, "reservation: NULL");
  KVT_REQUIRE(out != nullptr, "out: NULL");
  KVT_REQUIRE(hashes != nullptr || num_hashes == 0, "hashes: NULL");
  const uint32_t hash_bytes = r->reservation.hash_bytes();
  auto placements = Placements(snaps, num_snaps, hash_bytes);
  if (!placements.ok()) return Set(placements.status());
  auto future = r->reservation.CommitAfter(
      stream, std::string(Bytes(parent, parent_len)),
      std::string(Bytes(hashes, num_hashes * hash_bytes)),
      *std::move(placements));
  delete r;
  *out = new kvt_pending_commit{std::move(future)};
  return Set(absl::OkStatus());
}

kvt_status kvt_pending_wait(kvt_pending_commit* p, uint32_t timeout_ms,
                            kvt_commit_result* result) {
  KVT_REQUIRE(p != nullptr, "pending: NULL");
  if (timeout_ms != 0 && p->future.wait_for(std::chrono::milliseconds(
                             timeout_ms)) != std::future_status::ready) {
    return Set(absl::DeadlineExceededError("commit still pending"));
  }
  absl::StatusOr<kvtier::client::CommitResult> r = p->future.get();
  delete p;
  if (!r.ok()) return Set(r.status());
  Fill(result, *r);
  return Set(absl::OkStatus());
}

kvt_status kvt_abort(kvt_reservation* r) {
  KVT_REQUIRE(r != nullptr, "reservation: NULL");
  absl::Status s = r->reservation.Abort();
  delete r;
  return Set(s);
}

void kvt_reservation_free(kvt_reservation* r) { delete r; }

void kvt_pending_free(kvt_pending_commit* p) { delete p; }

kvt_status kvt_abort_after(kvt_reservation* r, void* stream) {
  KVT_REQUIRE(r != nullptr, "reservation: NULL");
  if (stream == nullptr) return kvt_abort(r);
  r->reservation.AbortAfter(stream);
  delete r;
  return Set(absl::OkStatus());
}

kvt_status kvt_transfer_create(const kvt_namespace* ns, int32_t backend,
                               const kvt_pool* pool, uint32_t max_ctas,
                               kvt_transfer** out) {
  KVT_REQUIRE(ns != nullptr, "ns: NULL");
  KVT_REQUIRE(pool != nullptr, "pool: NULL");
  KVT_REQUIRE(out != nullptr, "out: NULL");
  KVT_REQUIRE(backend == KVT_BACKEND_CUDA || backend == KVT_BACKEND_REFERENCE,
              "backend: unknown value");
  auto d = kvtier::capi::Descriptor(pool);
  if (!d.ok()) return Set(d.status());
  auto engine = ns->ns->CreateTransferEngine(
      backend == KVT_BACKEND_CUDA ? kvtier::client::Backend::kCuda
                                  : kvtier::client::Backend::kReference,
      *d, max_ctas);
  if (!engine.ok()) return Set(engine.status());
  *out = new kvt_transfer{*std::move(engine)};
  return Set(absl::OkStatus());
}

void kvt_transfer_free(kvt_transfer* t) { delete t; }

kvt_status kvt_evict(kvt_transfer* t, const uint32_t* gpu_pages,
                     const uint32_t* rows, size_t n, void* stream) {
  KVT_REQUIRE(t != nullptr, "transfer: NULL");
  KVT_REQUIRE(n == 0 || (gpu_pages != nullptr && rows != nullptr),
              "gpu_pages, rows: NULL with n > 0");
  return Set(t->engine->Evict(absl::MakeConstSpan(gpu_pages, n),
                              absl::MakeConstSpan(rows, n), stream));
}

kvt_status kvt_rehydrate(kvt_transfer* t, const uint32_t* gpu_pages,
                         const uint32_t* rows, size_t n, void* stream) {
  KVT_REQUIRE(t != nullptr, "transfer: NULL");
  KVT_REQUIRE(n == 0 || (gpu_pages != nullptr && rows != nullptr),
              "gpu_pages, rows: NULL with n > 0");
  return Set(t->engine->Rehydrate(absl::MakeConstSpan(gpu_pages, n),
                                  absl::MakeConstSpan(rows, n), stream));
}

kvt_status kvt_snapshot_save(kvt_transfer* t, uint32_t slot, uint32_t row,
                             void* stream) {
  KVT_REQUIRE(t != nullptr, "transfer: NULL");
  return Set(t->engine->SaveSnapshot(slot, row, stream));
}

kvt_status kvt_snapshot_restore(kvt_transfer* t, uint32_t slot, uint32_t row,
                                void* stream) {
  KVT_REQUIRE(t != nullptr, "transfer: NULL");
  return Set(t->engine->RestoreSnapshot(slot, row, stream));
}

kvt_status kvt_snapshot_save_groups(kvt_transfer* t, const uint32_t* slots,
                                    uint32_t num_slots, uint32_t row,
                                    void* stream) {
  KVT_REQUIRE(t != nullptr, "transfer: NULL");
  KVT_REQUIRE(slots != nullptr || num_slots == 0, "slots: NULL");
  return Set(t->engine->SaveSnapshots(absl::MakeConstSpan(slots, num_slots),
                                      row, stream));
}

kvt_status kvt_snapshot_restore_groups(kvt_transfer* t, const uint32_t* slots,
                                       uint32_t num_slots, uint32_t row,
                                       void* stream) {
  KVT_REQUIRE(t != nullptr, "transfer: NULL");
  KVT_REQUIRE(slots != nullptr || num_slots == 0, "slots: NULL");
  return Set(t->engine->RestoreSnapshots(absl::MakeConstSpan(slots, num_slots),
                                         row, stream));
}

}  // extern "C"
#pragma GCC visibility pop
