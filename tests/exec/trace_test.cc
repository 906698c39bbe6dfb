// The Chrome-trace sink with the simulator and the Worker: a few runs traced to a
// temporary file, which must be a JSON array holding the expected events and lanes.
#include "exec/exec_factory.h"
#include "npurt/base/trace.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "hal/sim_test_util.h"
#include "npurt/exec/worker.h"

namespace npurt::exec {
namespace {

using hal::KernelArg;

std::string temp_path(const char* stem) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir && *dir ? dir : "/tmp") + "/" + stem + "." + std::to_string(::getpid()) + ".json";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs python3 on `script` with the trace path as argv[1]; its exit status.
int check_with_python(const std::string& script, const std::string& path) {
  const std::string script_path = path + ".py";
  {
    std::ofstream out(script_path);
    out << script;
  }
  const std::string cmd = "python3 " + script_path + " " + path;
  const int rc = std::system(cmd.c_str());
  std::remove(script_path.c_str());
  return rc;
}

TEST(Trace, DisabledSinkRecordsNothing) {
  ASSERT_TRUE(trace::stop().ok());
  EXPECT_FALSE(trace::enabled());
  trace::instant("lane", "ignored", "test");
  EXPECT_TRUE(trace::flush().ok()) << "nothing started: nothing to write";
}

TEST(Trace, JsonEscaping) {
  EXPECT_EQ(trace::json_escape("a\"b\\c\n\x01"), "a\\\"b\\\\c\\n\\u0001");
  EXPECT_EQ(trace::Arg("k", "v\"").json, "\"v\\\"\"");
  EXPECT_EQ(trace::Arg("k", uint64_t{42}).json, "42");
  EXPECT_EQ(trace::Arg("k", true).json, "true");
}

TEST(Trace, RunsOnTheSimulatorProduceAChromeTrace) {
  if (std::system("python3 -c 'import json' > /dev/null 2>&1") != 0) GTEST_SKIP() << "python3 unavailable";
  const std::string path = temp_path("npurt_trace_test");
  ASSERT_TRUE(trace::start(path).ok());
  ASSERT_TRUE(trace::enabled());
  {
    auto dev = npurt::testing::make_sim();
    auto registry = std::make_shared<CodeRegistry>(npurt::testing::ExecFactory::key(), dev);
    auto worker = std::move(Worker::make(npurt::testing::ExecFactory::key(), registry)).value();
    using npurt::testing::elementwise_kernel;
    const CodeHandle add = registry->register_image(elementwise_kernel("A", isa::BinOp::kAdd).value()).value();
    const CodeHandle mul = registry->register_image(elementwise_kernel("B", isa::BinOp::kMul).value()).value();
    constexpr size_t kN = 512;
    const std::vector<float> x = npurt::testing::random_floats(kN, 3);
    std::vector<hal::DeviceAddr> bufs;
    for (int i = 0; i < 6; ++i) bufs.push_back(dev->allocate(kN * 4).value());
    std::vector<std::vector<float>> out(4, std::vector<float>(kN));
    std::vector<RunHandle> runs;
    for (int i = 0; i < 4; ++i) {
      const CodeHandle& code = i % 2 ? mul : add;
      runs.push_back(worker->submit(
          [&, i, code](RunContext& ctx) -> Status {
            const hal::DeviceAddr* b = &bufs[3 * ctx.slot()];
            NPURT_RETURN_IF_ERROR(ctx.copy_to_device(b[0], x.data(), kN * 4));
            NPURT_RETURN_IF_ERROR(ctx.copy_to_device(b[1], x.data(), kN * 4));
            NPURT_RETURN_IF_ERROR(ctx.launch(code, 8,
                                             {KernelArg::buffer(b[0], kN * 4), KernelArg::buffer(b[1], kN * 4),
                                              KernelArg::buffer(b[2], kN * 4)}));
            return ctx.copy_to_host(out[i].data(), b[2], kN * 4);
          },
          {code}));
    }
    for (auto& r : runs) ASSERT_TRUE(r.wait().ok());
  }  // worker, registry and device go: stream destroys and frees are traced too
  ASSERT_TRUE(trace::flush().ok());
  ASSERT_TRUE(trace::stop().ok());
  EXPECT_FALSE(trace::enabled());

  const std::string text = read_file(path);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.front(), '[');

  const std::string script = R"PY(
import json, re, sys
events = json.load(open(sys.argv[1]))
assert isinstance(events, list), "not a JSON array"
lanes = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
def lane(e): return lanes.get(e.get("tid"), "")
spans = [e for e in events if e.get("ph") == "X"]
instants = [e for e in events if e.get("ph") == "i"]
for e in spans:
    assert e["dur"] >= 0 and e["ts"] >= 0, e
def has(pred, what):
    if not any(pred(e) for e in events):
        print("missing:", what); sys.exit(1)
has(lambda e: e.get("ph") == "X" and e["name"] == "copy h2d" and lane(e).startswith("stream ") and e["args"]["bytes"] == 2048, "copy h2d span")
has(lambda e: e.get("ph") == "X" and e["name"] == "copy d2h" and lane(e).startswith("stream "), "copy d2h span")
has(lambda e: e.get("ph") == "X" and e["name"] == "launch A" and e["args"]["grid"] == 8, "launch A span")
has(lambda e: e.get("ph") == "X" and e["name"] == "launch B", "launch B span")
has(lambda e: e.get("ph") == "X" and e["name"] == "launch npurt.prime", "priming launch")
for c in range(8):
    has(lambda e, c=c: e.get("ph") == "X" and lane(e) == "core %d" % c and e["name"] == "A", "core %d span" % c)
has(lambda e: e.get("ph") == "i" and e["name"] == "create stream" and lane(e).startswith("stream "), "stream create")
has(lambda e: e.get("ph") == "i" and e["name"] == "destroy stream", "stream destroy")
has(lambda e: e.get("ph") == "X" and e["name"] == "publish A" and lane(e) == "code registry", "publication A")
has(lambda e: e.get("ph") == "X" and e["name"] == "publish B" and lane(e) == "code registry", "publication B")
has(lambda e: e.get("ph") == "i" and e["name"] == "free A", "code free")
for r in range(4):
    has(lambda e, r=r: e.get("ph") == "X" and e["name"] == "run %d" % r
        and re.fullmatch(r"worker \d+ slot %d" % (r % 2), lane(e)) and e["args"]["outcome"] == "complete",
        "run %d lifetime" % r)
has(lambda e: e.get("ph") == "X" and e["name"] == "stage" and lane(e).endswith(" slot 1"), "staging span")
)PY";
  EXPECT_EQ(check_with_python(script, path), 0) << "trace at " << path << " failed the checks above";
  std::remove(path.c_str());
}

}  // namespace
}  // namespace npurt::exec
