// One argument grammar for the tools (flashlab-run, flashlab-bench):
//   --name value  or  --name=value      an option with a value
//   --name                              a flag (a value is an error)
//   1024,4096                           lists are comma-separated
// Unknown options and bad values throw ArgumentError, whose message names what
// was given and what is accepted ("unknown --dtype 'anything'; accepted: fp32,
// fp16, bf16"); the tools print it and exit with code 2.
#pragma once

#include <c10/core/ScalarType.h>

#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flashlab {

struct ArgumentError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

class ArgumentParser {
 public:
  // `summary` opens --help; `footer` closes it (exit codes, say).
  ArgumentParser(std::string program, std::string summary, std::string footer = {});

  // --name: calls on() when given.
  ArgumentParser& flag(std::string name, std::string help, std::function<void()> on);
  // --name VALUE / --name=VALUE: calls on(value) (which may throw ArgumentError).
  ArgumentParser& option(std::string name, std::string value_name, std::string help,
                         std::function<void(const std::string&)> on);
  // Arguments starting with this prefix are not ours: parse() returns them
  // (Google Benchmark's --benchmark_* flags), described as `description` in --help.
  ArgumentParser& pass_through(std::string prefix, std::string description);

  struct Result {
    bool help = false;                     // --help / -h was given: usage() printed nothing yet
    std::vector<std::string> passed_through;  // in order
  };
  // argv[0] is the program. Throws ArgumentError.
  Result parse(int argc, const char* const* argv) const;
  std::string usage() const;

 private:
  struct Entry {
    std::string name, value_name, help;
    std::function<void()> on_flag;
    std::function<void(const std::string&)> on_value;
  };
  const Entry* find(std::string_view name) const;
  std::string accepted_options() const;

  std::string program_, summary_, footer_;
  std::vector<Entry> entries_;
  std::vector<std::pair<std::string, std::string>> pass_through_;
};

// Value parsers; `option` names the option in the message ("--batch expects an
// integer from 1 to 2147483647, got 'x'").
long long parse_integer(std::string_view option, const std::string& text,
                        long long min = std::numeric_limits<long long>::min(),
                        long long max = std::numeric_limits<long long>::max());
int parse_int(std::string_view option, const std::string& text, int min = std::numeric_limits<int>::min(),
              int max = std::numeric_limits<int>::max());
double parse_number(std::string_view option, const std::string& text);
// "1,2,3": every entry an integer in [min, max]; an empty list or entry is an error.
std::vector<int> parse_int_list(std::string_view option, const std::string& text,
                                int min = std::numeric_limits<int>::min(),
                                int max = std::numeric_limits<int>::max());
// "a,b,c": non-empty entries.
std::vector<std::string> parse_list(std::string_view option, const std::string& text);

// One of a fixed set of words: "unknown --layout 'x'; accepted: bshd, packed-qkv".
template <class T>
T parse_choice(std::string_view option, const std::string& text,
               const std::vector<std::pair<std::string, T>>& choices) {
  std::string accepted;
  for (const auto& [name, value] : choices) {
    if (name == text) return value;
    accepted += (accepted.empty() ? "" : ", ") + name;
  }
  throw ArgumentError("unknown " + std::string(option) + " '" + text + "'; accepted: " + accepted);
}
// Checks every entry of `names` against `accepted` the same way.
void check_choices(std::string_view option, const std::vector<std::string>& names,
                   const std::vector<std::string>& accepted);

// fp32, fp16, bf16, e4m3 -> at::kFloat, at::kHalf, at::kBFloat16, at::kFloat8_e4m3fn.
at::ScalarType parse_dtype(std::string_view option, const std::string& text);
// The inverse: the --dtype value of a dtype parse_dtype accepts.
const char* dtype_argument(at::ScalarType dtype);

}  // namespace flashlab
