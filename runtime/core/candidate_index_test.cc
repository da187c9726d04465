#include "runtime/core/candidate_index.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <vector>

namespace remat::detail {
namespace {

// Note [Candidate index]: whatever lower bounds the stored keys are (exact keys, floors given
// on entry, keys that grew since), best() returns a candidate of the lowest true score, as a
// scan of every candidate would.
TEST(CandidateIndexTest, BestIsTheTrueMinimumWhateverTheStoredLowerBounds) {
  std::mt19937_64 rng(17);
  for (double exponent : {0.0, 0.5, 1.0, 2.0}) {
    for (bool floors : {false, true}) {
      std::vector<double> truth(400, 0.0);
      auto key = [&](Id s) { return truth[s]; };
      auto floor = [&](Id s) { return truth[s] * 0.25; };  // a loose lower bound
      CandidateIndex index(key, exponent, floors ? std::function<double(Id)>(floor) : nullptr);
      std::map<Id, std::pair<Id, double>> live;  // storage -> (position, last access)
      std::map<Id, Id> moved;
      index.on_move = [&](Id s, Id position) { moved[s] = position; };
      double now = 0;
      int checks = 0;
      for (int op = 0; op < 3000; ++op) {
        now += 1.0;
        moved.clear();
        const Id s = static_cast<Id>(rng() % truth.size());
        const unsigned r = static_cast<unsigned>(rng() % 10);
        if (!live.count(s) && r < 5) {
          truth[s] = 1.0 + static_cast<double>(rng() % 1000);
          live[s] = {index.insert(s, now), now};
        } else if (live.count(s) && r < 7) {
          index.erase(live[s].first);
          live.erase(s);
        } else if (live.count(s)) {
          truth[s] += static_cast<double>(rng() % 50);  // keys grow as neighbours go
          if (r == 9) index.lower(live[s].first);
        }
        for (auto& [storage, position] : moved)
          if (live.count(storage)) live[storage].first = position;
        if (live.empty() || op % 7 != 0) continue;
        double want = INFINITY;
        for (const auto& [storage, entry] : live) {
          const double staleness = now - entry.second + 1.0;
          want = std::min(want, truth[storage] / std::pow(staleness, exponent));
        }
        const Id got = index.best(now);
        ASSERT_TRUE(live.count(got));
        const double staleness = now - live[got].second + 1.0;
        EXPECT_NEAR(truth[got] / std::pow(staleness, exponent), want, 1e-9 * want)
            << "exponent " << exponent << (floors ? " with floors" : "");
        ++checks;
      }
      EXPECT_GT(checks, 300);
    }
  }
}

// The window search weighs blocks through with_pricing, whose view fixes the exponent at
// compile time. It must give the stored score, a lower bound of the true one (the floor
// stored on entry, a key that grew since), for every exponent, including those with no
// special case; and a refreshed candidate's stored score is its true score.
TEST(CandidateIndexTest, PricingGivesTheStoredLowerBound) {
  std::mt19937_64 rng(23);
  for (double exponent : {0.0, 0.5, 1.0, 2.0, 0.3}) {
    std::vector<double> truth(64);
    for (double& t : truth) t = 1.0 + static_cast<double>(rng() % 1000);
    auto key = [&](Id s) { return truth[s]; };
    auto floor = [&](Id s) { return truth[s] * 0.5; };
    CandidateIndex index(key, exponent, floor);
    std::vector<Id> positions;
    for (Id s = 0; s < truth.size(); ++s) positions.push_back(index.insert(s, s));
    const double now = 100;
    auto true_score = [&](Id s) { return truth[s] / std::pow(now - s + 1.0, exponent); };
    auto priced = [&] {
      std::vector<double> out;
      index.with_pricing(now, [&](auto score) {
        for (Id p : positions) out.push_back(score(p));
      });
      return out;
    };
    std::vector<double> got = priced();
    for (Id s = 0; s < truth.size(); ++s) {
      EXPECT_EQ(got[s], index.stored_score(positions[s], now)) << "exponent " << exponent;
      EXPECT_NEAR(got[s], 0.5 * true_score(s), 1e-12 * true_score(s)) << "the floor";
    }
    for (Id s = 0; s < truth.size(); s += 3) {
      truth[s] += 7;  // a key that grew: still a lower bound until refreshed
      if (s % 2 == 0) index.refresh(positions[s]);
    }
    got = priced();
    for (Id s = 0; s < truth.size(); ++s) {
      EXPECT_EQ(got[s], index.stored_score(positions[s], now)) << "exponent " << exponent;
      EXPECT_LE(got[s], true_score(s) * (1 + 1e-12));
      if (s % 6 == 0) {
        EXPECT_NEAR(got[s], true_score(s), 1e-12 * true_score(s)) << "refreshed";
      }
    }
  }
}

}  // namespace
}  // namespace remat::detail
