// Mutation fuzzing of the DTR log parser and of the replay behind it
// (tests/support/fuzz_mutator.h): every mutated trace either parses, and then replays on the
// simulated backend at a few budgets, or is rejected with a one-line error naming the file; nothing
// throws past the parser, aborts or crashes, and no case takes 10 s. Seeds: examples/traces/*.log
// and
// ../shared/traces/dtr/*.log (prefixes of them for the replayed cases, to keep each case short,
// and the whole files for parse-only cases).
//
// REMAT_FUZZ_SCALE=F runs F times the default number of cases (a fraction under sanitizers);
// REMAT_FUZZ_ONLY=K runs case K alone and writes its input to the test's temporary directory.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "remat/dtr_trace.h"
#include "remat/graph.h"
#include "remat/replay.h"
#include "tests/support/fuzz_mutator.h"

namespace remat {
namespace {

namespace fs = std::filesystem;
using testing::case_seed;
using testing::CrashContext;
using testing::FuzzOptions;
using testing::Mutator;

constexpr double kCaseLimitSeconds = 10.0;

struct Seed {
  std::string name;
  std::string text;
};

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The first `lines` lines of a trace, extended to the end of the instruction under way (its
// MEMORY and ALIAS lines): a prefix of a valid trace is a valid trace.
std::string prefix(const std::string& text, int lines) {
  std::istringstream in(text);
  std::string out, line;
  for (int n = 0; std::getline(in, line); ++n) {
    if (n >= lines) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      const bool follower = j.is_object() && (j.value("INSTRUCTION", "") == "MEMORY" ||
                                              j.value("INSTRUCTION", "") == "ALIAS");
      if (!follower) break;
    }
    out += line + "\n";
  }
  return out;
}

std::vector<fs::path> logs_in(const fs::path& dir) {
  std::vector<fs::path> logs;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".log") logs.push_back(e.path());
  std::sort(logs.begin(), logs.end());
  return logs;
}

// Seeds for replayed cases (short) and for parse-only cases (whole files).
struct Seeds {
  std::vector<Seed> short_traces;
  std::vector<Seed> whole_traces;
};

const Seeds& all_seeds() {
  static const Seeds* seeds = [] {
    auto* s = new Seeds;
    for (const fs::path& p : logs_in(fs::path(REMAT_SOURCE_DIR) / "examples" / "traces"))
      s->short_traces.push_back({p.filename().string(), read_all(p)});
    for (const fs::path& p : logs_in(fs::path(REMAT_SHARED_DIR) / "traces" / "dtr")) {
      const std::string text = read_all(p);
      for (int lines : {250, 1000, 4000})
        s->short_traces.push_back(
            {absl::StrCat(p.filename().string(), "[:", lines, "]"), prefix(text, lines)});
      s->whole_traces.push_back({p.filename().string(), text});
    }
    return s;
  }();
  return *seeds;
}

// An error must be one line that names the trace ("fuzz.log:12: ..." or "fuzz.log: ...").
void expect_clean_error(const absl::Status& status, const std::string& where) {
  const std::string message(status.message());
  EXPECT_EQ(message.find('\n'), std::string::npos) << where << ": " << message;
  EXPECT_EQ(message.rfind("fuzz.log:", 0), 0u) << where << ": " << message;
}

// What a trace that parsed must allow: validation, a round trip through the writer, and the
// replays (unconstrained, recorded, and under budgets).
void check_parsed_trace(const DtrTrace& trace, bool replay_it, const std::string& where) {
  ASSERT_TRUE(validate_dtr_trace(trace).ok()) << where << ": " << validate_dtr_trace(trace);
  std::stringstream written;
  ASSERT_TRUE(write_dtr_trace(trace, written).ok()) << where;
  absl::StatusOr<DtrTrace> again = parse_dtr_trace(written, "written.log");
  ASSERT_TRUE(again.ok()) << where << ": " << again.status();
  EXPECT_EQ(again->instructions.size(), trace.instructions.size()) << where;
  EXPECT_EQ(again->total_time_ns, trace.total_time_ns) << where;
  if (!replay_it) return;

  const ReplayBaseline base = replay_baseline(trace);
  ReplayOptions o;
  o.policy = "dtr";
  o.slowdown_cap = 2.0;
  o.budget = base.logical_peak_bytes;
  const ReplayResult full = replay(trace, o);
  // At the unconstrained peak nothing has to be evicted: a trace that parses replays as is.
  EXPECT_EQ(full.status, "ok") << where << ": " << full.error;
  for (double fraction : {0.5, 0.2}) {
    o.budget = static_cast<std::size_t>(fraction * static_cast<double>(base.logical_peak_bytes));
    const ReplayResult r = replay(trace, o);
    EXPECT_TRUE(r.status == "ok" || r.status == "oom" || r.status == "thrash") << where;
    EXPECT_LE(r.peak_allocated_bytes, o.budget) << where << " at " << fraction;
  }
  o.accounting = Accounting::kAllocator;
  o.budget = base.reserved_peak_bytes / 2;
  const ReplayResult alloc = replay(trace, o);
  EXPECT_LE(alloc.peak_reserved_bytes, o.budget) << where;

  const RecordedStep step = record_replay(trace);
  EXPECT_TRUE(validate_graph(step.graph).ok()) << where << ": " << validate_graph(step.graph);
  EXPECT_TRUE(validate_dtr_trace(step.trace).ok())
      << where << ": " << validate_dtr_trace(step.trace);
}

// The [begin, end) of the line holding offset `at`, its newline included.
std::pair<std::size_t, std::size_t> line_around(const std::string& t, std::size_t at) {
  const std::size_t nl = at == 0 ? std::string::npos : t.rfind('\n', at - 1);
  const std::size_t b = nl == std::string::npos ? 0 : nl + 1;
  const std::size_t e = t.find('\n', at);
  return {b, e == std::string::npos ? t.size() : e + 1};
}

// Mutations in the trace's own terms, which reach the replay (or its semantic checks) more
// often than the generic ones: sizes and times set to edge values (0, 1, a few digits, up to
// and past the limits); a RELEASE dropped (its handle becomes an output of the step) or moved
// a few lines up (before a use, often); a RELEASE or COPY line doubled.
std::string mutate_trace_values(std::string t, Mutator& m, std::string* log) {
  const int n = 1 + static_cast<int>(m.below(4));
  for (int k = 0; k < n; ++k) {
    if (m.one_in(5)) {
      const char* word = m.one_in(4) ? "\"COPY\"" : "\"RELEASE\"";
      std::vector<std::size_t> found;
      for (std::size_t at = t.find(word); at != std::string::npos; at = t.find(word, at + 1))
        found.push_back(at);
      if (found.empty()) continue;
      const auto [b, e] = line_around(t, found[m.below(found.size())]);
      const std::string line = t.substr(b, e - b);
      switch (m.below(3)) {
        case 0:
          t.erase(b, e - b);
          absl::StrAppend(log, log->empty() ? "" : "; ", "drop ", word, " line @", b);
          break;
        case 1: {
          t.erase(b, e - b);
          std::size_t to = b;
          for (std::uint64_t up = 1 + m.below(20); up > 0 && to > 0; --up)
            to = line_around(t, to - 1).first;
          t.insert(to, line);
          absl::StrAppend(log, log->empty() ? "" : "; ", "move ", word, " line @", b, " to @", to);
          break;
        }
        default:
          t.insert(e, line);
          absl::StrAppend(log, log->empty() ? "" : "; ", "double ", word, " line @", b);
      }
      continue;
    }
    // A MEMORY or TIME value, which the format writes as a string of digits.
    std::vector<std::pair<std::size_t, std::size_t>> values;
    for (const char* key : {"\"MEMORY\":\"", "\"MEMORY\": \"", "\"TIME\":\"", "\"TIME\": \""}) {
      const std::size_t len = std::strlen(key);
      for (std::size_t at = t.find(key); at != std::string::npos; at = t.find(key, at + 1)) {
        const std::size_t e = t.find('"', at + len);
        if (e != std::string::npos) values.emplace_back(at + len, e);
      }
    }
    if (values.empty()) continue;
    auto [b, e] = values[m.below(values.size())];
    std::string v;
    switch (m.below(5)) {
      case 0:
        v = "0";
        break;
      case 1:
        v = std::to_string(m.below(1000));
        break;
      case 2:
        v = std::to_string(m.below(std::uint64_t{1} << 40));
        break;
      case 3:
        v = std::to_string((std::uint64_t{1} << 62) >> m.below(8));
        break;
      default:
        v = m.edge_number();
    }
    t.replace(b, e - b, v);
    absl::StrAppend(log, log->empty() ? "" : "; ", "value @", b, " -> ", v);
  }
  return t;
}

struct Tally {
  int parsed = 0;
  int rejected = 0;
  double slowest = 0;
};

// Runs case `index`: `mutations` at most on `seed`, then the parser, and for a trace that
// parses check_parsed_trace.
void run_case(const Seed& seed, std::uint64_t base, int index, bool replay_it, int mutations,
              const FuzzOptions& opt, Tally& tally) {
  Mutator m(case_seed(base, static_cast<std::uint64_t>(index)));
  std::string log;
  const std::string input =
      m.one_in(2) ? m.mutate(seed.text, &log, mutations) : mutate_trace_values(seed.text, m, &log);
  const std::string where = absl::StrCat("case ", index, " (", seed.name, ": ", log, ")");
  CrashContext::set(where);
  if (opt.only) {
    const fs::path out = fs::path(::testing::TempDir()) / absl::StrCat("dtr_fuzz_", index, ".log");
    std::ofstream(out, std::ios::binary) << input;
    std::cerr << where << "\n  input written to " << out << "\n";
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    std::istringstream in(input);
    absl::StatusOr<DtrTrace> trace = parse_dtr_trace(in, "fuzz.log");
    if (trace.ok()) {
      ++tally.parsed;
      check_parsed_trace(*trace, replay_it, where);
    } else {
      ++tally.rejected;
      expect_clean_error(trace.status(), where);
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << where << ": threw " << e.what();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  tally.slowest = std::max(tally.slowest, seconds);
  EXPECT_LT(seconds, kCaseLimitSeconds) << where;
}

TEST(DtrTraceFuzz, ShortTracesParseOrFailCleanlyAndReplay) {
  const Seeds& seeds = all_seeds();
  ASSERT_FALSE(seeds.short_traces.empty()) << "no examples/traces/*.log";
  const FuzzOptions opt = FuzzOptions::from_env(5000);
  Tally tally;
  for (int i = 0; i < opt.end(); ++i) {
    if (!opt.runs(i)) continue;
    const Seed& seed = seeds.short_traces[static_cast<std::size_t>(i) % seeds.short_traces.size()];
    run_case(seed, /*base=*/0x5eed0001, i, /*replay_it=*/true, /*mutations=*/3, opt, tally);
    if (::testing::Test::HasFailure() && !opt.only) break;  // the first failure is the one to read
  }
  std::cout << tally.parsed << " mutated traces parsed and replayed, " << tally.rejected
            << " rejected; slowest case " << tally.slowest << " s\n";
}

// The whole shared traces, parsed only: a replay of one takes seconds.
TEST(DtrTraceFuzz, WholeTracesParseOrFailCleanly) {
  const Seeds& seeds = all_seeds();
  if (seeds.whole_traces.empty()) GTEST_SKIP() << "no ../shared/traces/dtr";
  const FuzzOptions opt = FuzzOptions::from_env(40);
  Tally tally;
  for (int i = 0; i < opt.end(); ++i) {
    if (!opt.runs(i)) continue;
    const Seed& seed = seeds.whole_traces[static_cast<std::size_t>(i) % seeds.whole_traces.size()];
    run_case(seed, /*base=*/0x5eed0002, i, /*replay_it=*/false, /*mutations=*/2, opt, tally);
    if (::testing::Test::HasFailure() && !opt.only) break;
  }
  std::cout << tally.parsed << " mutated traces parsed, " << tally.rejected
            << " rejected; slowest case " << tally.slowest << " s\n";
}

}  // namespace
}  // namespace remat
