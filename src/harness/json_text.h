// JSON text for the harness's reports (internal to flashlab_harness): numbers
// with 9 significant digits (null when not finite) and quoted strings.
#pragma once

#include <cmath>
#include <iomanip>
#include <sstream>
#include <string>

namespace flashlab::json {

inline std::string number(double value) {
  if (!std::isfinite(value)) return "null";
  std::ostringstream text;
  text << std::setprecision(9) << value;
  return text.str();
}

inline std::string string(const std::string& value) {
  std::string quoted = "\"";
  for (const char c : value) {
    if (c == '"' || c == '\\') quoted += '\\';
    quoted += c;
  }
  return quoted + "\"";
}

inline const char* boolean(bool value) { return value ? "true" : "false"; }

}  // namespace flashlab::json
