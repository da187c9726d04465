#include "remat/dtr_trace.h"

#include <absl/container/flat_hash_map.h>
#include <absl/status/status.h>
#include <absl/strings/escaping.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_replace.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <istream>
#include <nlohmann/json.hpp>
#include <string_view>

#include "runtime/ir/json_error.h"

namespace remat {
namespace {

using json = nlohmann::json;
using Kind = DtrInstruction::Kind;

// A name from the file as a message shows it: quoted, escaped and cut short, so that an error
// stays one line whatever the file holds.
std::string quote_name(std::string_view name) {
  constexpr std::size_t kShown = 64;
  const absl::string_view head(name.data(), std::min(name.size(), kShown));
  return absl::StrCat("'", absl::CHexEscape(head), name.size() > kShown ? "'..." : "'");
}

const char* kind_label(Kind kind) {
  switch (kind) {
    case Kind::kConstant:
      return "CONSTANT";
    case Kind::kCall:
      return "CALL";
    case Kind::kMutate:
      return "MUTATE";
    case Kind::kCopy:
      return "COPY";
    case Kind::kCopyFrom:
      return "COPY_FROM";
    case Kind::kRelease:
      return "RELEASE";
    case Kind::kBackward:
      return "BACKWARD";
  }
  return "?";
}

// The semantics of a trace, checked one instruction at a time in file order: which handles are
// live at each point, so that the replay never meets a released or never defined handle (the
// runtime would abort on it), and the running totals of bytes and time in checked arithmetic
// (a wrapped sum would make the replay's figures, and its clock limit, meaningless).
class TraceChecker {
 public:
  // `trace` is read for its handle names and the lines of earlier instructions; the parser
  // passes the trace it is building, which grows between calls.
  TraceChecker(const DtrTrace& trace, std::string where)
      : trace_(trace), where_(std::move(where)) {}

  // Checks `in`, the instruction at position `index` of the trace, against those before it.
  absl::Status check(const DtrInstruction& in, std::size_t index) {
    index_ = index;
    line_ = in.line;
    in_ = &in;
    if (absl::Status s = check_shape(in); !s.ok()) return s;
    switch (in.kind) {
      case Kind::kConstant:
        return define(in.results[0], in.bytes[0], "defines");
      case Kind::kCall:
        return call(in);
      case Kind::kMutate:
        return mutate(in);
      case Kind::kCopy:
      case Kind::kCopyFrom:
        return copy(in);
      case Kind::kRelease:
        return release(in.dst);
      case Kind::kBackward:
        return absl::OkStatus();
    }
    return absl::OkStatus();
  }

  std::uint64_t total_time_ns() const { return time_ns_; }

 private:
  struct Handle {
    bool live = false;
    std::size_t defined = 0;   // the instruction that last defined it
    std::size_t released = 0;  // the instruction that last released it, where one did
    bool ever_released = false;
    std::uint64_t bytes = 0;  // size of the tensor it refers to
  };

  // The instruction being checked as errors name it ("CALL 'conv2d'"), built only for one.
  std::string subject() const {
    if (in_->kind == Kind::kCall || in_->kind == Kind::kMutate)
      return absl::StrCat(kind_label(in_->kind), " ", quote_name(in_->op));
    return kind_label(in_->kind);
  }
  absl::Status error(const std::string& what) const {
    if (line_ > 0) return absl::InvalidArgumentError(absl::StrCat(where_, ":", line_, ": ", what));
    return absl::InvalidArgumentError(absl::StrCat(where_, ": instruction ", index_, ": ", what));
  }
  // Where an earlier instruction is: its line, or its position in a trace built in code.
  std::string at(std::size_t index) const {
    const int line = index < trace_.instructions.size() ? trace_.instructions[index].line : 0;
    return line > 0 ? absl::StrCat("line ", line) : absl::StrCat("instruction ", index);
  }
  std::string name(std::uint32_t h) const { return quote_name(trace_.handle_names[h]); }
  Handle& state(std::uint32_t h) {
    if (h >= handles_.size()) handles_.resize(static_cast<std::size_t>(h) + 1);
    return handles_[h];
  }

  // What the parser guarantees by construction, checked for traces built in code.
  absl::Status check_shape(const DtrInstruction& in) const {
    const std::size_t names = trace_.handle_names.size();
    for (const auto* list : {&in.args, &in.results})
      for (std::uint32_t h : *list)
        if (h >= names)
          return error(absl::StrCat(subject(), ": handle index ", h, " is past the ", names,
                                    " handle names"));
    const bool uses_dst =
        in.kind == Kind::kCopy || in.kind == Kind::kCopyFrom || in.kind == Kind::kRelease;
    if (uses_dst && (in.dst >= names || (in.kind != Kind::kRelease && in.src >= names)))
      return error(
          absl::StrCat(subject(), ": a handle index is past the ", names, " handle names"));
    if (in.kind == Kind::kConstant && (in.results.size() != 1 || in.bytes.size() != 1))
      return error("CONSTANT: a constant defines exactly one handle with one size");
    if (in.kind == Kind::kCall) {
      if (in.bytes.size() != in.results.size() || in.alias.size() != in.results.size())
        return error(absl::StrCat(subject(), ": ", in.results.size(), " results but ",
                                  in.bytes.size(), " sizes and ", in.alias.size(),
                                  " alias entries"));
      for (int a : in.alias)
        if (a < -1 || a >= static_cast<int>(in.args.size()))
          return error(absl::StrCat(subject(), ": ALIAS ", a, " is not -1 or an argument index"));
    }
    if (in.kind == Kind::kMutate) {
      // An argument mutated twice would get two new versions for one handle.
      std::vector<char> mutated(in.args.size(), 0);
      for (int m : in.mutate) {
        if (m < 0 || m >= static_cast<int>(in.args.size()))
          return error(absl::StrCat(subject(), ": MUTATE index ", m, " is not an argument index"));
        if (mutated[static_cast<std::size_t>(m)]++)
          return error(absl::StrCat(subject(), " lists MUTATE index ", m, " twice"));
      }
    }
    return absl::OkStatus();
  }

  // A handle the instruction reads must be live.
  absl::Status read(std::uint32_t h, const char* role) {
    const Handle& s = state(h);
    if (s.live) return absl::OkStatus();
    if (s.ever_released)
      return error(absl::StrCat(subject(), " reads ", role, name(h), ", released at ",
                                at(s.released),
                                " (a released handle cannot be used, mutated or copied)"));
    return error(absl::StrCat(subject(), " reads ", role, name(h), " before it is defined"));
  }
  // A handle the instruction defines must not be live: a second definition would silently drop
  // the tensor the first one named.
  absl::Status define(std::uint32_t h, std::uint64_t bytes, const char* verb) {
    Handle& s = state(h);
    if (s.live && s.defined == index_)
      return error(absl::StrCat(subject(), " lists result ", name(h), " twice"));
    if (s.live)
      return error(absl::StrCat(subject(), " ", verb, " ", name(h), ", a handle live since ",
                                at(s.defined), " (release it first)"));
    if (absl::Status st = add_bytes(bytes, h); !st.ok()) return st;
    s.live = true;
    s.defined = index_;
    s.bytes = bytes;
    return absl::OkStatus();
  }
  // Every tensor the trace makes counts towards kMaxTraceBytes, views included (a recording
  // of the replay gives each one a graph node of that size).
  absl::Status add_bytes(std::uint64_t bytes, std::uint32_t h) {
    if (bytes > kMaxTraceBytes)
      return error(absl::StrCat("the size of ", name(h), ", ", bytes,
                                " bytes, is more than a trace may give a tensor (2^62)"));
    if (bytes > kMaxTraceBytes - created_bytes_)
      return error(absl::StrCat("the size of ", name(h), ", ", bytes,
                                " bytes, makes the tensors of the trace add up to more than 2^62 "
                                "bytes"));
    created_bytes_ += bytes;
    return absl::OkStatus();
  }
  absl::Status add_time(std::uint64_t ns) {
    if (ns > UINT64_MAX - time_ns_)
      return error(absl::StrCat("TIME ", ns, " makes the trace's total time pass 2^64-1 ns"));
    time_ns_ += ns;
    return absl::OkStatus();
  }

  absl::Status call(const DtrInstruction& in) {
    for (std::uint32_t a : in.args)
      if (absl::Status s = read(a, "argument "); !s.ok()) return s;
    if (absl::Status s = add_time(in.time_ns); !s.ok()) return s;
    for (std::size_t k = 0; k < in.results.size(); ++k)
      if (absl::Status s = define(in.results[k], in.bytes[k], "redefines"); !s.ok()) return s;
    return absl::OkStatus();
  }
  absl::Status mutate(const DtrInstruction& in) {
    for (std::uint32_t a : in.args)
      if (absl::Status s = read(a, "argument "); !s.ok()) return s;
    if (absl::Status s = add_time(in.time_ns); !s.ok()) return s;
    // Replayed as copy-on-write: each mutated argument gets a new tensor of its size.
    for (int m : in.mutate) {
      const std::uint32_t h = in.args[static_cast<std::size_t>(m)];
      if (absl::Status s = add_bytes(state(h).bytes, h); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  absl::Status copy(const DtrInstruction& in) {
    if (absl::Status s = read(in.src, "SRC "); !s.ok()) return s;
    const std::uint64_t bytes = state(in.src).bytes;
    Handle& dst = state(in.dst);
    // COPY makes a new handle; COPY_FROM rebinds one (its old tensor loses a handle).
    if (in.kind == Kind::kCopy && dst.live)
      return error(absl::StrCat("COPY to ", name(in.dst), ", a handle live since ", at(dst.defined),
                                " (COPY_FROM rebinds a live handle)"));
    dst.live = true;
    dst.defined = index_;
    dst.bytes = bytes;
    return absl::OkStatus();
  }
  absl::Status release(std::uint32_t h) {
    Handle& s = state(h);
    if (!s.live && s.ever_released)
      return error(absl::StrCat("RELEASE of ", name(h), ", already released at ", at(s.released)));
    if (!s.live) return error(absl::StrCat("RELEASE of ", name(h), " before it is defined"));
    s.live = false;
    s.ever_released = true;
    s.released = index_;
    return absl::OkStatus();
  }

  const DtrTrace& trace_;
  std::string where_;
  std::vector<Handle> handles_;
  std::uint64_t created_bytes_ = 0;
  std::uint64_t time_ns_ = 0;
  std::size_t index_ = 0;
  int line_ = 0;
  const DtrInstruction* in_ = nullptr;
};

// Parses a trace line by line. Every error names its line; nothing is half-returned.
class TraceParser {
 public:
  // `name` becomes the trace's name; `where` (the path, for a file) starts every error.
  TraceParser(std::string name, std::string where) : checker_(trace_, where), where_(where) {
    trace_.name = std::move(name);
  }

  absl::Status line(const std::string& text, int number) {
    line_ = number;
    if (text.find_first_not_of(" \t\r") == std::string::npos) return absl::OkStatus();
    json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      // The line is this one: only the column of nlohmann's position says more.
      return error(absl::StrCat(
          "not a JSON object: ",
          absl::StrReplaceAll(detail::json_error(text), {{"at line 1, column", "at column"}})));
    }
    if (!j.is_object()) return error("not a JSON object");
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
    return error(absl::StrCat("unknown INSTRUCTION ", quote_name(instr)));
  }

  absl::StatusOr<DtrTrace> finish() {
    if (pending_memory_ > 0 || pending_alias_)
      return absl::InvalidArgumentError(absl::StrCat(
          where_, ": the file ends inside the MEMORY/ALIAS lines of line ", owner_line_));
    if (!started_) return absl::InvalidArgumentError(absl::StrCat(where_, ": no START annotation"));
    trace_.total_time_ns = checker_.total_time_ns();
    return std::move(trace_);
  }

 private:
  absl::Status error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(where_, ":", line_, ": ", what));
  }
  absl::Status get_string(const json& j, const char* key, std::string& out) const {
    auto it = j.find(key);
    if (it == j.end() || !it->is_string()) return error(absl::StrCat("missing string field ", key));
    out = it->get<std::string>();
    return absl::OkStatus();
  }
  // Sizes and times are strings in the format; numbers are accepted too. At most `max`.
  absl::Status get_count(const json& j, const char* key, std::uint64_t& out,
                         std::uint64_t max = UINT64_MAX) const {
    auto it = j.find(key);
    if (it == j.end()) return error(absl::StrCat("missing field ", key));
    bool ok = false;
    if (it->is_number_unsigned()) {
      out = it->get<std::uint64_t>();
      ok = true;
    } else if (it->is_string()) {
      const std::string& text = it->get_ref<const std::string&>();
      ok = absl::SimpleAtoi(text, &out);
      // All digits but no uint64: a size or time out of range, not a malformed one.
      if (!ok && !text.empty() && text.find_first_not_of("0123456789") == std::string::npos)
        return error(absl::StrCat("field ", key, " is out of range: ", quote_name(text)));
    }
    if (!ok) {
      std::string shown = it->dump();
      if (shown.size() > 64) shown = shown.substr(0, 64) + "...";
      return error(absl::StrCat("field ", key, " is not a non-negative integer: ", shown));
    }
    if (out > max)
      return error(absl::StrCat("field ", key, " is out of range: ", out, " (at most ", max, ")"));
    return absl::OkStatus();
  }
  std::uint32_t intern(const std::string& h) {
    auto [it, fresh] = ids_.try_emplace(h, static_cast<std::uint32_t>(trace_.handle_names.size()));
    if (fresh) trace_.handle_names.push_back(h);
    return it->second;
  }
  absl::Status known(const std::string& h, std::uint32_t& id) const {
    auto it = ids_.find(h);
    if (it == ids_.end()) return error(absl::StrCat("unknown handle ", quote_name(h)));
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
  // A complete instruction joins the trace once its semantics check out.
  absl::Status emit(DtrInstruction in) {
    if (absl::Status s = checker_.check(in, trace_.instructions.size()); !s.ok()) return s;
    trace_.instructions.push_back(std::move(in));
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
      return emit(std::move(in));
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
    const std::size_t n = in.results.size();
    if (n == 0) return emit(std::move(in));
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
    return emit(std::move(in));
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
    return emit(std::move(in));
  }
  absl::Status release(const json& j) {
    std::string name;
    if (absl::Status s = get_string(j, "NAME", name); !s.ok()) return s;
    DtrInstruction in;
    in.kind = Kind::kRelease;
    in.line = line_;
    if (absl::Status s = known(name, in.dst); !s.ok()) return s;
    return emit(std::move(in));
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
      return error(absl::StrCat(instr, " line names ", quote_name(name), ", expected ",
                                quote_name(expected), " (of line ", owner_line_, ")"));
    if (pending_alias_) {
      if (instr != "ALIAS")
        return error(absl::StrCat("expected an ALIAS line for ", quote_name(expected)));
      std::int64_t alias = 0;
      auto it = j.find("ALIAS");
      if (it == j.end()) return error("missing field ALIAS");
      if (it->is_number_integer()) {
        alias = it->get<std::int64_t>();
      } else if (!it->is_string() || !absl::SimpleAtoi(it->get<std::string>(), &alias)) {
        std::string shown = it->dump();
        if (shown.size() > 64) shown = shown.substr(0, 64) + "...";
        return error(absl::StrCat("ALIAS is not an integer: ", shown));
      }
      if (alias < -1 || alias >= static_cast<std::int64_t>(owner_.args.size()))
        return error(absl::StrCat("ALIAS ", alias, " is not -1 or an argument index"));
      owner_.alias.push_back(static_cast<int>(alias));
      pending_alias_ = false;
    } else {
      if (instr != "MEMORY")
        return error(absl::StrCat("expected a MEMORY line for ", quote_name(expected)));
      std::uint64_t bytes = 0;
      if (absl::Status s = get_count(j, "MEMORY", bytes, kMaxTraceBytes); !s.ok()) return s;
      owner_.bytes.push_back(bytes);
      --pending_memory_;
      pending_alias_ = with_alias_;
    }
    if (pending_memory_ == 0 && !pending_alias_) return emit(std::move(owner_));
    return absl::OkStatus();
  }

  DtrTrace trace_;
  TraceChecker checker_;  // reads trace_, declared before it
  std::string where_;
  absl::flat_hash_map<std::string, std::uint32_t> ids_;
  bool started_ = false;
  int line_ = 0;
  DtrInstruction owner_;
  int owner_line_ = 0;
  std::size_t pending_memory_ = 0;
  bool with_alias_ = false;
  bool pending_alias_ = false;
};

absl::StatusOr<DtrTrace> parse_trace(std::istream& in, std::string name, std::string where) {
  TraceParser parser(std::move(name), std::move(where));
  std::string text;
  int number = 0;
  while (std::getline(in, text)) {
    if (absl::Status s = parser.line(text, ++number); !s.ok()) return s;
  }
  return parser.finish();
}

}  // namespace

absl::Status validate_dtr_trace(const DtrTrace& trace) {
  TraceChecker checker(trace, absl::StrCat("trace ", quote_name(trace.name)));
  for (std::size_t i = 0; i < trace.instructions.size(); ++i)
    if (absl::Status s = checker.check(trace.instructions[i], i); !s.ok()) return s;
  if (checker.total_time_ns() != trace.total_time_ns)
    return absl::InvalidArgumentError(
        absl::StrCat("trace ", quote_name(trace.name), ": total_time_ns is ", trace.total_time_ns,
                     " but its instructions' TIME adds up to ", checker.total_time_ns()));
  return absl::OkStatus();
}

absl::StatusOr<DtrTrace> parse_dtr_trace(std::istream& in, const std::string& name) {
  return parse_trace(in, name, name);
}

absl::StatusOr<DtrTrace> read_dtr_trace_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open trace '", path, "'"));
  std::string name = path.substr(path.find_last_of('/') + 1);
  if (auto dot = name.rfind('.'); dot != std::string::npos) name.resize(dot);
  return parse_trace(in, std::move(name), path);
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
