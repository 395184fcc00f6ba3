// Tests of the page copy parameter checks, grid sizing and the reference
// implementation (which walks the same chunk plan as the kernel).

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/page_copy.h"

namespace kvtier::kernels {
namespace {

uint64_t Addr(const void* p) { return reinterpret_cast<uint64_t>(p); }

// Builds params over `sizes` tensors laid out region-per-tensor in `pool`
// (page stride = size rounded up to 16) and back to back in host rows.
PageCopyParams MakeParams(const std::vector<uint32_t>& sizes,
                          uint64_t num_pages, uint8_t* pool, uint8_t* host,
                          uint64_t row_stride) {
  PageCopyParams p;
  uint64_t pool_off = 0;
  uint64_t row_off = 0;
  uint32_t chunks = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    PageCopySegment& s = p.segments[i];
    const uint64_t stride = (sizes[i] + 15) / 16 * 16;
    s.gpu_base = Addr(pool + pool_off);
    s.gpu_stride = stride;
    s.host_base = Addr(host + row_off);
    s.host_stride = row_stride;
    s.bytes = sizes[i];
    s.chunk_begin = chunks;
    chunks += (sizes[i] + kChunkBytes - 1) / kChunkBytes;
    pool_off += stride * num_pages;
    row_off += sizes[i];
  }
  p.header.num_segments = static_cast<uint32_t>(sizes.size());
  p.header.chunks_per_item = chunks;
  return p;
}

TEST(PageCopyReference, GatherThenScatterOddAndMultiChunkSegments) {
  // 40000 bytes spans three chunks; 37 and 7 put later segments at odd
  // offsets of the row.
  const std::vector<uint32_t> sizes = {100, 37, 7, 40000, 50};
  const uint64_t num_pages = 6;
  uint64_t pool_bytes = 0;
  uint64_t row_bytes = 0;
  for (uint32_t s : sizes) {
    pool_bytes += (s + 15) / 16 * 16 * num_pages;
    row_bytes += s;
  }
  const uint64_t row_stride = (row_bytes + 15) / 16 * 16;
  std::vector<uint8_t> pool(pool_bytes);
  std::mt19937_64 rng(1);
  for (auto& b : pool) b = static_cast<uint8_t>(rng());
  const std::vector<uint8_t> original = pool;
  std::vector<uint8_t> host(row_stride * 4, 0);

  PageCopyParams p =
      MakeParams(sizes, num_pages, pool.data(), host.data(), row_stride);
  ASSERT_TRUE(CheckPageCopyParams(p).ok());
  const uint32_t pages[] = {5, 0, 3};
  const uint32_t rows[] = {1, 3, 0};
  p.header.num_items = 3;
  for (int i = 0; i < 3; ++i) {
    p.gpu_index[i] = pages[i];
    p.host_index[i] = rows[i];
  }
  p.header.direction = CopyDirection::kToHost;
  ASSERT_TRUE(RunPageCopyReference(p).ok());

  // Each row is its page's tensors back to back.
  for (int i = 0; i < 3; ++i) {
    uint64_t pool_off = 0;
    uint64_t row_off = 0;
    for (uint32_t s : sizes) {
      const uint64_t stride = (s + 15) / 16 * 16;
      EXPECT_EQ(0,
                std::memcmp(host.data() + rows[i] * row_stride + row_off,
                            original.data() + pool_off + pages[i] * stride, s))
          << "item " << i << " segment of " << s << " bytes";
      pool_off += stride * num_pages;
      row_off += s;
    }
  }
  // Row 2 was never a destination.
  for (uint64_t b = 0; b < row_stride; ++b) {
    ASSERT_EQ(host[2 * row_stride + b], 0) << b;
  }

  // Scatter rows 1, 3, 0 into pages 1, 2, 4: they become pages 5, 0, 3.
  std::fill(pool.begin(), pool.end(), 0);
  const uint32_t dst_pages[] = {1, 2, 4};
  for (int i = 0; i < 3; ++i) p.gpu_index[i] = dst_pages[i];
  p.header.direction = CopyDirection::kFromHost;
  ASSERT_TRUE(RunPageCopyReference(p).ok());
  uint64_t pool_off = 0;
  for (uint32_t s : sizes) {
    const uint64_t stride = (s + 15) / 16 * 16;
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(0,
                std::memcmp(pool.data() + pool_off + dst_pages[i] * stride,
                            original.data() + pool_off + pages[i] * stride, s));
    }
    // Pages never written stay zero.
    for (uint32_t page : {0u, 3u, 5u}) {
      for (uint32_t b = 0; b < s; ++b) {
        ASSERT_EQ(pool[pool_off + page * stride + b], 0);
      }
    }
    pool_off += stride * num_pages;
  }
}

TEST(PageCopyReference, RejectsMalformedParams) {
  std::vector<uint8_t> pool(1024), host(1024);
  PageCopyParams p = MakeParams({64, 64}, 4, pool.data(), host.data(), 128);
  ASSERT_TRUE(CheckPageCopyParams(p).ok());

  PageCopyParams bad = p;
  bad.header.num_items = kMaxCopyItems + 1;
  EXPECT_EQ(RunPageCopyReference(bad).code(),
            absl::StatusCode::kInvalidArgument);
  bad = p;
  bad.header.num_segments = 0;
  EXPECT_EQ(CheckPageCopyParams(bad).code(),
            absl::StatusCode::kInvalidArgument);
  bad = p;
  bad.segments[1].chunk_begin = 0;
  EXPECT_NE(CheckPageCopyParams(bad).message().find("chunk_begin"),
            std::string::npos);
  bad = p;
  bad.header.chunks_per_item = 3;
  EXPECT_NE(CheckPageCopyParams(bad).message().find("chunks_per_item"),
            std::string::npos);
  bad = p;
  bad.segments[0].bytes = 0;
  EXPECT_NE(CheckPageCopyParams(bad).message().find("bytes is 0"),
            std::string::npos);
  bad = p;
  bad.header.max_ctas = 0;
  EXPECT_NE(CheckPageCopyParams(bad).message().find("max_ctas"),
            std::string::npos);
}

TEST(PageCopyReference, GridIsCappedAndNeverEmpty) {
  std::vector<uint8_t> pool(16), host(16);
  PageCopyParams p = MakeParams({16}, 1, pool.data(), host.data(), 16);
  p.header.num_items = 0;
  EXPECT_EQ(PageCopyGridSize(p), 1u);
  p.header.num_items = 128;  // 128 units, 16 warps per CTA
  EXPECT_EQ(PageCopyGridSize(p), 8u);
  p.header.chunks_per_item = 64;  // pretend: 8192 units
  EXPECT_EQ(PageCopyGridSize(p), kDefaultMaxCtas);
  p.header.max_ctas = 4;
  EXPECT_EQ(PageCopyGridSize(p), 4u);
}

}  // namespace
}  // namespace kvtier::kernels
