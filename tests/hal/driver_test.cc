// The driver registry (hal/driver.h): devices by name, specs and settings checked by
// name, and a second driver (one that forwards to the simulator and records every
// call) that the runtime and compiled sequences use without knowing it.

#include "npurt/hal/driver.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "hal/device_without_peers.h"
#include "hal/sim_test_util.h"
#include "npurt/graph/operator_sequence.h"
#include "npurt/ops/elementwise.h"
#include "npurt/runtime/runtime.h"

namespace npurt::testing {
namespace {

TEST(Drivers, TheSimulatorIsBuiltInAndMakesDevicesFromASpec) {
  auto names = hal::driver_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "sim"), names.end());
  auto sim = hal::find_driver("sim");
  ASSERT_TRUE(sim.ok()) << sim.status().to_string();
  EXPECT_TRUE((*sim)->capabilities().fault_injection);
  EXPECT_TRUE((*sim)->capabilities().host_addressable_memory);
  EXPECT_FALSE((*sim)->settings().empty());

  auto dev = hal::create_device("sim", {.cores = 3, .memory_bytes = 8u << 20, .settings = {{"sanitize", "1"}}});
  ASSERT_TRUE(dev.ok()) << dev.status().to_string();
  EXPECT_EQ((*dev)->info().num_cores, 3u);
  EXPECT_EQ((*dev)->info().global_memory_bytes, 8u << 20);
  auto defaults = hal::create_device("sim");
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ((*defaults)->info().num_cores, 8u);
}

TEST(Drivers, UnknownNamesSettingsAndValuesAreNamed) {
  auto none = hal::create_device("tpu9");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(none.status(), "'tpu9'")) << none.status().to_string();
  EXPECT_TRUE(contains(none.status(), "sim")) << "it names the drivers there are: " << none.status().to_string();

  auto setting = hal::create_device("sim", {.settings = {{"warp_size", "32"}}});
  ASSERT_FALSE(setting.ok());
  EXPECT_EQ(setting.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(setting.status(), "'warp_size'")) << setting.status().to_string();
  EXPECT_TRUE(contains(setting.status(), "host_threads")) << setting.status().to_string();

  auto value = hal::create_device("sim", {.settings = {{"host_threads", "two"}}});
  ASSERT_FALSE(value.ok());
  EXPECT_TRUE(contains(value.status(), "host_threads")) << value.status().to_string();
  EXPECT_TRUE(contains(value.status(), "'two'")) << value.status().to_string();
  auto flag = hal::create_device("sim", {.settings = {{"sanitize", "2"}}});
  EXPECT_FALSE(flag.ok());

  auto cores = hal::create_device("sim", {.cores = 100000});
  ASSERT_FALSE(cores.ok());
  EXPECT_EQ(cores.status().code(), StatusCode::kInvalidArgument) << cores.status().to_string();

  auto runtime = Runtime::create("tpu9");
  ASSERT_FALSE(runtime.ok());
  EXPECT_EQ(runtime.status().code(), StatusCode::kNotFound);
}

// ---- a second driver --------------------------------------------------------------------

// Forwards every call to a simulated NPU and counts the calls by name.
class RecordingDevice final : public DeviceWithoutPeers {
 public:
  explicit RecordingDevice(std::shared_ptr<hal::Device> inner) : inner_(std::move(inner)) {
    info_ = inner_->info();
    info_.name = "recording " + info_.name;
  }

  std::map<std::string, uint64_t> calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }

  const hal::DeviceInfo& info() const override { return info_; }
  StatusOr<hal::DeviceAddr> allocate(uint64_t bytes, uint64_t alignment) override {
    return note("allocate"), inner_->allocate(bytes, alignment);
  }
  Status free(hal::DeviceAddr addr) override { return note("free"), inner_->free(addr); }
  StatusOr<hal::StreamId> create_stream() override { return note("create_stream"), inner_->create_stream(); }
  Status destroy_stream(hal::StreamId s) override { return note("destroy_stream"), inner_->destroy_stream(s); }
  Status stream_synchronize(hal::StreamId s) override { return note("stream_synchronize"), inner_->stream_synchronize(s); }
  StatusOr<bool> stream_query(hal::StreamId s) override { return note("stream_query"), inner_->stream_query(s); }
  StatusOr<hal::EventId> create_event() override { return note("create_event"), inner_->create_event(); }
  Status destroy_event(hal::EventId e) override { return note("destroy_event"), inner_->destroy_event(e); }
  Status record_event(hal::StreamId s, hal::EventId e) override { return note("record_event"), inner_->record_event(s, e); }
  Status wait_event(hal::StreamId s, hal::EventId e) override { return note("wait_event"), inner_->wait_event(s, e); }
  Status event_synchronize(hal::EventId e) override { return note("event_synchronize"), inner_->event_synchronize(e); }
  StatusOr<bool> event_query(hal::EventId e) override { return note("event_query"), inner_->event_query(e); }
  Status copy_to_device(hal::StreamId s, hal::DeviceAddr dst, const void* src, uint64_t n) override {
    return note("copy_to_device"), inner_->copy_to_device(s, dst, src, n);
  }
  Status copy_to_host(hal::StreamId s, void* dst, hal::DeviceAddr src, uint64_t n) override {
    return note("copy_to_host"), inner_->copy_to_host(s, dst, src, n);
  }
  Status copy_on_device(hal::StreamId s, hal::DeviceAddr dst, hal::DeviceAddr src, uint64_t n) override {
    return note("copy_on_device"), inner_->copy_on_device(s, dst, src, n);
  }
  Status enqueue_host_function(hal::StreamId s, std::function<Status(const Status&)> fn) override {
    return note("enqueue_host_function"), inner_->enqueue_host_function(s, std::move(fn));
  }
  Status upload_code(hal::DeviceAddr dst, const isa::Image& image) override {
    return note("upload_code"), inner_->upload_code(dst, image);
  }
  Status launch(hal::StreamId s, const hal::LaunchParams& p) override { return note("launch"), inner_->launch(s, p); }
  Status abort_stream(hal::StreamId s) override { return note("abort_stream"), inner_->abort_stream(s); }
  Status reset() override { return note("reset"), inner_->reset(); }
  hal::Counters counters() const override { return inner_->counters(); }

 private:
  void note(const char* what) {
    std::lock_guard<std::mutex> lock(mu_);
    ++calls_[what];
  }

  const std::shared_ptr<hal::Device> inner_;
  hal::DeviceInfo info_;
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> calls_;
};

class RecordingDriver final : public hal::Driver {
 public:
  std::string_view name() const override { return "recording"; }
  std::string_view description() const override { return "the simulated NPU, every call counted"; }
  hal::DriverCapabilities capabilities() const override { return {}; }
  std::vector<hal::DriverSetting> settings() const override { return {}; }
  StatusOr<std::shared_ptr<hal::Device>> create_device(const hal::DeviceSpec& spec) const override {
    if (!spec.settings.empty()) {
      return invalid_argument("recording driver: no setting '" + spec.settings.begin()->first + "'");
    }
    NPURT_ASSIGN_OR_RETURN(std::shared_ptr<hal::Device> inner,
                           hal::create_device("sim", {.cores = spec.cores, .memory_bytes = spec.memory_bytes}));
    auto dev = std::make_shared<RecordingDevice>(std::move(inner));
    last_ = dev;
    return std::shared_ptr<hal::Device>(dev);
  }
  std::shared_ptr<RecordingDevice> last() const { return last_.lock(); }

 private:
  mutable std::weak_ptr<RecordingDevice> last_;
};

std::shared_ptr<const RecordingDriver> recording_driver() {
  static const auto driver = [] {
    auto d = std::make_shared<const RecordingDriver>();
    const Status s = hal::register_driver(d);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return d;
  }();
  return driver;
}

TEST(Drivers, ATakenNameIsRefused) {
  recording_driver();
  const Status again = hal::register_driver(std::make_shared<const RecordingDriver>());
  EXPECT_EQ(again.code(), StatusCode::kInvalidArgument) << again.to_string();
  EXPECT_TRUE(contains(again, "'recording'")) << again.to_string();
  EXPECT_FALSE(hal::register_driver(nullptr).ok());
}

// The runtime, the memory context, the code registry and a compiled sequence run on a
// device of a driver they have never heard of: everything goes through hal::Device.
TEST(Drivers, ARuntimeRunsASequenceOnASecondDriver) {
  const auto driver = recording_driver();
  auto rt = Runtime::create("recording", {.cores = 2, .memory_bytes = 32u << 20});
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  std::shared_ptr<RecordingDevice> dev = driver->last();
  ASSERT_NE(dev, nullptr);
  EXPECT_EQ((*rt)->device().info().name.rfind("recording ", 0), 0u);

  constexpr uint64_t n = 1024;
  auto add = std::make_shared<ops::Elementwise>(ops::ElementwiseParams{.kind = ops::ElementwiseKind::kAdd, .n = n});
  auto seq = graph::OperatorSequence("add", {{add, {"a", "b", "sum"}}}, {"a", "b"}, {"sum"},
                                     {{"a", n}, {"b", n}, {"sum", n}})
                 .compile(**rt);
  ASSERT_TRUE(seq.ok()) << seq.status().to_string();
  const std::vector<float> a = random_floats(n, 21), b = random_floats(n, 22);
  for (int call = 0; call < 2; ++call) {
    auto* pa = reinterpret_cast<float*>((*seq)->get_buffer("a")->data());
    auto* pb = reinterpret_cast<float*>((*seq)->get_buffer("b")->data());
    auto* out = reinterpret_cast<float*>((*seq)->get_buffer("sum")->data());
    std::fill(out, out + n, std::nanf(""));  // poisoned
    std::copy(a.begin(), a.end(), pa);
    std::copy(b.begin(), b.end(), pb);
    NPURT_ASSERT_OK((*seq)->call());
    double err = 0, ref = 0;
    for (uint64_t i = 0; i < n; ++i) {
      err += (out[i] - (a[i] + b[i])) * double(out[i] - (a[i] + b[i]));
      ref += double(a[i] + b[i]) * (a[i] + b[i]);
    }
    EXPECT_LE(std::sqrt(err / ref), 1e-7) << "call " << call;
  }
  const auto calls = dev->calls();
  EXPECT_GE(calls.at("launch"), 2u);
  EXPECT_GE(calls.at("upload_code"), 1u);
  EXPECT_GE(calls.at("copy_to_device"), 2u);
  EXPECT_GE(calls.at("copy_to_host"), 2u);

  // Fault injection is the driver's to offer: this one does not, and says so by name.
  const Status faults = (*rt)->device().set_fault_plan(hal::FaultPlan{}.with_rate(hal::FaultSite::kKernel, 0.5));
  EXPECT_EQ(faults.code(), StatusCode::kUnimplemented) << faults.to_string();
  EXPECT_TRUE(contains(faults, "recording")) << faults.to_string();
  EXPECT_EQ((*rt)->device().fault_stats().status().code(), StatusCode::kUnimplemented);

  // Settings the driver does not know are refused through every layer.
  auto bad = Runtime::create("recording", {.settings = {{"host_threads", "1"}}});
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(contains(bad.status(), "host_threads")) << bad.status().to_string();
}

}  // namespace
}  // namespace npurt::testing
