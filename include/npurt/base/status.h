// Errors as values: Status and StatusOr<T>.
//
// Every fallible npurt call returns one of these. A Status carries a code (who
// should react, and how) and a message that names the offending thing (a field,
// an address, a kernel). Context is added on the way up with NPURT_RETURN_IF_ERROR
// / NPURT_ASSIGN_OR_RETURN; exceptions are used only at the Python boundary.
//
// Codes (pick by what the caller should do):
//   kInvalidArgument   the caller passed something malformed (bad image, bad size)
//   kOutOfRange        an index/offset/view lies outside its container
//   kNotFound          a named/identified object does not exist (stale handle)
//   kFailedPrecondition the object is in a state that forbids the call
//                      (stream in error state, buffer still in use)
//   kResourceExhausted device memory / local memory / slots exhausted
//   kDeviceFault       a kernel faulted on the device (bounds, bad instruction)
//   kHazard            the simulator's sanitizer detected a coherence hazard
//   kUnimplemented     valid request this build does not support
//   kInternal          an npurt bug: an invariant did not hold
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace npurt {

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument,
  kOutOfRange,
  kNotFound,
  kFailedPrecondition,
  kResourceExhausted,
  kDeviceFault,
  kHazard,
  kUnimplemented,
  kInternal,
  // A wait ran past its timeout (a peer that never came). Codes cross process
  // boundaries as numbers (Communicator::agree): new codes go after the last one.
  kDeadlineExceeded,
  // Work stopped before it finished: a stream aborted, a device reset.
  kAborted,
};

std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message);

  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  // The message alone (empty for OK).
  const std::string& message() const;
  // "CODE: message" (or "OK").
  std::string to_string() const;

  // Returns a copy whose message is "context: message". OK stays OK.
  Status with_context(std::string_view context) const;

  // Explicitly drop a status the caller has decided not to act on.
  void ignore() const {}

 private:
  struct Rep {
    StatusCode code;
    std::string message;
  };
  std::shared_ptr<const Rep> rep_;  // null == OK; cheap to copy
};

inline Status ok_status() { return Status(); }
Status invalid_argument(std::string message);
Status out_of_range(std::string message);
Status not_found(std::string message);
Status failed_precondition(std::string message);
Status resource_exhausted(std::string message);
Status device_fault(std::string message);
Status hazard_error(std::string message);
Status unimplemented(std::string message);
Status internal_error(std::string message);
Status deadline_exceeded(std::string message);
Status aborted(std::string message);

// Aborts with "StatusOr has no value: <status>": StatusOr's check, out of line.
[[noreturn]] void abort_without_value(const Status& status);

// A value or the Status explaining why there is none.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.ok()) status_ = internal_error("StatusOr constructed from OK status");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  // value(), * and -> on an error abort with the status's message (an npurt bug in
  // the caller: it did not check ok()), never undefined behaviour.
  T& value() & { return checked(); }
  const T& value() const& { return checked(); }
  T&& value() && { return std::move(checked()); }
  T* operator->() { return &checked(); }
  const T* operator->() const { return &checked(); }
  T& operator*() & { return checked(); }
  const T& operator*() const& { return checked(); }
  T&& operator*() && { return std::move(checked()); }

 private:
  T& checked() {
    if (!value_.has_value()) [[unlikely]] abort_without_value(status_);
    return *value_;
  }
  const T& checked() const {
    if (!value_.has_value()) [[unlikely]] abort_without_value(status_);
    return *value_;
  }

  Status status_;
  std::optional<T> value_;
};

// Aborts with a message: for npurt bugs only, never for bad input.
[[noreturn]] void fatal(std::string_view message, const char* file, int line);

}  // namespace npurt

#define NPURT_STATUS_CONCAT_INNER(a, b) a##b
#define NPURT_STATUS_CONCAT(a, b) NPURT_STATUS_CONCAT_INNER(a, b)

#define NPURT_RETURN_IF_ERROR(expr)                 \
  do {                                              \
    ::npurt::Status npurt_status_ = (expr);         \
    if (!npurt_status_.ok()) return npurt_status_;  \
  } while (0)

#define NPURT_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()

#define NPURT_ASSIGN_OR_RETURN(lhs, expr) \
  NPURT_ASSIGN_OR_RETURN_IMPL(NPURT_STATUS_CONCAT(npurt_statusor_, __LINE__), lhs, expr)

// The two above, adding `context` to an error ("context: message"). The context is
// evaluated only on error, so hot paths build no strings.
#define NPURT_RETURN_IF_ERROR_CTX(expr, context)                                 \
  do {                                                                           \
    ::npurt::Status npurt_ctx_status_ = (expr);                                  \
    if (!npurt_ctx_status_.ok()) return npurt_ctx_status_.with_context(context); \
  } while (0)

#define NPURT_ASSIGN_OR_RETURN_CTX_IMPL(tmp, lhs, expr, context) \
  auto tmp = (expr);                                             \
  if (!tmp.ok()) return tmp.status().with_context(context);      \
  lhs = std::move(tmp).value()

#define NPURT_ASSIGN_OR_RETURN_CTX(lhs, expr, context) \
  NPURT_ASSIGN_OR_RETURN_CTX_IMPL(NPURT_STATUS_CONCAT(npurt_statusor_, __LINE__), lhs, expr, context)

// Internal invariant check: a failure is an npurt bug.
#define NPURT_CHECK(cond)                                                    \
  do {                                                                       \
    if (!(cond)) ::npurt::fatal("check failed: " #cond, __FILE__, __LINE__); \
  } while (0)
