// kvtier_load_client: one engine-like process of the load test
// (tests/load_test.cc). For SECONDS it issues a random mix of the tier's
// operations against namespace NS:
//
//   - lookups, pinned and not; a pinned hit's bytes are checked against the
//     pattern its writer used (any difference is a wrong page served);
//   - the engine's evict flow: pinned lookup, Reserve of the missing tail,
//     fill, Commit below the matched parent, Release;
//   - reservations aborted at once, or held across other operations and
//     then committed or aborted;
//   - leases held across other operations and released explicitly, or by
//     the Lease destructor;
//   - now and then the whole client is dropped and reconnected (the
//     daemon closes the session and must return its pins and rows).
//
// The working set is PREFIXES prompts of PAGES pages; prompts share their
// first kSharedPages pages in groups, so the index is a tree. Each page's
// bytes depend only on the page's identity, so every writer of a page
// writes the same bytes and any reader can check them.
//
// Usage: kvtier_load_client SOCKET NS SECONDS SEED PREFIXES PAGES ROWS
// Prints one line "OPS k=v ..." and exits 0; exits 1 on a wrong byte or an
// unexpected error (printed to stderr).
//
// Thread-safety: single-threaded program.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "tests/test_pattern.h"

namespace {

constexpr uint32_t kSharedPages = 4;
constexpr uint32_t kGroups = 16;

struct Counters {
  uint64_t ops = 0, lookups = 0, pinned_lookups = 0, hit_pages = 0;
  uint64_t reserves = 0, commits = 0, committed_pages = 0, dedup_pages = 0;
  uint64_t aborts = 0, releases = 0, exhausted = 0, reconnects = 0;
  uint64_t checked_pages = 0, wrong_pages = 0, unexpected = 0;
};

class Load {
 public:
  Load(std::string socket, std::string ns, uint64_t seed, uint32_t prefixes,
       uint32_t pages, uint64_t rows)
      : socket_(std::move(socket)),
        ns_name_(std::move(ns)),
        rng_(seed),
        prefixes_(prefixes),
        pages_(pages),
        rows_(rows) {}

  bool Connect() {
    ns_.reset();
    client_.reset();
    auto client = kvtier::client::Client::Connect(
        {.socket = socket_, .client_name = "load"});
    if (!client.ok()) return Unexpected("connect", client.status());
    client_ = *std::move(client);
    kvtier::client::AttachOptions o =
        kvtier::testing::TestAttachOptions(ns_name_);
    o.capacity.page_rows = rows_;
    auto ns = client_->Attach(o);
    if (!ns.ok()) return Unexpected("attach", ns.status());
    ns_ = *std::move(ns);
    if (chains_.empty()) {
      for (uint32_t p = 0; p < prefixes_; ++p) {
        std::vector<int32_t> tokens;
        for (uint32_t i = 0; i < pages_; ++i) {
          const auto page = kvtier::testing::TestTokens(PageSeed(p, i), 16);
          tokens.insert(tokens.end(), page.begin(), page.end());
        }
        chains_.push_back(ns_->hasher().HashChain(tokens));
      }
    }
    return true;
  }

  bool Run(absl::Duration duration) {
    const absl::Time end = absl::Now() + duration;
    while (absl::Now() < end) {
      ++c_.ops;
      const uint32_t r = Uniform(1000);
      bool ok = true;
      if (r < 350) {
        ok = LookupOnce(/*pin=*/Uniform(2) == 0, /*keep=*/Uniform(3) == 0);
      } else if (r < 600) {
        ok = Evict();
      } else if (r < 700) {
        ok = ReserveAndAbort();
      } else if (r < 800) {
        ok = HoldReservation();
      } else if (r < 900) {
        ok = FinishHeldReservation();
      } else if (r < 998) {
        ok = ReleaseHeldLease();
      } else {
        ++c_.reconnects;
        leases_.clear();
        reservations_.clear();
        ok = Connect();
      }
      if (!ok || c_.wrong_pages > 0) return false;
    }
    leases_.clear();
    reservations_.clear();
    return true;
  }

  const Counters& counters() const { return c_; }

 private:
  // Identity of page `i` of prompt `p`: shared within a group at first.
  static uint64_t PageSeed(uint32_t p, uint32_t i) {
    return i < kSharedPages ? (uint64_t{1} << 32) + p % kGroups : 1000 + p;
  }
  uint32_t Uniform(uint32_t n) {
    return std::uniform_int_distribution<uint32_t>(0, n - 1)(rng_);
  }
  std::string Hash(uint32_t p, uint32_t i) const {
    const uint32_t hb = ns_->hasher().hash_bytes();
    return chains_[p].substr(size_t{i} * hb, hb);
  }

  bool Unexpected(const char* what, const absl::Status& s) {
    ++c_.unexpected;
    std::fprintf(stderr, "kvtier_load_client: %s: %s\n", what,
                 s.ToString().c_str());
    return false;
  }
  // RESOURCE_EXHAUSTED (every row pinned or reserved by someone) is the
  // expected answer of a full bank; anything else is not.
  bool Expected(const char* what, const absl::Status& s) {
    if (s.code() == absl::StatusCode::kResourceExhausted) {
      ++c_.exhausted;
      return true;
    }
    return Unexpected(what, s);
  }

  void Check(uint32_t p, const kvtier::client::Lease& lease) {
    for (uint32_t i = 0; i < lease.usable_pages(); ++i) {
      ++c_.checked_pages;
      for (size_t b = 0; b < ns_->page_banks().size(); ++b) {
        const auto& bank = ns_->page_banks()[b];
        if (!kvtier::testing::CheckPattern(
                bank.base + uint64_t{lease.rows()[i]} * bank.row_stride,
                bank.row_bytes, PageSeed(p, i), i, b)) {
          ++c_.wrong_pages;
          std::fprintf(stderr,
                       "kvtier_load_client: WRONG page %u of prompt %u (row "
                       "%u, bank %s)\n",
                       i, p, lease.rows()[i], bank.name.c_str());
          return;
        }
      }
    }
  }

  absl::StatusOr<kvtier::client::Lease> Lookup(uint32_t p, bool pin) {
    ++c_.lookups;
    if (pin) ++c_.pinned_lookups;
    auto lease = ns_->Lookup(chains_[p], pin);
    if (lease.ok()) {
      c_.hit_pages += lease->usable_pages();
      if (lease->pinned()) Check(p, *lease);
    }
    return lease;
  }

  bool LookupOnce(bool pin, bool keep) {
    const uint32_t p = Uniform(prefixes_);
    auto lease = Lookup(p, pin);
    if (!lease.ok()) return Unexpected("lookup", lease.status());
    if (keep && lease->pinned() && leases_.size() < 4) {
      leases_.push_back(*std::move(lease));
    }
    return true;  // Otherwise the destructor releases the pin.
  }

  bool ReleaseHeldLease() {
    if (leases_.empty()) return LookupOnce(true, true);
    const size_t i = Uniform(static_cast<uint32_t>(leases_.size()));
    absl::Status s = leases_[i].Release();
    leases_.erase(leases_.begin() + static_cast<long>(i));
    ++c_.releases;
    return s.ok() || Unexpected("release", s);
  }

  void Fill(const kvtier::client::Reservation& res, uint32_t p,
            uint32_t first) {
    for (uint32_t k = 0; k < res.page_rows().size(); ++k) {
      for (size_t b = 0; b < ns_->page_banks().size(); ++b) {
        const auto& bank = ns_->page_banks()[b];
        kvtier::testing::FillPattern(
            bank.base + uint64_t{res.page_rows()[k]} * bank.row_stride,
            bank.row_bytes, PageSeed(p, first + k), first + k, b);
      }
    }
  }

  // The engine's evict flow for pages [m, m+n) of prompt p, m = what the
  // tier has: the pinned match keeps the parent in the index meanwhile.
  bool Evict() {
    const uint32_t p = Uniform(prefixes_);
    auto lease = Lookup(p, /*pin=*/true);
    if (!lease.ok()) return Unexpected("lookup", lease.status());
    const uint32_t m = lease->matched_pages();
    if (m >= pages_) return true;
    const uint32_t n = 1 + Uniform(pages_ - m);
    ++c_.reserves;
    auto res = ns_->Reserve(n);
    if (!res.ok()) return Expected("reserve", res.status());
    Fill(*res, p, m);
    const uint32_t hb = ns_->hasher().hash_bytes();
    auto done = res->Commit(m == 0 ? "" : Hash(p, m - 1),
                            chains_[p].substr(size_t{m} * hb, size_t{n} * hb));
    if (!done.ok()) return Unexpected("commit", done.status());
    ++c_.commits;
    c_.committed_pages += done->committed_pages;
    c_.dedup_pages += done->deduplicated_pages;
    return true;
  }

  bool ReserveAndAbort() {
    ++c_.reserves;
    auto res = ns_->Reserve(1 + Uniform(pages_));
    if (!res.ok()) return Expected("reserve", res.status());
    ++c_.aborts;
    absl::Status s = res->Abort();
    return s.ok() || Unexpected("abort", s);
  }

  // Reserves the first pages of a prompt and keeps the reservation open
  // across other operations (up to two at once).
  bool HoldReservation() {
    if (reservations_.size() >= 2) return FinishHeldReservation();
    const uint32_t p = Uniform(prefixes_);
    ++c_.reserves;
    auto res = ns_->Reserve(1 + Uniform(kSharedPages));
    if (!res.ok()) return Expected("reserve", res.status());
    Fill(*res, p, 0);
    reservations_.push_back({p, *std::move(res)});
    return true;
  }

  bool FinishHeldReservation() {
    if (reservations_.empty()) return HoldReservation();
    auto [p, res] = std::move(reservations_.back());
    reservations_.pop_back();
    if (Uniform(2) == 0) {
      ++c_.aborts;
      absl::Status s = res.Abort();
      return s.ok() || Unexpected("abort", s);
    }
    const uint32_t hb = ns_->hasher().hash_bytes();
    auto done =
        res.Commit("", chains_[p].substr(0, res.page_rows().size() * hb));
    if (!done.ok()) return Unexpected("commit held", done.status());
    ++c_.commits;
    c_.committed_pages += done->committed_pages;
    c_.dedup_pages += done->deduplicated_pages;
    return true;
  }

  const std::string socket_;
  const std::string ns_name_;
  std::mt19937_64 rng_;
  const uint32_t prefixes_, pages_;
  const uint64_t rows_;
  std::unique_ptr<kvtier::client::Client> client_;
  std::unique_ptr<kvtier::client::Namespace> ns_;
  std::vector<std::string> chains_;
  std::vector<kvtier::client::Lease> leases_;
  std::vector<std::pair<uint32_t, kvtier::client::Reservation>> reservations_;
  Counters c_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr,
                 "usage: %s SOCKET NS SECONDS SEED PREFIXES PAGES ROWS\n",
                 argv[0]);
    return 2;
  }
  Load load(argv[1], argv[2], std::strtoull(argv[4], nullptr, 10),
            static_cast<uint32_t>(std::strtoul(argv[5], nullptr, 10)),
            static_cast<uint32_t>(std::strtoul(argv[6], nullptr, 10)),
            std::strtoull(argv[7], nullptr, 10));
  const bool ok =
      load.Connect() && load.Run(absl::Seconds(std::strtod(argv[3], nullptr)));
  const Counters& c = load.counters();
  std::printf(
      "OPS ops=%llu lookups=%llu pinned=%llu hit_pages=%llu reserves=%llu "
      "commits=%llu committed_pages=%llu dedup_pages=%llu aborts=%llu "
      "releases=%llu exhausted=%llu reconnects=%llu checked_pages=%llu "
      "wrong_pages=%llu unexpected=%llu\n",
      static_cast<unsigned long long>(c.ops),
      static_cast<unsigned long long>(c.lookups),
      static_cast<unsigned long long>(c.pinned_lookups),
      static_cast<unsigned long long>(c.hit_pages),
      static_cast<unsigned long long>(c.reserves),
      static_cast<unsigned long long>(c.commits),
      static_cast<unsigned long long>(c.committed_pages),
      static_cast<unsigned long long>(c.dedup_pages),
      static_cast<unsigned long long>(c.aborts),
      static_cast<unsigned long long>(c.releases),
      static_cast<unsigned long long>(c.exhausted),
      static_cast<unsigned long long>(c.reconnects),
      static_cast<unsigned long long>(c.checked_pages),
      static_cast<unsigned long long>(c.wrong_pages),
      static_cast<unsigned long long>(c.unexpected));
  std::fflush(stdout);
  return ok && c.wrong_pages == 0 && c.unexpected == 0 ? 0 : 1;
}
