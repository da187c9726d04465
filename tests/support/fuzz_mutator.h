// Deterministic mutation fuzzing for the file parsers' tests (runtime/ir/ir_fuzz_test.cc for
// graphs and schedules, runtime/trace/dtr_fuzz_test.cc for DTR logs and their replay).
//
//   remat::testing::Mutator m(remat::testing::case_seed(kSeed, i));
//   std::string log;
//   const std::string input = m.mutate(seed_text, &log);   // log: "flip digit @123; ..."
//
// Each case is a function of (seed text, case number) alone, so a failure names a case that
// runs again on its own (FuzzOptions::only). Cases are bounded in number rather than in time,
// so that every run tries the same inputs (REMAT_FUZZ_SCALE=0.1 runs the first tenth of them).
// Test-only: header-only, linked by no library.
#ifndef REMAT_TESTS_SUPPORT_FUZZ_MUTATOR_H_
#define REMAT_TESTS_SUPPORT_FUZZ_MUTATOR_H_

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace remat::testing {

// Numbers chosen to cross the limits the parsers check: past a double, past uint64 and int64,
// past kMaxTraceBytes (2^62), past int32 (ids), negative, fractional, and plain small ones.
inline constexpr std::array<const char*, 22> kEdgeNumbers = {"1e309",
                                                             "-1e309",
                                                             "1e308",
                                                             "18446744073709551615",
                                                             "18446744073709551616",
                                                             "9223372036854775807",
                                                             "9223372036854775808",
                                                             "-9223372036854775809",
                                                             "4611686018427387904",
                                                             "4611686018427387905",
                                                             "2147483647",
                                                             "2147483648",
                                                             "4294967296",
                                                             "99999999999999999999999",
                                                             "-1",
                                                             "-0",
                                                             "0",
                                                             "1",
                                                             "1.5",
                                                             "1e3",
                                                             "9.3e18",
                                                             "3"};

// The seed of case `index` of a fuzz test: cases do not depend on how many run before them.
inline std::uint64_t case_seed(std::uint64_t base, std::uint64_t index) {
  std::uint64_t z = base + 0x9e3779b97f4a7c15ULL * (index + 1);  // splitmix64
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// How many cases to run: `fallback` times REMAT_FUZZ_SCALE from the environment (default 1;
// sanitizer builds in CI run a fraction). REMAT_FUZZ_ONLY=N runs case N alone (see `only`).
struct FuzzOptions {
  int cases = 0;
  std::optional<int> only;

  static FuzzOptions from_env(int fallback) {
    FuzzOptions o;
    o.cases = fallback;
    if (const char* v = std::getenv("REMAT_FUZZ_SCALE"); v != nullptr) {
      double scale = 1;
      if (absl::SimpleAtod(v, &scale) && scale >= 0 && scale <= 1000)
        o.cases = static_cast<int>(std::ceil(scale * fallback));
    }
    if (const char* v = std::getenv("REMAT_FUZZ_ONLY"); v != nullptr) {
      int n = 0;
      if (absl::SimpleAtoi(v, &n) && n >= 0) o.only = n;
    }
    return o;
  }
  bool runs(int index) const { return only ? index == *only : index < cases; }
  int end() const { return only ? *only + 1 : cases; }
};

// Names the case that was running when the process died: a crash or an abort inside a parser
// is the failure the fuzz tests look for, and without this it would name no input.
class CrashContext {
 public:
  static void set(const std::string& what) {
    install();
    const std::size_t n = std::min(what.size(), sizeof(buffer_) - 2);
    std::memcpy(buffer_, what.data(), n);
    buffer_[n] = '\n';
    length_ = n + 1;
  }

 private:
  static void install() {
    static const bool installed = [] {
      for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) {
        struct sigaction sa = {};
        sa.sa_handler = &report;
        sa.sa_flags = SA_RESETHAND;  // the default action follows, after the report
        sigaction(sig, &sa, nullptr);
      }
      return true;
    }();
    (void)installed;
  }
  static void report(int sig) {
    static const char kPrefix[] = "\nfuzz case running when the process died: ";
    (void)!write(STDERR_FILENO, kPrefix, sizeof(kPrefix) - 1);
    (void)!write(STDERR_FILENO, buffer_, length_);
    raise(sig);
  }
  static inline char buffer_[512] = {};
  static inline volatile std::size_t length_ = 0;
};

// Mutates text the way a damaged or hand-edited file differs from a good one: digits flipped,
// numbers replaced by edge values or negated, quoted tokens swapped (handles, names), lines
// deleted, duplicated, swapped or moved, bytes changed, the file truncated.
class Mutator {
 public:
  explicit Mutator(std::uint64_t seed) : rng_(seed) {}

  std::uint64_t below(std::uint64_t n) { return n == 0 ? 0 : rng_() % n; }
  bool one_in(std::uint64_t n) { return below(n) == 0; }
  std::string edge_number() { return kEdgeNumbers[below(kEdgeNumbers.size())]; }

  // 1 to `max_mutations` mutations of `text`; `log` (if given) lists them.
  std::string mutate(std::string text, std::string* log, int max_mutations = 3) {
    const int n = 1 + static_cast<int>(below(static_cast<std::uint64_t>(max_mutations)));
    for (int i = 0; i < n; ++i) {
      std::string what = mutate_once(text);
      if (log != nullptr) absl::StrAppend(log, log->empty() ? "" : "; ", what);
    }
    return text;
  }

 private:
  // [begin, end) of every maximal run of digits.
  std::vector<std::pair<std::size_t, std::size_t>> digit_runs(const std::string& t) const {
    std::vector<std::pair<std::size_t, std::size_t>> runs;
    for (std::size_t i = 0; i < t.size();) {
      if (t[i] < '0' || t[i] > '9') {
        ++i;
        continue;
      }
      std::size_t j = i;
      while (j < t.size() && t[j] >= '0' && t[j] <= '9') ++j;
      runs.emplace_back(i, j);
      i = j;
    }
    return runs;
  }
  // [begin, end) of the contents of every "..." string (without escapes inside, as the
  // shared files have none).
  std::vector<std::pair<std::size_t, std::size_t>> string_spans(const std::string& t) const {
    std::vector<std::pair<std::size_t, std::size_t>> out;
    for (std::size_t i = 0; i < t.size(); ++i) {
      if (t[i] != '"') continue;
      const std::size_t j = t.find('"', i + 1);
      if (j == std::string::npos) break;
      out.emplace_back(i + 1, j);
      i = j;
    }
    return out;
  }
  // Start offsets of the lines.
  std::vector<std::size_t> lines(const std::string& t) const {
    std::vector<std::size_t> starts = {0};
    for (std::size_t i = 0; i + 1 < t.size(); ++i)
      if (t[i] == '\n') starts.push_back(i + 1);
    return starts;
  }
  std::string line(const std::string& t, const std::vector<std::size_t>& starts, std::size_t k) {
    const std::size_t end = k + 1 < starts.size() ? starts[k + 1] : t.size();
    std::string line = t.substr(starts[k], end - starts[k]);
    if (line.empty() || line.back() != '\n') line.push_back('\n');
    return line;
  }
  // Another index near `k` (most edits that break a file's meaning are local).
  std::size_t near(std::size_t k, std::size_t n) {
    const std::size_t span = one_in(4) ? n : 40;
    const std::size_t lo = k > span ? k - span : 0;
    const std::size_t hi = std::min(n, k + span + 1);
    return lo + below(hi - lo);
  }

  std::string mutate_once(std::string& t) {
    if (t.empty()) {
      t = edge_number();
      return "replace empty text with a number";
    }
    switch (below(12)) {
      case 0:
      case 1: {  // a digit flipped
        auto runs = digit_runs(t);
        if (runs.empty()) break;
        auto [b, e] = runs[below(runs.size())];
        const std::size_t at = b + below(e - b);
        t[at] = static_cast<char>('0' + below(10));
        return absl::StrCat("flip digit @", at);
      }
      case 2:
      case 3: {  // a number replaced by an edge value, sometimes unquoted
        auto runs = digit_runs(t);
        if (runs.empty()) break;
        auto [b, e] = runs[below(runs.size())];
        if (b > 0 && t[b - 1] == '-') --b;
        const std::string v = edge_number();
        if (b > 0 && e < t.size() && t[b - 1] == '"' && t[e] == '"' && one_in(2)) {
          t.replace(b - 1, e - b + 2, v);
          return absl::StrCat("number @", b, " -> bare ", v);
        }
        t.replace(b, e - b, v);
        return absl::StrCat("number @", b, " -> ", v);
      }
      case 4: {  // a number negated
        auto runs = digit_runs(t);
        if (runs.empty()) break;
        const std::size_t b = runs[below(runs.size())].first;
        t.insert(b, "-");
        return absl::StrCat("negate @", b);
      }
      case 5:
      case 6: {  // a quoted token replaced by another one nearby (a handle by another handle)
        auto strings = string_spans(t);
        if (strings.size() < 2) break;
        const std::size_t k = below(strings.size());
        const std::size_t j = near(k, strings.size());
        auto [b, e] = strings[k];
        auto [sb, se] = strings[j];
        const std::string other = t.substr(sb, se - sb);
        t.replace(b, e - b, other);
        return absl::StrCat("string @", b, " -> \"", other.substr(0, 40), "\"");
      }
      case 7:
      case 8: {  // a line deleted, duplicated, swapped with or moved near another
        auto starts = lines(t);
        if (starts.size() < 2) break;
        const std::size_t k = below(starts.size());
        const std::size_t j = near(k, starts.size());
        std::vector<std::string> lines;
        lines.reserve(starts.size());
        for (std::size_t i = 0; i < starts.size(); ++i) lines.push_back(line(t, starts, i));
        std::string what;
        switch (below(4)) {
          case 0:
            lines.erase(lines.begin() + static_cast<std::ptrdiff_t>(k));
            what = absl::StrCat("delete line ", k + 1);
            break;
          case 1:
            lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(j), lines[k]);
            what = absl::StrCat("copy line ", k + 1, " before line ", j + 1);
            break;
          case 2:
            std::swap(lines[k], lines[j]);
            what = absl::StrCat("swap lines ", k + 1, " and ", j + 1);
            break;
          default: {
            std::string moved = lines[k];
            lines.erase(lines.begin() + static_cast<std::ptrdiff_t>(k));
            const std::size_t to = std::min(j, lines.size());
            lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(to), std::move(moved));
            what = absl::StrCat("move line ", k + 1, " to ", to + 1);
          }
        }
        t.clear();
        for (const std::string& l : lines) t += l;
        return what;
      }
      case 9: {  // a byte changed to one that matters to a JSON reader
        static constexpr char kBytes[] = {'\0', '\n', '"', '{', '}', '[', ']',    ',',
                                          ':',  '\\', '-', '.', 'e', ' ', '\x7f', '\xff'};
        const std::size_t at = below(t.size());
        t[at] = kBytes[below(sizeof(kBytes))];
        return absl::StrCat("byte @", at);
      }
      case 10: {  // a few bytes deleted
        const std::size_t at = below(t.size());
        const std::size_t n = 1 + below(8);
        t.erase(at, n);
        return absl::StrCat("erase ", n, " bytes @", at);
      }
      default: {  // truncated
        const std::size_t at = below(t.size());
        t.resize(at);
        return absl::StrCat("truncate @", at);
      }
    }
    // Nothing of the kind chosen: flip a byte instead.
    const std::size_t at = below(t.size());
    t[at] = static_cast<char>(' ' + below(95));
    return absl::StrCat("printable byte @", at);
  }

  std::mt19937_64 rng_;
};

}  // namespace remat::testing

#endif  // REMAT_TESTS_SUPPORT_FUZZ_MUTATOR_H_
