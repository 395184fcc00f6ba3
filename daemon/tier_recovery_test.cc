// Tests of TierCore's recovery (tier_recovery.cc) over real journals and
// segments: a core over a test folder is "restarted" by destroying it
// (nothing is flushed at destruction: as after SIGKILL, only what write(2)
// put in the journal files counts) and building a new one that recovers.
// Every acknowledged commit comes back with the same rows; rows that were
// reserved come back fenced until their engine reports; a namespace that
// cannot be reopened, or whose journal is unreadable or corrupt, is kept
// (journal and segments) and reported, never served and never destroyed
// until an operator drops it.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/journal.h"
#include "daemon/test_keys.h"
#include "daemon/tier_core.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvtier::daemon {
namespace {

using ::testing::HasSubstr;

using testing::Chain;
using testing::Key;

std::string Packed(uint64_t chain, size_t n, size_t from = 0) {
  std::string out;
  for (const HashKey& k : Chain(chain, n, from)) {
    out.append(reinterpret_cast<const char*>(k.bytes.data()), 32);
  }
  return out;
}

// A daemon's core over a test folder, "restarted" by destroying it (nothing
// is flushed at destruction: as after SIGKILL, only what write(2) put in the
// journal files counts) and building a new one that recovers.
class TierCoreRecoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/dev/shm/kvtier-recovery-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    options_.segments.shm_dir = dir_;
    options_.segments.huge_pages = shm::HugePagePolicy::kOff;
    options_.state_dir = dir_ + "/state";
    Start();
  }
  void TearDown() override {
    core_.reset();
    std::filesystem::remove_all(dir_);
  }

  TierCore::RecoveryReport Start() {
    core_ = std::make_unique<TierCore>(options_);
    auto report = core_->Recover();
    EXPECT_TRUE(report.ok()) << report.status();
    v1::Hello hello;
    hello.set_client_name("engine");
    // The same engine instance across restarts (fence protocol), its pid
    // unseen (no credentials bound in these tests).
    hello.set_instance_id(std::string(16, 'e'));
    hello.set_connection_id(1);
    hello.set_fence_version(1);
    auto id = core_->OpenSession(hello, PeerInfo{});
    EXPECT_TRUE(id.ok()) << id.status();
    session_ = *id;
    return report.ok() ? *report : TierCore::RecoveryReport{};
  }
  // What the reconnected engine's library sends: nothing held from before.
  void ReportNothingHeld() {
    v1::FenceRequest req;
    req.set_session_id(session_);
    req.set_report_complete(true);
    v1::FenceResponse resp;
    absl::Status s = core_->Fence(req, &resp);
    EXPECT_TRUE(s.ok()) << s;
  }
  TierCore::RecoveryReport Restart() {
    core_.reset();
    return Start();
  }

  static v1::Layout Layout(bool hybrid) {
    v1::Layout l;
    l.set_model("recovery-test");
    l.set_tokens_per_page(16);
    l.set_num_layers(2);
    auto* kv = l.add_page_banks();
    kv->set_name("kv");
    kv->set_row_bytes(64);
    if (hybrid) l.set_snapshot_row_bytes(128);
    return l;
  }

  uint64_t Attach(const std::string& name, bool hybrid = false,
                  uint64_t page_rows = 64) {
    v1::AttachRequest req;
    req.set_session_id(session_);
    req.set_namespace_(name);
    *req.mutable_layout() = Layout(hybrid);
    req.mutable_capacity()->set_page_rows(page_rows);
    if (hybrid) req.mutable_capacity()->set_snapshot_rows(8);
    v1::AttachResponse resp;
    absl::Status s = core_->Attach(req, &resp);
    EXPECT_TRUE(s.ok()) << s;
    return resp.namespace_id();
  }

  absl::StatusOr<v1::ReserveResponse> Reserve(uint64_t ns, uint32_t pages,
                                              uint32_t snaps = 0) {
    v1::ReserveRequest req;
    req.set_session_id(session_);
    req.set_namespace_id(ns);
    req.set_pages(pages);
    req.set_snapshots(snaps);
    v1::ReserveResponse resp;
    absl::Status s = core_->Reserve(req, &resp);
    if (!s.ok()) return s;
    return resp;
  }

  // Reserves and commits pages [from, from + n) of `chain`, with a snapshot
  // after the last page when `snapshot`.
  void Put(uint64_t ns, uint64_t chain, uint32_t n, uint32_t from = 0,
           bool snapshot = false) {
    auto r = Reserve(ns, n, snapshot ? 1 : 0);
    ASSERT_TRUE(r.ok()) << r.status();
    v1::CommitRequest req;
    req.set_session_id(session_);
    req.set_namespace_id(ns);
    req.set_reservation_id(r->reservation_id());
    if (from > 0) req.set_parent_hash(Packed(chain, 1, from - 1));
    req.set_hashes(Packed(chain, n, from));
    if (snapshot) {
      auto* p = req.add_snapshots();
      p->set_index(0);
      p->set_hash(Packed(chain, 1, from + n - 1));
    }
    v1::CommitResponse resp;
    absl::Status s = core_->Commit(req, &resp);
    ASSERT_TRUE(s.ok()) << s;
  }

  v1::LookupResponse Lookup(uint64_t ns, const std::string& hashes) {
    v1::LookupRequest req;
    req.set_session_id(session_);
    req.set_namespace_id(ns);
    req.set_hashes(hashes);
    v1::LookupResponse resp;
    absl::Status s = core_->Lookup(req, &resp);
    EXPECT_TRUE(s.ok()) << s;
    return resp;
  }

  v1::BankUsage Bank(const std::string& ns, const std::string& bank) {
    v1::StatsResponse stats;
    EXPECT_TRUE(core_->Stats({}, &stats).ok());
    for (const auto& n : stats.namespaces()) {
      if (n.name() != ns) continue;
      for (const auto& b : n.banks()) {
        if (b.bank() == bank) return b;
      }
    }
    ADD_FAILURE() << "no bank " << bank << " in " << ns;
    return {};
  }

  // The first segment file of namespace `ns` (its "kv" bank, rank 0).
  std::string SegmentPath(const std::string& ns) {
    return absl::StrCat(dir_, "/kvtier.", ns, ".kv.r0");
  }
  static void FlipByte(const std::string& path, uint64_t offset) {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(offset);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(offset);
    f.write(&c, 1);
  }
  void ExpectUnrecoverable(const std::string& ns, bool corrupt) {
    v1::StatsResponse stats;
    ASSERT_TRUE(core_->Stats({}, &stats).ok());
    ASSERT_EQ(stats.unrecoverable_size(), 1);
    EXPECT_EQ(stats.unrecoverable(0).name(), ns);
    EXPECT_EQ(stats.unrecoverable(0).corrupt(), corrupt);
    for (const auto& n : stats.namespaces()) EXPECT_NE(n.name(), ns);
    v1::AttachRequest req;
    req.set_session_id(session_);
    req.set_namespace_(ns);
    *req.mutable_layout() = Layout(false);
    v1::AttachResponse resp;
    absl::Status s = core_->Attach(req, &resp);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(s.message(), HasSubstr("could not be recovered"));
  }
  void ExpectDroppable(const std::string& ns) {
    v1::DropRequest drop;
    drop.set_namespace_(ns);
    v1::DropResponse dropped;
    absl::Status s = core_->Drop(drop, &dropped);
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_FALSE(std::filesystem::exists(JournalPath(options_.state_dir, ns)));
    v1::StatsResponse stats;
    ASSERT_TRUE(core_->Stats({}, &stats).ok());
    EXPECT_EQ(stats.unrecoverable_size(), 0);
  }

  void ExpectVerified() {
    v1::VerifyResponse v;
    ASSERT_TRUE(core_->Verify({}, &v).ok());
    EXPECT_TRUE(v.ok()) << v.violation();
  }

  std::string dir_;
  TierOptions options_;
  std::unique_ptr<TierCore> core_;
  uint64_t session_ = 0;
};

TEST_F(TierCoreRecoveryTest, RestartFindsEveryAcknowledgedCommit) {
  uint64_t plain = Attach("plain");
  uint64_t hybrid = Attach("hybrid", /*hybrid=*/true);
  Put(plain, 1, 10);
  Put(plain, 1, 5, 10);  // A child commit.
  Put(plain, 2, 7);
  Put(hybrid, 3, 6, 0, /*snapshot=*/true);
  Put(hybrid, 3, 4, 6, /*snapshot=*/true);
  // Reserved, never committed: its rows must come back free.
  auto pending = Reserve(plain, 9);
  ASSERT_TRUE(pending.ok());
  auto pending_snap = Reserve(hybrid, 2, 1);
  ASSERT_TRUE(pending_snap.ok());
  const auto before_1 = Lookup(plain, Packed(1, 20));
  const auto before_3 = Lookup(hybrid, Packed(3, 10));

  TierCore::RecoveryReport report = Restart();
  EXPECT_EQ(report.namespaces, 2u);
  EXPECT_EQ(report.namespaces_emptied, 0u);
  EXPECT_EQ(report.pages, 32u);
  EXPECT_EQ(report.journals_torn, 0u);
  plain = Attach("plain");
  hybrid = Attach("hybrid", true);
  const auto after_1 = Lookup(plain, Packed(1, 20));
  EXPECT_EQ(after_1.matched_pages(), 15u);
  EXPECT_EQ(
      std::vector<uint32_t>(after_1.rows().begin(), after_1.rows().end()),
      std::vector<uint32_t>(before_1.rows().begin(), before_1.rows().end()));
  EXPECT_EQ(Lookup(plain, Packed(2, 7)).matched_pages(), 7u);
  const auto after_3 = Lookup(hybrid, Packed(3, 10));
  EXPECT_EQ(after_3.usable_pages(), 10u);
  EXPECT_TRUE(after_3.has_snapshot());
  EXPECT_EQ(after_3.snapshot_row(), before_3.snapshot_row());
  EXPECT_EQ(
      std::vector<uint32_t>(after_3.rows().begin(), after_3.rows().end()),
      std::vector<uint32_t>(before_3.rows().begin(), before_3.rows().end()));
  // The pending rows are fenced (their engine may still be writing them)
  // until it reports what it holds; then they are free again.
  v1::BankUsage kv = Bank("plain", "kv");
  EXPECT_EQ(kv.used_rows(), 22u);
  EXPECT_EQ(kv.fenced_rows(), 9u);
  EXPECT_EQ(kv.free_rows(), 64u - 22u - 9u);
  EXPECT_EQ(Bank("hybrid", "snapshot").fenced_rows(), 1u);
  ExpectVerified();
  ReportNothingHeld();
  kv = Bank("plain", "kv");
  EXPECT_EQ(kv.used_rows(), 22u);
  EXPECT_EQ(kv.reserved_rows(), 0u);
  EXPECT_EQ(kv.fenced_rows(), 0u);
  EXPECT_EQ(kv.free_rows(), 64u - 22u);
  EXPECT_EQ(Bank("hybrid", "snapshot").used_rows(), 2u);
  EXPECT_EQ(Bank("hybrid", "snapshot").free_rows(), 6u);
  ExpectVerified();
  // The restarted daemon keeps journaling: a second restart loses nothing.
  Put(plain, 4, 3);
  Restart();
  plain = Attach("plain");
  EXPECT_EQ(Lookup(plain, Packed(1, 20)).matched_pages(), 15u);
  EXPECT_EQ(Lookup(plain, Packed(4, 3)).matched_pages(), 3u);
  ExpectVerified();
}

TEST_F(TierCoreRecoveryTest, SixteenByteHashesAndTensorParallelRanks) {
  v1::Layout layout = Layout(false);
  layout.set_hash_kind(v1::HASH_KIND_XXH3_128);
  layout.set_tp_size(2);
  auto attach = [&](uint32_t rank) {
    v1::AttachRequest req;
    req.set_session_id(session_);
    req.set_namespace_("tp");
    *req.mutable_layout() = layout;
    req.set_tp_rank(rank);
    req.mutable_capacity()->set_page_rows(32);
    v1::AttachResponse resp;
    absl::Status s = core_->Attach(req, &resp);
    EXPECT_TRUE(s.ok()) << s;
    return resp.namespace_id();
  };
  auto put = [&](uint64_t ns, const std::string& hashes) {
    auto r = Reserve(ns, hashes.size() / 16);
    ASSERT_TRUE(r.ok()) << r.status();
    v1::CommitRequest req;
    req.set_session_id(session_);
    req.set_namespace_id(ns);
    req.set_reservation_id(r->reservation_id());
    req.set_hashes(hashes);
    v1::CommitResponse resp;
    ASSERT_TRUE(core_->Commit(req, &resp).ok());
  };
  std::string hashes;
  for (const HashKey& k : Chain(5, 6)) {
    hashes.append(reinterpret_cast<const char*>(k.bytes.data()), 16);
  }
  // Rank 0 commits 6 pages, rank 1 the first 4 (one session per rank).
  const uint64_t ns = attach(0);
  put(ns, hashes);
  v1::Hello hello;
  auto rank1 = core_->OpenSession(hello, PeerInfo{});
  ASSERT_TRUE(rank1.ok());
  std::swap(session_, *rank1);
  put(attach(1), hashes.substr(0, 4 * 16));
  Restart();
  const uint64_t again = attach(0);
  EXPECT_EQ(Lookup(again, hashes).matched_pages(), 4u);  // Complete nodes.
  EXPECT_EQ(Bank("tp", "kv").used_rows(), 6u);  // Rank 0's bank (listed first).
  ExpectVerified();
}

TEST_F(TierCoreRecoveryTest, EvictionsAndDropsSurviveRestart) {
  uint64_t ns = Attach("churn", false, 16);
  Put(ns, 1, 8);
  Put(ns, 2, 8);
  // Evicts chain 1's tail (least recent) for chain 3.
  Put(ns, 3, 4);
  v1::DropRequest drop;
  drop.set_namespace_("churn");
  drop.set_hash(Packed(2, 1, 5));
  v1::DropResponse dropped;
  ASSERT_TRUE(core_->Drop(drop, &dropped).ok());
  const uint32_t m1 = Lookup(ns, Packed(1, 8)).matched_pages();
  const uint32_t m2 = Lookup(ns, Packed(2, 8)).matched_pages();
  EXPECT_EQ(m1, 4u);
  EXPECT_EQ(m2, 5u);
  Restart();
  ns = Attach("churn", false, 16);
  EXPECT_EQ(Lookup(ns, Packed(1, 8)).matched_pages(), m1);
  EXPECT_EQ(Lookup(ns, Packed(2, 8)).matched_pages(), m2);
  EXPECT_EQ(Lookup(ns, Packed(3, 4)).matched_pages(), 4u);
  ExpectVerified();
}

TEST_F(TierCoreRecoveryTest, RecreatedSegmentEmptiesItsNamespaceOnly) {
  uint64_t a = Attach("kept");
  uint64_t b = Attach("lost");
  Put(a, 1, 5);
  Put(b, 1, 5);
  core_.reset();
  // While the daemon is down, one bank of "lost" disappears.
  ASSERT_TRUE(std::filesystem::remove(dir_ + "/kvtier.lost.kv.r0"));
  TierCore::RecoveryReport report = Start();
  EXPECT_EQ(report.namespaces, 2u);
  EXPECT_EQ(report.namespaces_emptied, 1u);
  a = Attach("kept");
  b = Attach("lost");
  EXPECT_EQ(Lookup(a, Packed(1, 5)).matched_pages(), 5u);
  EXPECT_EQ(Lookup(b, Packed(1, 5)).matched_pages(), 0u);
  // Nothing of it is served, but the engine that lived through the restart
  // had its mapping remapped onto the new bank: the journaled rows stay
  // fenced until it reports, lest its late copies reach another's rows.
  EXPECT_EQ(Bank("lost", "kv").fenced_rows(), 5u);
  EXPECT_EQ(Bank("lost", "kv").free_rows(), 59u);
  ExpectVerified();
  ReportNothingHeld();
  EXPECT_EQ(Bank("lost", "kv").free_rows(), 64u);
  ExpectVerified();
  // The emptied namespace journals anew: its next commits survive.
  Put(b, 2, 3);
  Restart();
  b = Attach("lost");
  EXPECT_EQ(Lookup(b, Packed(2, 3)).matched_pages(), 3u);
  EXPECT_EQ(Lookup(b, Packed(1, 5)).matched_pages(), 0u);
}

TEST_F(TierCoreRecoveryTest, SegmentReplacedUnderTheSameNameIsNotVouchedFor) {
  uint64_t ns = Attach("swapped");
  Put(ns, 1, 5);
  core_.reset();
  // Another creator made a new segment of the same shape under the name.
  const std::string path = dir_ + "/kvtier.swapped.kv.r0";
  auto old = shm::Segment::Open(path);
  ASSERT_TRUE(old.ok()) << old.status();
  shm::SegmentSpec spec;
  spec.file_name = "kvtier.swapped.kv.r0";
  spec.namespace_name = "swapped";
  spec.bank = "kv";
  spec.rows = old->rows();
  spec.row_bytes = old->row_bytes();
  std::memcpy(spec.layout_fingerprint.data(), old->header().layout_fingerprint,
              32);
  ASSERT_TRUE(std::filesystem::remove(path));
  shm::SegmentOptions so;
  so.shm_dir = dir_;
  so.huge_pages = shm::HugePagePolicy::kOff;
  auto fresh = shm::Segment::Create(spec, so);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ASSERT_NE(fresh->header().created_unix_ns, old->header().created_unix_ns);
  TierCore::RecoveryReport report = Start();
  EXPECT_EQ(report.namespaces_emptied, 1u);
  ns = Attach("swapped");
  EXPECT_EQ(Lookup(ns, Packed(1, 5)).matched_pages(), 0u);
}

TEST_F(TierCoreRecoveryTest, TornJournalTailKeepsWhatPrecedesIt) {
  uint64_t ns = Attach("torn");
  Put(ns, 1, 6);
  const std::string path = JournalPath(options_.state_dir, "torn");
  const uint64_t whole = std::filesystem::file_size(path);
  Put(ns, 2, 6);
  core_.reset();
  // A record cut short by the crash (write(2) interrupted by power loss).
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 7);
  TierCore::RecoveryReport report = Start();
  EXPECT_EQ(report.journals_torn, 1u);
  ns = Attach("torn");
  EXPECT_EQ(Lookup(ns, Packed(1, 6)).matched_pages(), 6u);
  EXPECT_EQ(Lookup(ns, Packed(2, 6)).matched_pages(), 0u);
  ExpectVerified();
  // The rewritten journal has no torn tail left.
  auto read = ReadJournal(path);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(read->stopped, "");
  EXPECT_FALSE(read->corrupt);
  EXPECT_GT(whole, 0u);
}

TEST_F(TierCoreRecoveryTest, DroppedNamespaceLeavesNoJournal) {
  Attach("gone");
  const std::string path = JournalPath(options_.state_dir, "gone");
  EXPECT_TRUE(std::filesystem::exists(path));
  v1::DropRequest drop;
  drop.set_namespace_("gone");
  drop.set_force(true);
  v1::DropResponse resp;
  ASSERT_TRUE(core_->Drop(drop, &resp).ok());
  EXPECT_FALSE(std::filesystem::exists(path));
  TierCore::RecoveryReport report = Restart();
  EXPECT_EQ(report.namespaces, 0u);
}

TEST_F(TierCoreRecoveryTest, SecondDaemonOnTheSameStateDirIsRefused) {
  TierCore other(options_);
  auto report = other.Recover();
  EXPECT_EQ(report.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(report.status().message()), HasSubstr("locked"));
}

TEST_F(TierCoreRecoveryTest, UnreadableJournalIsKeptNotFatal) {
  Attach("fine");
  core_.reset();
  { std::ofstream(JournalPath(options_.state_dir, "junk")) << "garbage"; }
  TierCore::RecoveryReport report = Start();
  EXPECT_EQ(report.journals_unreadable, 1u);
  EXPECT_EQ(report.namespaces_unrecoverable, 1u);
  EXPECT_EQ(report.namespaces, 1u);
  // Kept, reported, refused, until an operator drops it.
  EXPECT_TRUE(std::filesystem::exists(JournalPath(options_.state_dir, "junk")));
  ExpectUnrecoverable("junk", /*corrupt=*/true);
  ExpectDroppable("junk");
}

// What recovery kept is an operator's to delete: an engine's plain drop is
// refused and changes nothing; an explicit force deletes it.
TEST_F(TierCoreRecoveryTest, AnEngineDropsAnUnrecoverableOneOnlyWithForce) {
  Attach("kept");
  core_.reset();
  { std::ofstream(JournalPath(options_.state_dir, "kept")) << "garbage"; }
  Start();
  const Caller engine{.operator_socket = false, .session_id = session_};
  v1::DropRequest drop;
  drop.set_namespace_("kept");
  v1::DropResponse resp;
  absl::Status s = core_->Drop(drop, &resp, engine);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("force"));
  EXPECT_TRUE(std::filesystem::exists(SegmentPath("kept")));
  ExpectUnrecoverable("kept", /*corrupt=*/true);
  drop.set_force(true);
  s = core_->Drop(drop, &resp, engine);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_FALSE(std::filesystem::exists(SegmentPath("kept")));
  EXPECT_FALSE(
      std::filesystem::exists(JournalPath(options_.state_dir, "kept")));
}

// Dropping an unrecoverable namespace whose journal is unreadable finds
// its segments by name, and never another namespace's ("a" is not "a.b").
TEST_F(TierCoreRecoveryTest, DroppingAnUnreadableOneSparesItsNamesakes) {
  Attach("a");
  uint64_t ab = Attach("a.b");
  Put(ab, 1, 4);
  core_.reset();
  { std::ofstream(JournalPath(options_.state_dir, "a")) << "garbage"; }
  Start();
  ExpectUnrecoverable("a", /*corrupt=*/true);
  ExpectDroppable("a");
  EXPECT_FALSE(std::filesystem::exists(SegmentPath("a")));
  EXPECT_TRUE(std::filesystem::exists(SegmentPath("a.b")));
  ab = Attach("a.b");
  ReportNothingHeld();
  EXPECT_EQ(Lookup(ab, Packed(1, 4)).matched_pages(), 4u);
}

// A checksum failure before the journal's end: nothing of the namespace is
// served (no replay that skips the bad record), its journal and segments
// stay, Attach is refused naming why, and Drop ends it.
TEST_F(TierCoreRecoveryTest, CorruptJournalIsKeptAndNeverServed) {
  uint64_t ns = Attach("bad");
  for (uint64_t chain = 1; chain <= 4; ++chain) Put(ns, chain, 4);
  core_.reset();
  const std::string path = JournalPath(options_.state_dir, "bad");
  const uint64_t size = std::filesystem::file_size(path);
  const std::string segment = SegmentPath("bad");
  ASSERT_TRUE(std::filesystem::exists(segment));
  FlipByte(path, size / 3);
  TierCore::RecoveryReport report = Start();
  EXPECT_EQ(report.journals_corrupt, 1u);
  EXPECT_EQ(report.namespaces_unrecoverable, 1u);
  EXPECT_EQ(report.namespaces, 0u);
  EXPECT_EQ(std::filesystem::file_size(path), size) << "journal rewritten";
  EXPECT_TRUE(std::filesystem::exists(segment));
  ExpectUnrecoverable("bad", /*corrupt=*/true);
  // A corrupt journal is not retried: only the operator ends it.
  EXPECT_EQ(core_->RetryUnrecoverable(), 0u);
  ExpectDroppable("bad");
  EXPECT_FALSE(std::filesystem::exists(segment));
  ns = Attach("bad");
  EXPECT_EQ(Lookup(ns, Packed(1, 4)).matched_pages(), 0u);
}

TEST_F(TierCoreRecoveryTest, CorruptJournalComesBackEmptyByConfiguration) {
  uint64_t ns = Attach("bad");
  Put(ns, 1, 4);
  Put(ns, 2, 4);
  Put(ns, 3, 4);
  core_.reset();
  const std::string path = JournalPath(options_.state_dir, "bad");
  FlipByte(path, std::filesystem::file_size(path) / 3);
  options_.corrupt_journal_empty = true;
  TierCore::RecoveryReport report = Start();
  EXPECT_EQ(report.namespaces_unrecoverable, 0u);
  EXPECT_EQ(report.namespaces_emptied, 1u);
  ns = Attach("bad");
  for (uint64_t chain = 1; chain <= 3; ++chain) {
    EXPECT_EQ(Lookup(ns, Packed(chain, 4)).matched_pages(), 0u);
  }
  ExpectVerified();
}

// Banks that cannot be reopened (here a lowered budget) keep their journal
// and segments; with the budget back, every acknowledged commit returns.
TEST_F(TierCoreRecoveryTest, UnreopenableNamespaceKeepsItsJournalAndSegments) {
  uint64_t ns = Attach("big", false, 256);
  Put(ns, 1, 8);
  core_.reset();
  const std::string path = JournalPath(options_.state_dir, "big");
  const TierOptions saved = options_;
  options_.namespace_budget_bytes = 4096;
  TierCore::RecoveryReport report = Start();
  EXPECT_EQ(report.namespaces_unrecoverable, 1u);
  EXPECT_EQ(report.journals_corrupt, 0u);
  EXPECT_TRUE(std::filesystem::exists(path));
  EXPECT_TRUE(std::filesystem::exists(SegmentPath("big")));
  ExpectUnrecoverable("big", /*corrupt=*/false);
  EXPECT_EQ(core_->RetryUnrecoverable(), 0u);  // Still too big.
  options_ = saved;
  report = Restart();
  EXPECT_EQ(report.namespaces_unrecoverable, 0u);
  ns = Attach("big", false, 256);
  EXPECT_EQ(Lookup(ns, Packed(1, 8)).matched_pages(), 8u);
  ExpectVerified();
}

// Recovery time for many pages: commits of 4096 pages until N pages, a
// restart replaying the commit records, then one from the checkpoint that
// recovery wrote. Prints the figures (no timing is asserted).
TEST_F(TierCoreRecoveryTest, RecoveryTimeForManyPages) {
  const char* env = getenv("KVTIER_RECOVERY_PAGES");
  const uint32_t pages = env != nullptr ? std::atoi(env) : 262144;
  constexpr uint32_t kPerCommit = 4096;
  uint64_t ns = Attach("big", false, pages);
  const absl::Time t0 = absl::Now();
  for (uint32_t chain = 0; chain < pages / kPerCommit; ++chain) {
    Put(ns, chain, kPerCommit);
    if (HasFatalFailure()) return;
  }
  const double commit_s = absl::ToDoubleSeconds(absl::Now() - t0);
  const uint64_t log_bytes =
      std::filesystem::file_size(JournalPath(options_.state_dir, "big"));
  TierCore::RecoveryReport from_log = Restart();
  EXPECT_EQ(from_log.pages, pages);
  TierCore::RecoveryReport from_checkpoint = Restart();
  EXPECT_EQ(from_checkpoint.pages, pages);
  ns = Attach("big", false, pages);
  EXPECT_EQ(Lookup(ns, Packed(7, kPerCommit)).matched_pages(), kPerCommit);
  std::printf(
      "%u pages: committed in %.3f s (%.0f pages/s, journal %.1f MiB); "
      "recovered from the log in %.3f s, from a checkpoint (%.1f MiB) in "
      "%.3f s\n",
      pages, commit_s, pages / commit_s, log_bytes / 1048576.0,
      absl::ToDoubleSeconds(from_log.elapsed),
      from_checkpoint.journal_bytes / 1048576.0,
      absl::ToDoubleSeconds(from_checkpoint.elapsed));
}

}  // namespace
}  // namespace kvtier::daemon
