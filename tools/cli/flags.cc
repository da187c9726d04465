#include "tools/cli/flags.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <iostream>
#include <sstream>
#include <utility>

#include "remat/byte_size.h"

#ifndef REMAT_VERSION
#define REMAT_VERSION "unknown"
#endif

namespace remat::cli {

namespace po = boost::program_options;

namespace {

template <class T>
std::string default_text(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    std::ostringstream s;
    s << v;
    return s.str();
  } else {
    return std::to_string(v);
  }
}

// Reads an integer of type T no smaller than `min` into *v.
template <class T>
std::function<absl::Status(absl::string_view)> integer_setter(T* v, T min) {
  return [v, min](absl::string_view text) {
    T x{};
    if (!absl::SimpleAtoi(text, &x)) return absl::InvalidArgumentError("wants an integer");
    if (x < min) return absl::InvalidArgumentError(absl::StrCat("wants at least ", min));
    *v = x;
    return absl::OkStatus();
  };
}

template <class T>
std::function<absl::Status(absl::string_view)> number_setter(T* v, T min) {
  return [v, min](absl::string_view text) {
    double x = 0;
    if (!absl::SimpleAtod(text, &x) || !std::isfinite(x))
      return absl::InvalidArgumentError("wants a finite number");
    if (x < static_cast<double>(min) || std::abs(x) > std::numeric_limits<T>::max())
      return absl::InvalidArgumentError(absl::StrCat("wants a number of at least ", min));
    *v = static_cast<T>(x);
    return absl::OkStatus();
  };
}

}  // namespace

std::string version() { return REMAT_VERSION; }

// The flags of a FlagSet as Boost describes and parses them, with --help and --version.
class FlagSetOptions {
 public:
  static po::options_description of(const FlagSet& set) {
    po::options_description desc("flags", 100, 60);
    for (const FlagSet::Flag& f : set.flags_) {
      std::string text = f.help;
      if (!f.default_text.empty() && !f.is_switch) text += " (default " + f.default_text + ")";
      if (f.is_switch)
        desc.add_options()(f.name.c_str(), text.c_str());
      else
        desc.add_options()(f.name.c_str(), po::value<std::string>()->value_name(f.value_name),
                           text.c_str());
    }
    desc.add_options()("help,h", "print this help and exit")("version",
                                                             "print the version and exit");
    return desc;
  }
};

FlagSet::FlagSet(std::string program, std::string synopsis, std::string description)
    : program_(std::move(program)),
      synopsis_(std::move(synopsis)),
      description_(std::move(description)) {}

void FlagSet::add_flag(Flag f) { flags_.push_back(std::move(f)); }

void FlagSet::add(const std::string& name, std::string* v, const std::string& help) {
  add_flag({name, "S", *v, help, false, [v](absl::string_view text) {
              *v = std::string(text);
              return absl::OkStatus();
            }});
}

void FlagSet::add(const std::string& name, std::int64_t* v, const std::string& help,
                  std::int64_t min) {
  add_flag({name, "N", default_text(*v), help, false, integer_setter(v, min)});
}

void FlagSet::add(const std::string& name, int* v, const std::string& help, int min) {
  add_flag({name, "N", default_text(*v), help, false, integer_setter(v, min)});
}

void FlagSet::add(const std::string& name, std::uint64_t* v, const std::string& help) {
  add_flag({name, "N", default_text(*v), help, false, integer_setter<std::uint64_t>(v, 0)});
}

void FlagSet::add(const std::string& name, double* v, const std::string& help, double min) {
  add_flag({name, "X", default_text(*v), help, false, number_setter(v, min)});
}

void FlagSet::add(const std::string& name, float* v, const std::string& help, float min) {
  add_flag({name, "X", default_text(*v), help, false, number_setter(v, min)});
}

void FlagSet::add_switch(const std::string& name, bool* v, const std::string& help) {
  add_flag({name, "", *v ? "on" : "off", help, true, [v](absl::string_view) {
              *v = true;
              return absl::OkStatus();
            }});
}

void FlagSet::add_choice(const std::string& name, std::string* v, std::vector<std::string> choices,
                         const std::string& help) {
  // Long lists go in the help text, where they wrap, rather than in the flag column.
  std::string value_name = absl::StrJoin(choices, "|"), text = help;
  if (value_name.size() > 24) {
    text += "; one of " + absl::StrJoin(choices, ", ");
    value_name = "NAME";
  }
  add_flag({name, value_name, *v, text, false,
            [v, choices = std::move(choices)](absl::string_view text) {
              if (std::find(choices.begin(), choices.end(), text) == choices.end())
                return absl::InvalidArgumentError(
                    absl::StrCat("wants one of ", absl::StrJoin(choices, ", ")));
              *v = std::string(text);
              return absl::OkStatus();
            }});
}

void FlagSet::add_list(const std::string& name, std::vector<std::string>* v,
                       const std::string& help) {
  add_flag({name, "A,B,...", absl::StrJoin(*v, ","), help, false, [v](absl::string_view text) {
              std::vector<std::string> items = absl::StrSplit(text, ',', absl::SkipEmpty());
              if (items.empty()) return absl::InvalidArgumentError("wants a comma-separated list");
              *v = std::move(items);
              return absl::OkStatus();
            }});
}

void FlagSet::add_custom(const std::string& name, const std::string& value_name,
                         const std::string& default_text, const std::string& help,
                         std::function<absl::Status(absl::string_view)> set) {
  add_flag({name, value_name, default_text, help, false, std::move(set)});
}

void FlagSet::add_host_memory(HostLink* link, std::uint64_t* bytes, const std::string& what) {
  add_flag({"host-link", "GBPS|NAME", "pcie5",
            "the link to host memory, as a bandwidth each way in GB/s or one of " +
                absl::StrJoin(host_link_names(), ", ") + " (pcie5: 50 GB/s; nvlink_c2c: 450)",
            false, [link](absl::string_view text) {
              absl::StatusOr<HostLink> l = parse_host_link(std::string(text));
              if (!l.ok()) return l.status();
              *link = *l;
              return absl::OkStatus();
            }});
  add_bytes("host-memory", bytes, "", "host memory for " + what + ", in bytes or with a unit",
            "budget");
}

void FlagSet::add_bytes(const std::string& name, std::uint64_t* v, const std::string& default_text,
                        const std::string& help, std::string_view what) {
  add_flag({name, "BYTES", default_text, help, false,
            [v, what = std::string(what)](absl::string_view text) {
              absl::StatusOr<std::uint64_t> b =
                  parse_byte_size(std::string_view(text.data(), text.size()), what);
              if (!b.ok()) return b.status();
              *v = *b;
              return absl::OkStatus();
            }});
}

void FlagSet::add_budget(BudgetFlags* budget, const std::string& baseline) {
  budget_ = budget;
  add_flag({"budget", "BYTES", "", "memory budget in bytes, or with a unit: 512MiB, 1.5GiB, 2GB",
            false, [budget](absl::string_view text) {
              absl::StatusOr<std::uint64_t> b = parse_bytes(text);
              if (!b.ok()) return b.status();
              budget->bytes = *b;
              return absl::OkStatus();
            }});
  add_flag({"budget-fraction", "F", "", "memory budget as a fraction in (0, 1] of " + baseline,
            false, [budget](absl::string_view text) {
              absl::StatusOr<double> f = parse_fraction(text);
              if (!f.ok()) return f.status();
              budget->fraction = *f;
              return absl::OkStatus();
            }});
}

void FlagSet::add_positional(const std::string& name, std::string* v, const std::string& help) {
  positionals_.push_back({name, help, v});
}

std::string FlagSet::help() const {
  std::ostringstream out;
  out << "usage: " << program_ << " " << synopsis_ << "\n" << description_ << "\n";
  if (!positionals_.empty()) {
    out << "\narguments:\n";
    for (const Positional& p : positionals_) out << "  " << p.name << "  " << p.help << "\n";
  }
  out << "\n" << FlagSetOptions::of(*this);
  return out.str();
}

std::optional<int> FlagSet::fail(const std::string& message) const {
  std::cerr << program_ << ": " << message << " (" << program_ << " --help lists the flags)\n";
  return kExitError;
}

std::optional<int> FlagSet::parse(int argc, const char* const* argv) {
  po::options_description desc = FlagSetOptions::of(*this);
  po::positional_options_description positional;
  for (const Positional& p : positionals_) {
    desc.add_options()(p.name.c_str(), po::value<std::string>(), "");
    positional.add(p.name.c_str(), 1);
  }
  po::variables_map vm;
  try {
    const int style = po::command_line_style::unix_style & ~po::command_line_style::allow_guessing;
    po::store(
        po::command_line_parser(argc, argv).options(desc).positional(positional).style(style).run(),
        vm);
  } catch (const po::error& e) {
    return fail(e.what());
  }
  if (vm.count("help")) {
    std::cout << help();
    return kExitOk;
  }
  if (vm.count("version")) {
    std::cout << program_ << " (remat) " << version() << "\n";
    return kExitOk;
  }
  for (const Flag& f : flags_) {
    if (!vm.count(f.name)) continue;
    given_.push_back(f.name);
    const std::string value = f.is_switch ? "" : vm[f.name].as<std::string>();
    if (absl::Status s = f.set(value); !s.ok())
      return fail(absl::StrCat("--", f.name, " ", value, ": ", s.message()));
  }
  for (const Positional& p : positionals_)
    if (vm.count(p.name)) *p.target = vm[p.name].as<std::string>();
  if (budget_ != nullptr && budget_->bytes && budget_->fraction)
    return fail("give --budget or --budget-fraction, not both");
  return std::nullopt;
}

bool FlagSet::given(const std::string& name) const {
  return std::find(given_.begin(), given_.end(), name) != given_.end();
}

std::optional<std::string> FlagSet::peek(int argc, const char* const* argv,
                                         const std::string& name) {
  const std::string flag = "--" + name;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == flag) return i + 1 < argc ? std::optional<std::string>(argv[i + 1]) : std::nullopt;
    if (arg.size() > flag.size() && arg.substr(0, flag.size()) == flag && arg[flag.size()] == '=')
      return std::string(arg.substr(flag.size() + 1));
  }
  return std::nullopt;
}

}  // namespace remat::cli
