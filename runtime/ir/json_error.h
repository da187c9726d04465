// Why a text is not JSON, with where: the message the file readers of remat::ir (graphs,
// schedules, DTR logs) give for a document nlohmann::json rejects. Internal to remat::ir.
#ifndef REMAT_RUNTIME_IR_JSON_ERROR_H_
#define REMAT_RUNTIME_IR_JSON_ERROR_H_

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace remat::detail {

// A SAX handler that builds nothing and keeps the first error with its byte position. Every
// error nlohmann reports (a number beyond a double is an out_of_range, not a parse_error)
// comes through parse_error() here, so none escapes as an exception.
class JsonErrorFinder : public nlohmann::json_sax<nlohmann::json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& e) override {
    position_ = position;
    message_ = e.what();
    return false;
  }

  std::size_t position() const { return position_; }
  const std::string& message() const { return message_; }

 private:
  std::size_t position_ = 0;
  std::string message_;
};

// Why `text` does not parse as JSON, in one line: nlohmann's message without its
// "[json.exception...]" tag, with the line and column of the error where the message has none.
// Call it only for a text that failed to parse (it parses the text again).
inline std::string json_error(std::string_view text) {
  JsonErrorFinder finder;
  if (nlohmann::json::sax_parse(text.begin(), text.end(), &finder)) return "not JSON";
  std::string message = finder.message();
  if (message.rfind("[json.exception.", 0) == 0) {
    if (std::size_t end = message.find("] "); end != std::string::npos) message.erase(0, end + 2);
  }
  if (message.find(" at line ") == std::string::npos) {
    const std::size_t pos = std::min(finder.position(), text.size());
    const std::string_view before = text.substr(0, pos);
    const std::size_t line =
        1 + static_cast<std::size_t>(std::count(before.begin(), before.end(), '\n'));
    const std::size_t newline = before.rfind('\n');
    const std::size_t column = newline == std::string_view::npos ? pos : pos - newline - 1;
    absl::StrAppend(&message, " at line ", line, ", column ", column);
  }
  return message;
}

}  // namespace remat::detail

#endif  // REMAT_RUNTIME_IR_JSON_ERROR_H_
