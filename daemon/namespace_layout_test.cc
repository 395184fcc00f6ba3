// Tests of namespace layout validation, fingerprints and hash seeds.
#include "daemon/namespace_layout.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using ::testing::HasSubstr;

v1::Layout Valid() {
  v1::Layout l;
  l.set_model("m");
  l.set_tokens_per_page(16);
  l.set_num_layers(2);
  auto* b = l.add_page_banks();
  b->set_name("kv");
  b->set_row_bytes(4096);
  return l;
}

TEST(NamespaceLayoutTest, AcceptsValidLayoutAndNormalizes) {
  EXPECT_TRUE(ValidateLayout(Valid()).ok());
  v1::Layout n = NormalizeLayout(Valid());
  EXPECT_EQ(n.tp_size(), 1u);
  EXPECT_EQ(n.hash_kind(), v1::HASH_KIND_SHA256);
}

TEST(NamespaceLayoutTest, RejectsEachBadField) {
  struct Case {
    void (*mutate)(v1::Layout*);
    const char* field;
  };
  const Case cases[] = {
      {[](v1::Layout* l) { l->set_tokens_per_page(0); }, "tokens_per_page"},
      {[](v1::Layout* l) { l->set_tokens_per_page(70000); }, "tokens_per_page"},
      {[](v1::Layout* l) { l->set_num_layers(0); }, "num_layers"},
      {[](v1::Layout* l) { l->clear_page_banks(); }, "page_banks"},
      {[](v1::Layout* l) { l->mutable_page_banks(0)->set_name(""); },
       "page_banks[0].name"},
      {[](v1::Layout* l) { l->mutable_page_banks(0)->set_name("KV"); },
       "page_banks[0].name"},
      {[](v1::Layout* l) { l->mutable_page_banks(0)->set_name("snapshot"); },
       "page_banks[0].name"},
      {[](v1::Layout* l) { l->mutable_page_banks(0)->set_row_bytes(0); },
       "page_banks[0].row_bytes"},
      {[](v1::Layout* l) { *l->add_page_banks() = l->page_banks(0); },
       "page_banks[1].name"},
      {[](v1::Layout* l) { l->set_tp_size(65); }, "tp_size"},
      {[](v1::Layout* l) { l->set_hash_kind(static_cast<v1::HashKind>(9)); },
       "hash_kind"},
      {[](v1::Layout* l) { l->set_snapshot_row_bytes(1ull << 40); },
       "snapshot_row_bytes"},
  };
  for (const Case& c : cases) {
    v1::Layout l = Valid();
    c.mutate(&l);
    absl::Status s = ValidateLayout(l);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.field));
  }
}

TEST(NamespaceLayoutTest, NamesAreChecked) {
  EXPECT_TRUE(ValidateNamespaceName("llama-3.1_8b").ok());
  EXPECT_FALSE(ValidateNamespaceName("").ok());
  EXPECT_FALSE(ValidateNamespaceName("..").ok());
  EXPECT_FALSE(ValidateNamespaceName("a/b").ok());
  EXPECT_FALSE(ValidateNamespaceName(std::string(129, 'a')).ok());
}

TEST(NamespaceLayoutTest, FingerprintDependsOnEveryField) {
  const Fingerprint base = LayoutFingerprint(NormalizeLayout(Valid()));
  EXPECT_EQ(base, LayoutFingerprint(NormalizeLayout(Valid())));
  v1::Layout l = Valid();
  l.mutable_page_banks(0)->set_dtype("fp8_e4m3");
  EXPECT_NE(base, LayoutFingerprint(NormalizeLayout(l)));
  l = Valid();
  l.set_replicated(true);
  EXPECT_NE(base, LayoutFingerprint(NormalizeLayout(l)));
}

TEST(NamespaceLayoutTest, DescribesFirstDifference) {
  v1::Layout a = NormalizeLayout(Valid());
  v1::Layout b = a;
  EXPECT_EQ(DescribeLayoutDifference(a, b), "");
  b.set_tokens_per_page(32);
  EXPECT_EQ(DescribeLayoutDifference(a, b),
            "tokens_per_page: existing 16, requested 32");
}

TEST(NamespaceLayoutTest, SeedsSeparateNamespacesAndTenants) {
  const Fingerprint fp = LayoutFingerprint(NormalizeLayout(Valid()));
  const std::string a = DeriveHashSeed("ns", fp, "", 32);
  EXPECT_EQ(a.size(), 32u);
  EXPECT_EQ(a, DeriveHashSeed("ns", fp, "", 32));
  EXPECT_NE(a, DeriveHashSeed("ns2", fp, "", 32));
  EXPECT_NE(a, DeriveHashSeed("ns", fp, "tenant-a", 32));
  EXPECT_EQ(DeriveHashSeed("ns", fp, "", 16), a.substr(0, 16));
}

}  // namespace
}  // namespace kvtier::daemon
