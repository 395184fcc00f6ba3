// transfer_bench's transfers: the methods and configurations it measures
// (baselines, kvtier's staged path, its direct path, --kvtier_variants), the
// random choice of GPU pages and host rows, and Enqueue, which puts one
// prepared transfer on a stream the way its method does (one contiguous
// copy, a per-chunk cudaMemcpyAsync loop, one cudaMemcpyBatchAsync, or the
// TransferEngine).
//
// Thread-safety: the functions keep no state except memcpy_batch's split
// limit and Notes() (plain globals; see transfer_bench.h); Enqueue uses the
// transfer's engine, which is thread-safe.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/transfer_bench.h"
#include "client/transfer_engine.h"
#include "client/transfer_plan.h"
#include "kernels/page_copy.h"

namespace kvtier::bench {
namespace {

// Calls per cudaMemcpyBatchAsync, 0 = all in one; lowered if one call of
// everything is refused.
size_t g_batch_limit = 0;

absl::Status BatchCopy(Transfer& t, size_t begin, size_t n, cudaStream_t s) {
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  size_t attr_index = 0;
  return Cuda(
      cudaMemcpyBatchAsync(t.dst.data() + begin, t.src.data() + begin,
                           t.size.data() + begin, n, &attr, &attr_index, 1, s),
      "cudaMemcpyBatchAsync");
}

// memcpy_2d's copies: per item, tensors grouped greedily into runs that
// are equally sized, equally spaced on the GPU (one pitch) and back to back
// in the host row; each run is one 2D copy of `tensors` lines. On vLLM's
// layer-first buffer (g) and on this benchmark's tensor-major pools (their
// tensors sit back to back in one pool) a bank's chunks of one page are one
// run; on block-first pools a page is one line.
void BuildCopies2D(Transfer* t) {
  const Bound& b = *t->b;
  t->copies2d.clear();
  const size_t n = t->items.gpu.size();
  for (size_t i = 0; i < n; ++i) {
    const uint64_t g = t->items.gpu[i];
    const uint64_t r = t->items.rows[i];
    for (size_t k = 0; k < b.tensors.size();) {
      const Tensor& first = b.tensors[k];
      size_t end = k + 1;
      uint64_t pitch = 0;
      while (end < b.tensors.size()) {
        const Tensor& prev = b.tensors[end - 1];
        const Tensor& next = b.tensors[end];
        const uint64_t step = next.gpu_base - prev.gpu_base;
        if (next.bytes != first.bytes || next.gpu_stride != first.gpu_stride ||
            next.host_stride != first.host_stride ||
            next.host_base != prev.host_base + prev.bytes ||
            next.gpu_base <= prev.gpu_base || (pitch != 0 && step != pitch)) {
          break;
        }
        pitch = step;
        ++end;
      }
      if (pitch == 0) pitch = first.bytes;
      const uint64_t gpu = first.gpu_base + g * first.gpu_stride;
      const uint64_t host = first.host_base + r * first.host_stride;
      Copy2D c;
      c.width = first.bytes;
      c.height = end - k;
      if (t->dir == Dir::kEvict) {
        c.dst = reinterpret_cast<void*>(host);
        c.dpitch = first.bytes;
        c.src = reinterpret_cast<const void*>(gpu);
        c.spitch = pitch;
      } else {
        c.dst = reinterpret_cast<void*>(gpu);
        c.dpitch = pitch;
        c.src = reinterpret_cast<const void*>(host);
        c.spitch = first.bytes;
      }
      t->copies2d.push_back(c);
      k = end;
    }
  }
}

}  // namespace

const char* DirName(Dir d) { return d == Dir::kEvict ? "evict" : "rehydrate"; }

const char* MethodName(Method m) {
  switch (m) {
    case Method::kContiguous:
      return "contiguous";
    case Method::kLoop:
      return "memcpy_loop";
    case Method::kBatch:
      return "memcpy_batch";
    case Method::kCopy2D:
      return "memcpy_2d";
    case Method::kKvtier:
      return "kvtier";
    case Method::kKvtierDirect:
      return "kvtier_direct";
  }
  return "?";
}
bool IsKvtier(Method m) {
  return m == Method::kKvtier || m == Method::kKvtierDirect;
}

Config Baseline(Method m) {
  Config c;
  c.method = m;
  return c;
}

Config Staged(uint32_t ctas) {
  Config c;
  c.method = Method::kKvtier;
  c.ctas = ctas;
  c.options.path = client::TransferPath::kStaged;
  c.options.staging_ctas = ctas;
  c.default_grid = ctas == client::kDefaultStagingCtas;
  return c;
}

Config Direct(uint32_t ctas) {
  Config c;
  c.method = Method::kKvtierDirect;
  c.ctas = ctas;
  c.options.path = client::TransferPath::kDirect;
  c.options.max_ctas = ctas;
  c.default_grid = ctas == kernels::kDefaultMaxCtas;
  return c;
}

// Parses --kvtier_variants.
absl::StatusOr<std::vector<Config>> ParseVariants(const std::string& flag) {
  std::vector<Config> out;
  for (absl::string_view item : absl::StrSplit(flag, ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> nv =
        absl::StrSplit(item, absl::MaxSplits(':', 1));
    Config c = Staged(client::kDefaultStagingCtas);
    c.variant = nv.first;
    c.default_grid = false;
    for (absl::string_view kv :
         absl::StrSplit(nv.second, ';', absl::SkipEmpty())) {
      std::pair<std::string, std::string> p =
          absl::StrSplit(kv, absl::MaxSplits('=', 1));
      if (p.first == "path") {
        if (p.second == "auto") {
          c.options.path = client::TransferPath::kAuto;
        } else if (p.second == "staged") {
          c.options.path = client::TransferPath::kStaged;
        } else if (p.second == "direct") {
          c.options.path = client::TransferPath::kDirect;
        } else if (p.second == "copy_engine") {
          c.options.path = client::TransferPath::kCopyEngine;
        } else {
          return absl::InvalidArgumentError(
              absl::StrCat("--kvtier_variants: path '", p.second,
                           "' is not auto, staged, direct or copy_engine"));
        }
        continue;
      }
      uint64_t v = 0;
      if (!absl::SimpleAtoi(p.second, &v)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--kvtier_variants: bad value in '", kv, "'"));
      }
      if (p.first == "staging_mib") {
        c.options.staging_bytes = v << 20;
      } else if (p.first == "ce_share") {
        c.options.copy_engine_share = static_cast<uint32_t>(v);
      } else if (p.first == "first_kib") {
        c.options.first_slice_bytes = v << 10;
      } else if (p.first == "prio_default") {
        c.options.staging_priority = v != 0 ? client::StagingPriority::kDefault
                                            : client::StagingPriority::kHighest;
      } else if (p.first == "edge_ctas") {
        c.options.edge_slice_ctas = static_cast<uint32_t>(v);
      } else if (p.first == "staging_ctas") {
        c.options.staging_ctas = static_cast<uint32_t>(v);
        c.ctas = static_cast<uint32_t>(v);
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("--kvtier_variants: unknown key '", p.first, "'"));
      }
    }
    out.push_back(c);
  }
  return out;
}

// A key naming the engine options of `c` (engines are shared by configs with
// the same options).
std::string OptionsKey(const client::TransferOptions& o) {
  return absl::StrCat(static_cast<int>(o.path), "/", o.max_ctas, "/",
                      o.staging_bytes, "/", o.staging_ctas, "/",
                      o.first_slice_bytes, "/",
                      static_cast<int>(o.staging_priority), "/",
                      o.copy_engine_share, "/", o.edge_slice_ctas);
}

void PickItems(Picker& gpu, Picker& rows, size_t n, std::vector<Items>* sets) {
  std::vector<uint32_t> g, r;
  gpu.Pick(n * sets->size(), &g);
  rows.Pick(n * sets->size(), &r);
  for (size_t s = 0; s < sets->size(); ++s) {
    (*sets)[s].gpu.assign(g.begin() + s * n, g.begin() + (s + 1) * n);
    (*sets)[s].rows.assign(r.begin() + s * n, r.begin() + (s + 1) * n);
  }
}

void BuildChunks(Transfer* t) {
  const Bound& b = *t->b;
  const size_t n = t->items.gpu.size();
  t->bytes = n * b.item_bytes;
  if (t->method == Method::kCopy2D) {
    BuildCopies2D(t);
    return;
  }
  if (t->method != Method::kLoop && t->method != Method::kBatch) return;
  const size_t count = n * b.tensors.size();
  t->dst.resize(count);
  t->src.resize(count);
  t->size.resize(count);
  size_t k = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t g = t->items.gpu[i];
    const uint64_t r = t->items.rows[i];
    for (const Tensor& ten : b.tensors) {
      const uint64_t gpu = ten.gpu_base + g * ten.gpu_stride;
      const uint64_t host = ten.host_base + r * ten.host_stride;
      const uint64_t to = t->dir == Dir::kEvict ? host : gpu;
      const uint64_t from = t->dir == Dir::kEvict ? gpu : host;
      t->dst[k] = reinterpret_cast<void*>(to);
      t->src[k] = reinterpret_cast<const void*>(from);
      t->size[k] = ten.bytes;
      ++k;
    }
  }
}

// Notes about a method that worked only in a degraded way (e.g. a batch
// split into several calls), reported once in the JSON.
std::vector<std::string>& Notes() {
  static std::vector<std::string> notes;
  return notes;
}

absl::Status Enqueue(Transfer& t, cudaStream_t s) {
  switch (t.method) {
    case Method::kContiguous: {
      const uint64_t gpu = t.pool + t.contiguous_offset;
      const uint64_t host = t.arena_dev + t.contiguous_offset;
      void* dst = reinterpret_cast<void*>(t.dir == Dir::kEvict ? host : gpu);
      const void* src =
          reinterpret_cast<const void*>(t.dir == Dir::kEvict ? gpu : host);
      return Cuda(cudaMemcpyAsync(dst, src, t.bytes, cudaMemcpyDefault, s),
                  "cudaMemcpyAsync (contiguous)");
    }
    case Method::kLoop:
      for (size_t k = 0; k < t.dst.size(); ++k) {
        const cudaError_t err = cudaMemcpyAsync(t.dst[k], t.src[k], t.size[k],
                                                cudaMemcpyDefault, s);
        if (err != cudaSuccess) return Cuda(err, "cudaMemcpyAsync (loop)");
      }
      return absl::OkStatus();
    case Method::kBatch: {
      const size_t total = t.dst.size();
      if (g_batch_limit == 0) {
        absl::Status st = BatchCopy(t, 0, total, s);
        if (st.ok() || total <= 1024) return st;
        // Refused as a whole (a count limit?): retry in pieces, once noted.
        g_batch_limit = 8192;
        Notes().push_back(absl::StrCat("memcpy_batch: one call of ", total,
                                       " copies failed (", st.message(),
                                       "); batches are split into calls of <= ",
                                       g_batch_limit, " copies from here on"));
      }
      for (size_t i = 0; i < total; i += g_batch_limit) {
        BENCH_RETURN_IF_ERROR(
            BatchCopy(t, i, std::min(g_batch_limit, total - i), s));
      }
      return absl::OkStatus();
    }
    case Method::kCopy2D:
      for (const Copy2D& c : t.copies2d) {
        const cudaError_t err =
            cudaMemcpy2DAsync(c.dst, c.dpitch, c.src, c.spitch, c.width,
                              c.height, cudaMemcpyDefault, s);
        if (err != cudaSuccess) return Cuda(err, "cudaMemcpy2DAsync");
      }
      return absl::OkStatus();
    case Method::kKvtier:
    case Method::kKvtierDirect: {
      if (t.b->def->snapshot()) {
        for (size_t i = 0; i < t.items.gpu.size(); ++i) {
          BENCH_RETURN_IF_ERROR(
              t.dir == Dir::kEvict
                  ? t.engine->SaveSnapshot(t.items.gpu[i], t.items.rows[i], s)
                  : t.engine->RestoreSnapshot(t.items.gpu[i], t.items.rows[i],
                                              s));
        }
        return absl::OkStatus();
      }
      return t.dir == Dir::kEvict
                 ? t.engine->Evict(t.items.gpu, t.items.rows, s)
                 : t.engine->Rehydrate(t.items.gpu, t.items.rows, s);
    }
  }
  return absl::InternalError("unknown method");
}

}  // namespace kvtier::bench
