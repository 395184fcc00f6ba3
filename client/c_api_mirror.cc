// The C ABI of the sparse-attention write-through mirror (client/mirror.h)
// and of mirror adoption (Namespace::AdoptMirror, Mirror::Adopt). A
// kvt_mirror owns one kvtier::client::Mirror: its reservation, device state and
// revocation when the session ends are the C++ class's. Argument checks,
// status codes and the last error as in c_api.cc.
//
// Thread-safety: a kvt_mirror is used by one thread and one stream at a time
// (as a Mirror); kvt_adopt_mirror is as thread-safe as the namespace, with
// the mirror reservation not used by another thread meanwhile.
#include <cstddef>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "client/c_api_internal.h"
#include "client/client.h"
#include "client/mirror.h"
#include "kvtier/kvtier.h"

static_assert(sizeof(kvt_mirror_entry) ==
              sizeof(kvtier::client::MirrorStoreEntry));
static_assert(offsetof(kvt_mirror_entry, logical) ==
              offsetof(kvtier::client::MirrorStoreEntry, logical));
static_assert(offsetof(kvt_mirror_entry, slot) ==
              offsetof(kvtier::client::MirrorStoreEntry, slot));
static_assert(offsetof(kvt_mirror_entry, token) ==
              offsetof(kvtier::client::MirrorStoreEntry, token));

struct kvt_mirror {
  std::unique_ptr<kvtier::client::Mirror> mirror;
};

namespace {

using kvtier::capi::Bytes;
using kvtier::capi::Fill;
using kvtier::capi::Set;

// What the C++ MirrorOptions defaults to where the C options say 0.
constexpr uint32_t kDefaultCopyCtas = kvtier::client::MirrorOptions{}.copy_ctas;
constexpr uint32_t kDefaultStoreCtas =
    kvtier::client::MirrorOptions{}.store_ctas;

}  // namespace

#pragma GCC visibility push(default)
extern "C" {

kvt_status kvt_mirror_create(kvt_namespace* ns, const kvt_pool* pool,
                             const kvt_mirror_options* options, void* stream,
                             kvt_mirror** out) {
  KVT_REQUIRE(ns != nullptr, "ns: NULL");
  KVT_REQUIRE(pool != nullptr, "pool: NULL");
  KVT_REQUIRE(options != nullptr, "options: NULL");
  KVT_REQUIRE(out != nullptr, "out: NULL");
  KVT_REQUIRE(options->backend == KVT_BACKEND_CUDA ||
                  options->backend == KVT_BACKEND_REFERENCE,
              "options.backend: unknown value");
  auto d = kvtier::capi::Descriptor(pool);
  if (!d.ok()) return Set(d.status());
  const kvtier::client::MirrorOptions o{
      .logical_pages = options->logical_pages,
      .gpu_slots = options->gpu_slots,
      .max_batch = options->max_batch,
      .max_selected = options->max_selected,
      .max_store_entries = options->max_store_entries,
      .copy_ctas =
          options->copy_ctas == 0 ? kDefaultCopyCtas : options->copy_ctas,
      .store_ctas =
          options->store_ctas == 0 ? kDefaultStoreCtas : options->store_ctas,
      .reference = options->backend == KVT_BACKEND_REFERENCE};
  auto m = kvtier::client::Mirror::Create(*ns->ns, *d, o, stream);
  if (!m.ok()) return Set(m.status());
  *out = new kvt_mirror{*std::move(m)};
  return Set(absl::OkStatus());
}

void kvt_mirror_close(kvt_mirror* m) { delete m; }

uint32_t kvt_mirror_num_rows(const kvt_mirror* m) {
  return m == nullptr ? 0 : static_cast<uint32_t>(m->mirror->rows().size());
}

const uint32_t* kvt_mirror_rows(const kvt_mirror* m) {
  return m == nullptr ? nullptr : m->mirror->rows().data();
}

uint64_t kvt_mirror_reservation_id(const kvt_mirror* m) {
  return m == nullptr ? 0 : m->mirror->reservation().id();
}

kvt_status kvt_mirror_store(kvt_mirror* m, const kvt_mirror_entry* entries,
                            const uint32_t* count, void* stream) {
  KVT_REQUIRE(m != nullptr, "mirror: NULL");
  KVT_REQUIRE(entries != nullptr, "entries: NULL");
  KVT_REQUIRE(count != nullptr, "count: NULL");
  return Set(m->mirror->Store(
      reinterpret_cast<const kvtier::client::MirrorStoreEntry*>(entries), count,
      stream));
}

kvt_status kvt_mirror_ensure(kvt_mirror* m, const int32_t* selected,
                             int32_t* translated, void* stream) {
  KVT_REQUIRE(m != nullptr, "mirror: NULL");
  KVT_REQUIRE(selected != nullptr, "selected: NULL");
  KVT_REQUIRE(translated != nullptr, "translated: NULL");
  return Set(m->mirror->Ensure(selected, translated, stream));
}

const void* kvt_mirror_store_drops(const kvt_mirror* m) {
  return m == nullptr ? nullptr : m->mirror->store_drops();
}

const void* kvt_mirror_ensure_drops(const kvt_mirror* m) {
  return m == nullptr ? nullptr : m->mirror->ensure_drops();
}

int32_t kvt_mirror_revoked(const kvt_mirror* m) {
  return m != nullptr && m->mirror->revoked();
}

kvt_status kvt_mirror_adopt(kvt_mirror* m, const uint32_t* logical_pages,
                            size_t num_pages, const uint8_t* parent,
                            size_t parent_len, const uint8_t* hashes,
                            size_t num_hashes, kvt_commit_result* result) {
  KVT_REQUIRE(m != nullptr, "mirror: NULL");
  KVT_REQUIRE(logical_pages != nullptr || num_pages == 0,
              "logical_pages: NULL");
  KVT_REQUIRE(hashes != nullptr || num_hashes == 0, "hashes: NULL");
  const size_t hash_bytes = m->mirror->reservation().hash_bytes();
  auto c = m->mirror->Adopt(absl::MakeConstSpan(logical_pages, num_pages),
                            Bytes(parent, parent_len),
                            Bytes(hashes, num_hashes * hash_bytes));
  if (!c.ok()) return Set(c.status());
  Fill(result, *c);
  return Set(absl::OkStatus());
}

kvt_status kvt_adopt_mirror(kvt_namespace* ns, const kvt_reservation* mirror,
                            const uint32_t* mirror_indices, size_t num_indices,
                            const uint8_t* parent, size_t parent_len,
                            const uint8_t* hashes, size_t num_hashes,
                            kvt_commit_result* result) {
  KVT_REQUIRE(ns != nullptr, "ns: NULL");
  KVT_REQUIRE(mirror != nullptr, "mirror: NULL");
  KVT_REQUIRE(mirror_indices != nullptr || num_indices == 0,
              "mirror_indices: NULL");
  KVT_REQUIRE(hashes != nullptr || num_hashes == 0, "hashes: NULL");
  const size_t hash_bytes = ns->ns->hasher().hash_bytes();
  auto c = ns->ns->AdoptMirror(
      mirror->reservation, absl::MakeConstSpan(mirror_indices, num_indices),
      Bytes(parent, parent_len), Bytes(hashes, num_hashes * hash_bytes));
  if (!c.ok()) return Set(c.status());
  Fill(result, *c);
  return Set(absl::OkStatus());
}

}  // extern "C"
#pragma GCC visibility pop
