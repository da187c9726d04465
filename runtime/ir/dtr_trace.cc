#include "remat/dtr_trace.h"

#include <absl/container/flat_hash_map.h>
#include <absl/status/status.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>

#include <fstream>
#include <istream>
#include <nlohmann/json.hpp>

namespace remat {
namespace {

using json = nlohmann::json;
using Kind = DtrInstruction::Kind;

// Parses a trace line by line. Every error names its line; nothing is half-returned.
class TraceParser {
 public:
  explicit TraceParser(std::string name) { trace_.name = std::move(name); }

  absl::Status line(const std::string& text, int number) {
    line_ = number;
    if (text.find_first_not_of(" \t\r") == std::string::npos) return absl::OkStatus();
    json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return error("not a JSON object");
    std::string instr;
    if (absl::Status s = get_string(j, "INSTRUCTION", instr); !s.ok()) return s;
    if (pending_memory_ > 0 || pending_alias_) return expect_followers(j, instr);
    if (instr == "ANNOTATE") return annotate(j);
    if (!started_) return absl::OkStatus();
    if (instr == "CONSTANT") return constant(j);
    if (instr == "CALL") return call(j);
    if (instr == "MUTATE") return mutate(j);
    if (instr == "COPY" || instr == "COPY_FROM")
      return copy(j, instr == "COPY" ? Kind::kCopy : Kind::kCopyFrom);
    if (instr == "RELEASE") return release(j);
    if (instr == "MEMORY" || instr == "ALIAS")
      return error(absl::StrCat("unexpected ", instr, " line"));
    return error(absl::StrCat("unknown INSTRUCTION '", instr, "'"));
  }

  absl::StatusOr<DtrTrace> finish() {
    if (pending_memory_ > 0 || pending_alias_)
      return absl::InvalidArgumentError(absl::StrCat(
          trace_.name, ": the file ends inside the MEMORY/ALIAS lines of line ", owner_line_));
    if (!started_)
      return absl::InvalidArgumentError(absl::StrCat(trace_.name, ": no START annotation"));
    return std::move(trace_);
  }

 private:
  absl::Status error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(trace_.name, ":", line_, ": ", what));
  }
  absl::Status get_string(const json& j, const char* key, std::string& out) const {
    auto it = j.find(key);
    if (it == j.end() || !it->is_string()) return error(absl::StrCat("missing string field ", key));
    out = it->get<std::string>();
    return absl::OkStatus();
  }
  // Sizes and times are strings in the format; numbers are accepted too.
  absl::Status get_count(const json& j, const char* key, std::uint64_t& out) const {
    auto it = j.find(key);
    if (it == j.end()) return error(absl::StrCat("missing field ", key));
    if (it->is_number_unsigned()) {
      out = it->get<std::uint64_t>();
      return absl::OkStatus();
    }
    if (it->is_string() && absl::SimpleAtoi(it->get<std::string>(), &out)) return absl::OkStatus();
    return error(absl::StrCat("field ", key, " is not a non-negative integer: ", it->dump()));
  }
  std::uint32_t intern(const std::string& h) {
    auto [it, fresh] = ids_.try_emplace(h, static_cast<std::uint32_t>(trace_.handle_names.size()));
    if (fresh) trace_.handle_names.push_back(h);
    return it->second;
  }
  absl::Status known(const std::string& h, std::uint32_t& id) const {
    auto it = ids_.find(h);
    if (it == ids_.end()) return error(absl::StrCat("unknown handle '", h, "'"));
    id = it->second;
    return absl::OkStatus();
  }
  absl::Status handles(const json& j, const char* key, std::vector<std::uint32_t>& out,
                       bool must_exist) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_array()) return error(absl::StrCat("missing array field ", key));
    for (const json& h : *it) {
      if (!h.is_string()) return error(absl::StrCat(key, " holds a non-string handle"));
      std::uint32_t id;
      if (must_exist) {
        if (absl::Status s = known(h.get<std::string>(), id); !s.ok()) return s;
      } else {
        id = intern(h.get<std::string>());
      }
      out.push_back(id);
    }
    return absl::OkStatus();
  }

  absl::Status annotate(const json& j) {
    std::string a;
    if (absl::Status s = get_string(j, "ANNOTATION", a); !s.ok()) return s;
    if (a == "START") {
      started_ = true;
    } else if (a == "BACKWARD" && started_) {
      DtrInstruction in;
      in.kind = Kind::kBackward;
      in.line = line_;
      trace_.instructions.push_back(std::move(in));
    }
    return absl::OkStatus();
  }
  absl::Status constant(const json& j) {
    std::string name;
    if (absl::Status s = get_string(j, "NAME", name); !s.ok()) return s;
    DtrInstruction in;
    in.kind = Kind::kConstant;
    in.line = line_;
    in.results.push_back(intern(name));
    open(std::move(in), 1, false);
    return absl::OkStatus();
  }
  absl::Status call(const json& j) {
    DtrInstruction in;
    in.kind = Kind::kCall;
    in.line = line_;
    if (absl::Status s = get_string(j, "NAME", in.op); !s.ok()) return s;
    if (absl::Status s = handles(j, "ARGS", in.args, true); !s.ok()) return s;
    if (absl::Status s = handles(j, "RESULT", in.results, false); !s.ok()) return s;
    if (absl::Status s = get_count(j, "TIME", in.time_ns); !s.ok()) return s;
    trace_.total_time_ns += in.time_ns;
    const std::size_t n = in.results.size();
    if (n == 0) {
      trace_.instructions.push_back(std::move(in));
      return absl::OkStatus();
    }
    open(std::move(in), n, true);
    return absl::OkStatus();
  }
  absl::Status mutate(const json& j) {
    DtrInstruction in;
    in.kind = Kind::kMutate;
    in.line = line_;
    if (absl::Status s = get_string(j, "NAME", in.op); !s.ok()) return s;
    if (absl::Status s = handles(j, "ARGS", in.args, true); !s.ok()) return s;
    if (absl::Status s = get_count(j, "TIME", in.time_ns); !s.ok()) return s;
    auto it = j.find("MUTATE");
    if (it == j.end() || !it->is_array()) return error("missing array field MUTATE");
    for (const json& m : *it) {
      if (!m.is_number_integer() || m.get<long long>() < 0 ||
          m.get<long long>() >= static_cast<long long>(in.args.size()))
        return error(absl::StrCat("MUTATE index ", m.dump(), " is not an argument index"));
      in.mutate.push_back(m.get<int>());
    }
    trace_.total_time_ns += in.time_ns;
    trace_.instructions.push_back(std::move(in));
    return absl::OkStatus();
  }
  absl::Status copy(const json& j, Kind kind) {
    std::string dst, src;
    if (absl::Status s = get_string(j, "DST", dst); !s.ok()) return s;
    if (absl::Status s = get_string(j, "SRC", src); !s.ok()) return s;
    DtrInstruction in;
    in.kind = kind;
    in.line = line_;
    if (absl::Status s = known(src, in.src); !s.ok()) return s;
    in.dst = intern(dst);
    trace_.instructions.push_back(std::move(in));
    return absl::OkStatus();
  }
  absl::Status release(const json& j) {
    std::string name;
    if (absl::Status s = get_string(j, "NAME", name); !s.ok()) return s;
    DtrInstruction in;
    in.kind = Kind::kRelease;
    in.line = line_;
    if (absl::Status s = known(name, in.dst); !s.ok()) return s;
    trace_.instructions.push_back(std::move(in));
    return absl::OkStatus();
  }

  // An instruction waits for its MEMORY (and, for CALL, ALIAS) lines, one pair per result.
  void open(DtrInstruction in, std::size_t results, bool with_alias) {
    owner_ = std::move(in);
    owner_line_ = line_;
    pending_memory_ = results;
    with_alias_ = with_alias;
    pending_alias_ = false;
  }
  absl::Status expect_followers(const json& j, const std::string& instr) {
    const std::size_t k = owner_.bytes.size();
    const std::string& expected = trace_.handle_names[owner_.results[k - (pending_alias_ ? 1 : 0)]];
    std::string name;
    if (absl::Status s = get_string(j, "NAME", name); !s.ok()) return s;
    if (name != expected)
      return error(absl::StrCat(instr, " line names '", name, "', expected '", expected,
                                "' (of line ", owner_line_, ")"));
    if (pending_alias_) {
      if (instr != "ALIAS")
        return error(absl::StrCat("expected an ALIAS line for '", expected, "'"));
      std::int64_t alias = 0;
      auto it = j.find("ALIAS");
      if (it == j.end()) return error("missing field ALIAS");
      if (it->is_number_integer()) {
        alias = it->get<std::int64_t>();
      } else if (!it->is_string() || !absl::SimpleAtoi(it->get<std::string>(), &alias)) {
        return error(absl::StrCat("ALIAS is not an integer: ", it->dump()));
      }
      if (alias < -1 || alias >= static_cast<std::int64_t>(owner_.args.size()))
        return error(absl::StrCat("ALIAS ", alias, " is not -1 or an argument index"));
      owner_.alias.push_back(static_cast<int>(alias));
      pending_alias_ = false;
    } else {
      if (instr != "MEMORY")
        return error(absl::StrCat("expected a MEMORY line for '", expected, "'"));
      std::uint64_t bytes = 0;
      if (absl::Status s = get_count(j, "MEMORY", bytes); !s.ok()) return s;
      owner_.bytes.push_back(bytes);
      --pending_memory_;
      pending_alias_ = with_alias_;
    }
    if (pending_memory_ == 0 && !pending_alias_) trace_.instructions.push_back(std::move(owner_));
    return absl::OkStatus();
  }

  DtrTrace trace_;
  absl::flat_hash_map<std::string, std::uint32_t> ids_;
  bool started_ = false;
  int line_ = 0;
  DtrInstruction owner_;
  int owner_line_ = 0;
  std::size_t pending_memory_ = 0;
  bool with_alias_ = false;
  bool pending_alias_ = false;
};

}  // namespace

absl::StatusOr<DtrTrace> parse_dtr_trace(std::istream& in, const std::string& name) {
  TraceParser parser(name);
  std::string text;
  int number = 0;
  while (std::getline(in, text)) {
    if (absl::Status s = parser.line(text, ++number); !s.ok()) return s;
  }
  return parser.finish();
}

absl::StatusOr<DtrTrace> read_dtr_trace_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open trace '", path, "'"));
  std::string name = path.substr(path.find_last_of('/') + 1);
  if (auto dot = name.rfind('.'); dot != std::string::npos) name.resize(dot);
  return parse_dtr_trace(in, name);
}

namespace {

json memory_line(const std::string& name, std::uint64_t bytes) {
  return {{"INSTRUCTION", "MEMORY"}, {"NAME", name}, {"MEMORY", std::to_string(bytes)}};
}

}  // namespace

namespace {

// Checks a trace before anything is written, so that a bad trace writes nothing.
absl::Status check_writable(const DtrTrace& trace) {
  const auto& names = trace.handle_names;
  auto bad = [&](std::size_t i) {
    return absl::InvalidArgumentError(absl::StrCat("trace '", trace.name, "' instruction ", i,
                                                   ": a handle index past the ", names.size(),
                                                   " handle names"));
  };
  for (std::size_t i = 0; i < trace.instructions.size(); ++i) {
    const DtrInstruction& in = trace.instructions[i];
    for (auto* list : {&in.args, &in.results})
      for (std::uint32_t h : *list)
        if (h >= names.size()) return bad(i);
    if ((in.kind == Kind::kCopy || in.kind == Kind::kCopyFrom || in.kind == Kind::kRelease) &&
        (in.dst >= names.size() || (in.kind != Kind::kRelease && in.src >= names.size())))
      return bad(i);
    if ((in.kind == Kind::kCall || in.kind == Kind::kConstant) &&
        in.bytes.size() != in.results.size())
      return absl::InvalidArgumentError(absl::StrCat("trace '", trace.name, "' instruction ", i,
                                                     ": ", in.results.size(), " results but ",
                                                     in.bytes.size(), " sizes"));
  }
  return absl::OkStatus();
}

// A CALL or MUTATE line, then a MEMORY and an ALIAS line per result.
void write_call(const DtrInstruction& in, const std::vector<std::string>& names,
                std::ostream& out) {
  auto handles = [&](const std::vector<std::uint32_t>& ids) {
    json a = json::array();
    for (std::uint32_t h : ids) a.push_back(names[h]);
    return a;
  };
  json j{{"NAME", in.op}, {"ARGS", handles(in.args)}, {"TIME", std::to_string(in.time_ns)}};
  if (in.kind == Kind::kCall) {
    j["INSTRUCTION"] = "CALL";
    j["RESULT"] = handles(in.results);
  } else {
    j["INSTRUCTION"] = "MUTATE";
    j["MUTATE"] = in.mutate;
  }
  out << j.dump() << "\n";
  for (std::size_t k = 0; k < in.results.size(); ++k) {
    const std::string& name = names[in.results[k]];
    out << memory_line(name, in.bytes[k]).dump() << "\n";
    const int alias = k < in.alias.size() ? in.alias[k] : -1;
    out << json{{"INSTRUCTION", "ALIAS"}, {"NAME", name}, {"ALIAS", std::to_string(alias)}}.dump()
        << "\n";
  }
}

void write_instruction(const DtrInstruction& in, const std::vector<std::string>& names,
                       std::ostream& out) {
  switch (in.kind) {
    case Kind::kConstant:
      out << json{{"INSTRUCTION", "CONSTANT"}, {"NAME", names[in.results[0]]}}.dump() << "\n";
      out << memory_line(names[in.results[0]], in.bytes[0]).dump() << "\n";
      break;
    case Kind::kCall:
    case Kind::kMutate:
      write_call(in, names, out);
      break;
    case Kind::kCopy:
    case Kind::kCopyFrom:
      out << json{{"INSTRUCTION", in.kind == Kind::kCopy ? "COPY" : "COPY_FROM"},
                  {"DST", names[in.dst]},
                  {"SRC", names[in.src]}}
                 .dump()
          << "\n";
      break;
    case Kind::kRelease:
      out << json{{"INSTRUCTION", "RELEASE"}, {"NAME", names[in.dst]}}.dump() << "\n";
      break;
    case Kind::kBackward:
      out << json{{"INSTRUCTION", "ANNOTATE"}, {"ANNOTATION", "BACKWARD"}}.dump() << "\n";
      break;
  }
}

}  // namespace

absl::Status write_dtr_trace(const DtrTrace& trace, std::ostream& out) {
  if (absl::Status st = check_writable(trace); !st.ok()) return st;
  out << json{{"INSTRUCTION", "ANNOTATE"}, {"ANNOTATION", "START"}}.dump() << "\n";
  for (const DtrInstruction& in : trace.instructions)
    write_instruction(in, trace.handle_names, out);
  if (!out) return absl::DataLossError(absl::StrCat("trace '", trace.name, "': write failed"));
  return absl::OkStatus();
}

absl::Status write_dtr_trace_file(const DtrTrace& trace, const std::string& path) {
  std::ofstream out(path);
  if (!out) return absl::NotFoundError(absl::StrCat("cannot open '", path, "' for writing"));
  return write_dtr_trace(trace, out);
}

}  // namespace remat
