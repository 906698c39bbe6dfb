#include "npurt/base/status.h"

#include <gtest/gtest.h>

namespace npurt {
namespace {

StatusOr<int> parse_positive(int v) {
  if (v <= 0) return invalid_argument("value must be positive, got " + std::to_string(v));
  return v;
}

StatusOr<int> doubled(int v) {
  NPURT_ASSIGN_OR_RETURN(int x, parse_positive(v));
  return 2 * x;
}

Status check_both(int a, int b) {
  NPURT_RETURN_IF_ERROR(parse_positive(a).status().with_context("first"));
  NPURT_RETURN_IF_ERROR(parse_positive(b).status().with_context("second"));
  return ok_status();
}

TEST(Status, OkIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.to_string(), "OK");
  EXPECT_TRUE(s.with_context("ctx").ok());
}

TEST(Status, CarriesCodeAndMessage) {
  Status s = out_of_range("view [8, 16) outside buffer of 12 bytes");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(s.to_string(), "OUT_OF_RANGE: view [8, 16) outside buffer of 12 bytes");
}

TEST(Status, MacrosPropagateWithContext) {
  EXPECT_EQ(doubled(4).value(), 8);
  auto bad = doubled(-1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "value must be positive, got -1");

  Status s = check_both(1, 0);
  EXPECT_EQ(s.message(), "second: value must be positive, got 0");
  EXPECT_TRUE(check_both(1, 2).ok());
}

TEST(Status, StatusOrFromOkStatusIsInternalError) {
  StatusOr<int> v{ok_status()};
  EXPECT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kInternal);
}

// Reading the value of an error is a caller bug: it aborts, naming the status.
TEST(StatusDeathTest, ValueOfAnErrorAbortsWithItsMessage) {
  StatusOr<int> v = parse_positive(-3);
  EXPECT_DEATH((void)v.value(), "StatusOr has no value: INVALID_ARGUMENT: value must be positive, got -3");
  EXPECT_DEATH((void)*v, "value must be positive");
  StatusOr<std::string> s = not_found("no such kernel 'gemv'");
  EXPECT_DEATH((void)s->size(), "no such kernel 'gemv'");
}

}  // namespace
}  // namespace npurt
