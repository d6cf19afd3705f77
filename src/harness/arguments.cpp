#include "flashlab/harness/arguments.h"

#include <algorithm>
#include <sstream>

namespace flashlab {

ArgumentParser::ArgumentParser(std::string program, std::string summary, std::string footer)
    : program_(std::move(program)), summary_(std::move(summary)), footer_(std::move(footer)) {}

ArgumentParser& ArgumentParser::flag(std::string name, std::string help, std::function<void()> on) {
  entries_.push_back({std::move(name), {}, std::move(help), std::move(on), nullptr});
  return *this;
}

ArgumentParser& ArgumentParser::option(std::string name, std::string value_name, std::string help,
                                       std::function<void(const std::string&)> on) {
  entries_.push_back({std::move(name), std::move(value_name), std::move(help), nullptr, std::move(on)});
  return *this;
}

ArgumentParser& ArgumentParser::pass_through(std::string prefix, std::string description) {
  pass_through_.emplace_back(std::move(prefix), std::move(description));
  return *this;
}

const ArgumentParser::Entry* ArgumentParser::find(std::string_view name) const {
  const auto found = std::find_if(entries_.begin(), entries_.end(),
                                  [&](const Entry& entry) { return entry.name == name; });
  return found == entries_.end() ? nullptr : &*found;
}

std::string ArgumentParser::accepted_options() const {
  std::string names;
  for (const auto& entry : entries_) names += entry.name + ", ";
  names += "--help";
  for (const auto& entry : pass_through_) names += ", " + entry.first + "*";
  return names;
}

ArgumentParser::Result ArgumentParser::parse(int argc, const char* const* argv) const {
  Result result;
  for (int index = 1; index < argc; ++index) {
    const std::string argument = argv[index];
    if (argument == "--help" || argument == "-h") {
      result.help = true;
      continue;
    }
    const bool passes_through = std::any_of(
        pass_through_.begin(), pass_through_.end(),
        [&](const auto& entry) { return argument.rfind(entry.first, 0) == 0; });
    if (passes_through) {
      result.passed_through.push_back(argument);
      continue;
    }
    const size_t equals = argument.find('=');
    const std::string name = argument.substr(0, equals);
    const Entry* entry = argument.rfind("--", 0) == 0 ? find(name) : nullptr;
    if (entry == nullptr)
      throw ArgumentError("unknown option '" + argument + "'; accepted: " + accepted_options());
    if (entry->on_flag) {
      if (equals != std::string::npos)
        throw ArgumentError(name + " takes no value; got '" + argument + "'");
      entry->on_flag();
      continue;
    }
    std::string value;
    if (equals != std::string::npos) {
      value = argument.substr(equals + 1);
    } else {
      if (index + 1 >= argc) throw ArgumentError(name + " needs a value (" + entry->value_name + ")");
      value = argv[++index];
    }
    entry->on_value(value);
  }
  return result;
}

std::string ArgumentParser::usage() const {
  std::ostringstream text;
  text << "usage: " << program_ << " [options]\n";
  if (!summary_.empty()) text << summary_ << "\n";
  text << "options (--name VALUE or --name=VALUE; lists comma-separated):\n";
  for (const auto& entry : entries_) {
    std::string left = "  " + entry.name + (entry.value_name.empty() ? "" : " " + entry.value_name);
    if (left.size() < 26) left.resize(26, ' ');
    else left += "\n" + std::string(26, ' ');
    std::string help = entry.help;
    for (size_t at = help.find('\n'); at != std::string::npos; at = help.find('\n', at + 1))
      help.insert(at + 1, std::string(26, ' '));
    text << left << help << "\n";
  }
  text << "  --help                  this text\n";
  for (const auto& [prefix, description] : pass_through_)
    text << "  " << prefix << "*" << std::string(prefix.size() + 1 < 24 ? 24 - prefix.size() - 1 : 1, ' ')
         << description << "\n";
  if (!footer_.empty()) text << footer_;
  return text.str();
}

long long parse_integer(std::string_view option, const std::string& text, long long min,
                        long long max) {
  size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const bool bounded = min != std::numeric_limits<long long>::min() ||
                       max != std::numeric_limits<long long>::max();
  const std::string range =
      bounded ? " from " + std::to_string(min) + " to " + std::to_string(max) : std::string();
  if (text.empty() || used != text.size())
    throw ArgumentError(std::string(option) + " expects an integer" + range + ", got '" + text + "'");
  if (value < min || value > max)
    throw ArgumentError(std::string(option) + " expects an integer" + range + ", got " + text);
  return value;
}

int parse_int(std::string_view option, const std::string& text, int min, int max) {
  return static_cast<int>(parse_integer(option, text, min, max));
}

double parse_number(std::string_view option, const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (text.empty() || used != text.size())
    throw ArgumentError(std::string(option) + " expects a number, got '" + text + "'");
  return value;
}

std::vector<std::string> parse_list(std::string_view option, const std::string& text) {
  std::vector<std::string> entries;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string entry = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (entry.empty())
      throw ArgumentError(std::string(option) + " expects a comma-separated list without empty entries, got '" +
                          text + "'");
    entries.push_back(entry);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return entries;
}

std::vector<int> parse_int_list(std::string_view option, const std::string& text, int min, int max) {
  std::vector<int> values;
  for (const auto& entry : parse_list(option, text)) values.push_back(parse_int(option, entry, min, max));
  return values;
}

void check_choices(std::string_view option, const std::vector<std::string>& names,
                   const std::vector<std::string>& accepted) {
  for (const auto& name : names) {
    if (std::find(accepted.begin(), accepted.end(), name) != accepted.end()) continue;
    std::string list;
    for (const auto& entry : accepted) list += (list.empty() ? "" : ", ") + entry;
    throw ArgumentError("unknown " + std::string(option) + " '" + name + "'; accepted: " + list);
  }
}

const char* dtype_argument(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return "fp32";
    case at::kHalf: return "fp16";
    case at::kBFloat16: return "bf16";
    case at::kFloat8_e4m3fn: return "e4m3";
    default: TORCH_CHECK(false, "no --dtype value for ", dtype, "; accepted: fp32, fp16, bf16, e4m3");
  }
}

at::ScalarType parse_dtype(std::string_view option, const std::string& text) {
  return parse_choice<at::ScalarType>(option, text,
                                      {{"fp32", at::kFloat}, {"fp16", at::kHalf}, {"bf16", at::kBFloat16},
                                       {"e4m3", at::kFloat8_e4m3fn}});
}

}  // namespace flashlab
