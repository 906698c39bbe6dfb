#include "npurt/base/status.h"

#include <cstdio>
#include <cstdlib>

namespace npurt {

std::string_view status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kOutOfRange: return "OUT_OF_RANGE";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case StatusCode::kDeviceFault: return "DEVICE_FAULT";
    case StatusCode::kHazard: return "HAZARD";
    case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case StatusCode::kAborted: return "ABORTED";
    case StatusCode::kInternal: return "INTERNAL";
  }
  return "UNKNOWN";
}

Status::Status(StatusCode code, std::string message) {
  if (code == StatusCode::kOk) return;
  rep_ = std::make_shared<const Rep>(Rep{code, std::move(message)});
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return rep_ ? rep_->message : kEmpty;
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  return std::string(status_code_name(code())) + ": " + rep_->message;
}

Status Status::with_context(std::string_view context) const {
  if (ok()) return *this;
  return Status(code(), std::string(context) + ": " + rep_->message);
}

Status invalid_argument(std::string m) { return Status(StatusCode::kInvalidArgument, std::move(m)); }
Status out_of_range(std::string m) { return Status(StatusCode::kOutOfRange, std::move(m)); }
Status not_found(std::string m) { return Status(StatusCode::kNotFound, std::move(m)); }
Status failed_precondition(std::string m) {
  return Status(StatusCode::kFailedPrecondition, std::move(m));
}
Status resource_exhausted(std::string m) {
  return Status(StatusCode::kResourceExhausted, std::move(m));
}
Status device_fault(std::string m) { return Status(StatusCode::kDeviceFault, std::move(m)); }
Status hazard_error(std::string m) { return Status(StatusCode::kHazard, std::move(m)); }
Status unimplemented(std::string m) { return Status(StatusCode::kUnimplemented, std::move(m)); }
Status deadline_exceeded(std::string m) { return Status(StatusCode::kDeadlineExceeded, std::move(m)); }
Status aborted(std::string m) { return Status(StatusCode::kAborted, std::move(m)); }
Status internal_error(std::string m) { return Status(StatusCode::kInternal, std::move(m)); }

void abort_without_value(const Status& status) {
  const std::string text = "StatusOr has no value: " + status.to_string();
  fatal(text, __FILE__, __LINE__);
}

void fatal(std::string_view message, const char* file, int line) {
  std::fprintf(stderr, "npurt fatal: %.*s (%s:%d)\n", static_cast<int>(message.size()),
               message.data(), file, line);
  std::abort();
}

}  // namespace npurt
