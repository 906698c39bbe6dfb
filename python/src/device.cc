// npurt.Device, npurt.Buffer and npurt.View: the simulated device with its memory
// context and code registry, tracked buffers, and numpy arrays over host mirrors.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "npurt/base/trace.h"
#include "device_objects.h"
#include "isa_objects.h"
#include "npurt/hal/driver.h"
#include "npurt/isa/numeric.h"
#include "npurt/memory/write_tracker.h"

namespace npurt::python {

// ---- DeviceState ---------------------------------------------------------------------

Status closed_error() { return failed_precondition("device is closed"); }

DeviceState::DeviceState() : launches(make_launch_cache()) {}

void DeviceState::close() {
  closed = true;
  std::call_once(close_once_, [this] {
    if (runtime) runtime->close();  // workers drain, streams go, buffers are freed
    clear_launch_cache(*launches);
  });
}

DeviceState::~DeviceState() {
  // The last Python object using the device went: wait for its work without
  // blocking other Python threads.
  if (Py_IsInitialized()) {
    without_gil([this] { close(); });
  } else {
    close();
  }
}

namespace {

// Every device still alive, so that interpreter exit can close them while the
// interpreter is whole (waiting for their device work first).
std::mutex g_devices_mu;
std::vector<std::weak_ptr<DeviceState>> g_devices;

void remember_device(const std::shared_ptr<DeviceState>& st) {
  std::lock_guard<std::mutex> lock(g_devices_mu);
  std::erase_if(g_devices, [](const std::weak_ptr<DeviceState>& w) { return w.expired(); });
  g_devices.push_back(st);
}

void close_all_devices() {
  std::vector<std::shared_ptr<DeviceState>> live;
  {
    std::lock_guard<std::mutex> lock(g_devices_mu);
    for (const auto& w : g_devices) {
      if (auto st = w.lock()) live.push_back(std::move(st));
    }
    g_devices.clear();
  }
  without_gil([&] {
    for (const auto& st : live) st->close();
  });
}

}  // namespace

std::shared_ptr<DeviceState> adopt_runtime(std::shared_ptr<Runtime> runtime) {
  auto st = std::make_shared<DeviceState>();
  st->runtime = std::move(runtime);
  remember_device(st);
  return st;
}

// ---- dtypes ----------------------------------------------------------------------------

namespace {

std::optional<isa::DType> dtype_from_name(std::string name) {
  struct Alias {
    const char* name;
    isa::DType t;
  };
  static constexpr Alias kAliases[] = {
      {"f32", isa::DType::kF32},    {"float32", isa::DType::kF32},  {"bf16", isa::DType::kBF16},
      {"bfloat16", isa::DType::kBF16}, {"f16", isa::DType::kF16},   {"float16", isa::DType::kF16},
      {"half", isa::DType::kF16},   {"i32", isa::DType::kI32},      {"int32", isa::DType::kI32},
      {"q8_0", isa::DType::kQ8_0},  {"q4_0", isa::DType::kQ4_0},    {"q5_0", isa::DType::kQ5_0},
      {"q4_k", isa::DType::kQ4_K},  {"q5_k", isa::DType::kQ5_K},    {"q6_k", isa::DType::kQ6_K},
  };
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const Alias& a : kAliases) {
    if (name == a.name) return a.t;
  }
  return std::nullopt;
}

constexpr const char* kSupported =
    "npurt element types are float32, bfloat16, float16, int32 and the quantized blocks "
    "q8_0, q4_0, q5_0, q4_K, q5_K, q6_K";

nb::object& cached(const char* module, const char* attr, nb::object& slot) {
  if (!slot.is_valid()) slot = nb::module_::import_(module).attr(attr);
  return slot;
}

nb::object numpy_attr(const char* attr) { return nb::module_::import_("numpy").attr(attr); }

}  // namespace

isa::DType parse_dtype(nb::handle obj) {
  if (nb::isinstance<nb::str>(obj)) {
    const std::string name = nb::cast<std::string>(obj);
    if (auto t = dtype_from_name(name)) return *t;
    raise_dtype_error("unsupported dtype '" + name + "': " + kSupported);
  }
  // Anything numpy understands as a dtype: np.float32, np.dtype("f4"), ml_dtypes.bfloat16.
  nb::object dt;
  try {
    dt = numpy_attr("dtype")(obj);
  } catch (nb::python_error&) {
    raise_dtype_error("not a dtype: " + nb::cast<std::string>(nb::repr(obj)) + "; " + kSupported);
  }
  const std::string name = nb::cast<std::string>(dt.attr("name"));
  if (auto t = dtype_from_name(name)) return *t;
  raise_dtype_error("unsupported dtype '" + name + "': " + kSupported);
}

nb::object numpy_dtype(isa::DType t) {
  switch (t) {
    case isa::DType::kF32: return numpy_attr("dtype")("float32");
    case isa::DType::kF16: return numpy_attr("dtype")("float16");
    case isa::DType::kI32: return numpy_attr("dtype")("int32");
    case isa::DType::kBF16: return numpy_attr("dtype")(nb::module_::import_("ml_dtypes").attr("bfloat16"));
    default: return numpy_attr("dtype")("uint8");
  }
}

std::string dtype_description(isa::DType t) {
  switch (t) {
    case isa::DType::kF32: return "float32";
    case isa::DType::kBF16: return "bfloat16";
    case isa::DType::kF16: return "float16";
    case isa::DType::kI32: return "int32";
    default: return std::string(isa::dtype_name(t)) + " blocks (uint8)";
  }
}

StatusOr<uint64_t> element_bytes(isa::DType t, uint64_t count, const std::string& what) {
  const uint64_t bytes = isa::dtype_bytes(t, count);
  if (bytes == 0 && count != 0) {
    return invalid_argument(what + ": " + std::to_string(count) + " elements are not whole " +
                            std::string(isa::dtype_name(t)) + " blocks of " +
                            std::to_string(isa::dtype_block_elems(t)));
  }
  return bytes;
}

uint64_t element_count(isa::DType t, uint64_t bytes) {
  return bytes / isa::dtype_block_bytes(t) * isa::dtype_block_elems(t);
}

nb::object mirror_array(uint8_t* data, uint64_t bytes, isa::DType t, const std::vector<size_t>& shape,
                        nb::handle owner) {
  const bool plain = isa::dtype_is_plain(t);
  std::vector<size_t> dims = shape;
  if (!plain || dims.empty()) dims = {static_cast<size_t>(plain ? bytes / isa::dtype_size(t) : bytes)};
  nb::dlpack::dtype dt;
  switch (t) {
    case isa::DType::kF32: dt = nb::dtype<float>(); break;
    case isa::DType::kI32: dt = nb::dtype<int32_t>(); break;
    case isa::DType::kF16: dt = {static_cast<uint8_t>(nb::dlpack::dtype_code::Float), 16, 1}; break;
    case isa::DType::kBF16: dt = nb::dtype<uint16_t>(); break;  // viewed as bfloat16 below
    default: dt = nb::dtype<uint8_t>(); break;
  }
  nb::ndarray<nb::numpy> arr(data, dims.size(), dims.data(), owner, nullptr, dt);
  nb::object out = arr.cast(nb::rv_policy::reference);
  if (t == isa::DType::kBF16) {
    static nb::object* bf16 = new nb::object();  // leaked: outlives interpreter teardown
    out = out.attr("view")(cached("ml_dtypes", "bfloat16", *bf16));
  }
  return out;
}

std::vector<size_t> parse_shape(nb::handle obj, const std::string& what) {
  std::vector<size_t> shape;
  auto dim = [&](nb::handle h) {
    if (!nb::isinstance<nb::int_>(h) || nb::isinstance<nb::bool_>(h)) {
      check(invalid_argument(what + ": shape entries must be integers, got " +
                             nb::cast<std::string>(nb::repr(h))));
    }
    const long long v = nb::cast<long long>(h);
    if (v <= 0) check(invalid_argument(what + ": shape entries must be positive, got " + std::to_string(v)));
    shape.push_back(static_cast<size_t>(v));
  };
  if (nb::isinstance<nb::int_>(obj)) {
    dim(obj);
  } else if (nb::isinstance<nb::tuple>(obj) || nb::isinstance<nb::list>(obj)) {
    for (nb::handle h : obj) dim(h);
    if (shape.empty()) check(invalid_argument(what + ": empty shape"));
  } else {
    check(invalid_argument(what + ": a size must be an int or a tuple of ints, got " +
                           nb::cast<std::string>(nb::repr(obj))));
  }
  return shape;
}

uint64_t shape_count(const std::vector<size_t>& shape) {
  uint64_t n = 1;
  for (size_t d : shape) n *= d;
  return n;
}

nb::tuple shape_tuple(const std::vector<size_t>& shape) {
  nb::list l;
  for (size_t d : shape) l.append(d);
  return nb::tuple(l);
}

// ---- Buffer and View -------------------------------------------------------------------

BufferResource::BufferResource(std::shared_ptr<DeviceState> st, Buffer b)
    : state(std::move(st)), buffer(std::move(b)) {}

void BufferResource::release() {
  std::lock_guard<std::mutex> lock(mu_);
  if (buffer.valid()) buffer.free().ignore();
}

BufferResource::~BufferResource() {
  without_gil([&] { release(); });
}

namespace {

template <typename Stats>
nb::dict to_dict(const Stats& s, std::initializer_list<std::pair<const char*, uint64_t Stats::*>> fields) {
  nb::dict d;
  for (const auto& [name, member] : fields) d[name] = s.*member;
  return d;
}

nb::dict counters_dict(const hal::Counters& c) {
  using C = hal::Counters;
  return to_dict(c, {{"h2d_bytes", &C::h2d_bytes},
                     {"h2d_transfers", &C::h2d_transfers},
                     {"d2h_bytes", &C::d2h_bytes},
                     {"d2h_transfers", &C::d2h_transfers},
                     {"d2d_bytes", &C::d2d_bytes},
                     {"d2d_transfers", &C::d2d_transfers},
                     {"launches", &C::launches},
                     {"blocks", &C::blocks},
                     {"streams_created", &C::streams_created},
                     {"streams_destroyed", &C::streams_destroyed},
                     {"code_uploads", &C::code_uploads},
                     {"code_upload_bytes", &C::code_upload_bytes},
                     {"icache_hits", &C::icache_hits},
                     {"icache_misses", &C::icache_misses},
                     {"icache_invalidations", &C::icache_invalidations},
                     {"kernel_faults", &C::kernel_faults},
                     {"hazard_stale_fetch", &C::hazard_stale_fetch},
                     {"hazard_uninit_read", &C::hazard_uninit_read}});
}

nb::dict memory_stats_dict(const MemoryStats& s) {
  using M = MemoryStats;
  return to_dict(s, {{"buffers_created", &M::buffers_created},
                     {"buffers_live", &M::buffers_live},
                     {"h2d_bytes", &M::h2d_bytes},
                     {"h2d_copies", &M::h2d_copies},
                     {"d2h_bytes", &M::d2h_bytes},
                     {"d2h_copies", &M::d2h_copies},
                     {"launches", &M::launches},
                     {"staging_bytes", &M::staging_bytes},
                     {"fences_recorded", &M::fences_recorded},
                     {"events_created", &M::events_created},
                     {"events_live", &M::events_live},
                     {"device_waits", &M::device_waits},
                     {"host_waits", &M::host_waits},
                     {"deferred_frees", &M::deferred_frees},
                     {"pending_frees", &M::pending_frees},
                     {"tracked_pages_collected", &M::tracked_pages_collected},
                     {"tracked_conflict_pages", &M::tracked_conflict_pages},
                     {"host_bytes_dropped", &M::host_bytes_dropped},
                     {"retained_bytes", &M::retained_bytes}});
}

WriteTrackingMechanism parse_tracking(const std::string& s) {
  if (s == "auto") return WriteTrackingMechanism::kAuto;
  if (s == "uffd" || s == "userfaultfd") return WriteTrackingMechanism::kUserfaultfd;
  if (s == "mprotect") return WriteTrackingMechanism::kMprotect;
  check(invalid_argument("tracking must be 'auto', 'uffd' or 'mprotect', got '" + s + "'"));
  return WriteTrackingMechanism::kAuto;
}

// A view of `count` elements at element `offset` of the view `base` (whose first
// element is element 0).
PyView make_subview(const PyView& base, nb::object parent, uint64_t offset, std::optional<uint64_t> count) {
  const uint64_t base_count = element_count(base.dtype, base.view.size());
  if (offset > base_count) {
    check(out_of_range("view of '" + base.name + "': offset " + std::to_string(offset) +
                       " is past its " + std::to_string(base_count) + " elements"));
  }
  const uint64_t n = count.value_or(base_count - offset);
  const uint64_t first = take(element_bytes(base.dtype, offset, "view of '" + base.name + "' offset"));
  const uint64_t bytes = take(element_bytes(base.dtype, n, "view of '" + base.name + "' count"));
  PyView v;
  v.state = base.state;
  v.view = take(base.view.subview(first, bytes));
  v.dtype = base.dtype;
  v.name = base.name;
  v.element_offset = base.element_offset + offset;
  v.parent = std::move(parent);
  return v;
}

// Copies `array` (same dtype, same element count) into the view through an overwrite
// guard: the view's bytes become host-newer exactly, tracked or not.
void write_array(PyView& v, nb::handle array) {
  nb::module_ np = nb::module_::import_("numpy");
  nb::object arr = np.attr("asarray")(array);
  const std::string what = "buffer '" + v.name + "'";
  if (!arr.attr("dtype").equal(numpy_dtype(v.dtype))) {
    raise_dtype_error(what + " holds " + dtype_description(v.dtype) + ", got an array of " +
                      py_str(arr.attr("dtype")));
  }
  const uint64_t nbytes = nb::cast<uint64_t>(arr.attr("nbytes"));
  if (nbytes != v.view.size()) {
    const bool plain = isa::dtype_is_plain(v.dtype);
    const uint64_t want = plain ? element_count(v.dtype, v.view.size()) : v.view.size();
    const uint64_t got = plain ? nbytes / isa::dtype_size(v.dtype) : nbytes;
    check(invalid_argument(what + " view holds " + std::to_string(want) + (plain ? " elements" : " bytes") +
                           ", got an array of " + std::to_string(got)));
  }
  nb::bytes raw = nb::cast<nb::bytes>(np.attr("ascontiguousarray")(arr).attr("tobytes")());
  device_call(*v.state, [&]() -> Status {
    auto guard = v.state->memory().overwrite(v.view);
    if (!guard.ok()) return guard.status();
    std::memcpy(guard->bytes().data(), raw.c_str(), guard->bytes().size());
    guard->release();
    return ok_status();
  });
}

// The simulator's default local memory per core (hal::SimOptions), the keyword's default.
constexpr uint32_t kSimLocalMemoryBytes = 256u << 10;

}  // namespace

void bind_device(nb::module_& m) {
  m.def(
      "start_trace", [](const std::string& path) { check(trace::start(path)); }, nb::arg("path"),
      "Starts recording a Chrome trace (Perfetto opens it) of every device command, "
      "publication and run to `path`; stop_trace() (or process exit) writes it.");
  m.def(
      "stop_trace", [] { check(trace::stop()); },
      "Stops recording and writes the trace file start_trace() named.");
  m.def("drivers", [] { return hal::driver_names(); },
        "The names of the device drivers there are (Device(driver=...)); 'sim' is the simulated NPU.");
  nb::module_::import_("atexit").attr("register")(nb::cpp_function(&close_all_devices));
  m.def("page_size", [] { return PageWriteTracker::page_size(); },
        "The host page size: raw writes to tracked buffers are uploaded in whole pages.");
  m.def(
      "userfaultfd_supported", [] { return PageWriteTracker::userfaultfd_support().ok(); },
      "True when the kernel offers asynchronous userfaultfd write-protect (tracking='uffd').");

  nb::class_<PyDevice>(m, "Device",
                       "A simulated NPU with its memory context and code registry.\n\n"
                       "Usable as a context manager; close() (or leaving the with block) waits for "
                       "device work and releases everything created from it.")
      .def(
          "__init__",
          [](PyDevice* self, uint32_t cores, bool sanitize, uint64_t global_memory_bytes,
             uint32_t local_memory_bytes, uint32_t host_threads, const std::string& driver, nb::object settings) {
            // 0 means "the driver's default" to a DeviceSpec; here it is a mistake.
            if (cores == 0) check(invalid_argument("Device: cores must be at least 1"));
            if (global_memory_bytes == 0) check(invalid_argument("Device: global_memory_bytes must be at least 1"));
            hal::DeviceSpec spec{.cores = cores, .memory_bytes = global_memory_bytes};
            // The simulator's own options, where they differ from its defaults; any
            // other driver's settings come by name in `settings`.
            if (sanitize) spec.settings["sanitize"] = "1";
            if (local_memory_bytes != kSimLocalMemoryBytes) {
              spec.settings["local_memory_bytes"] = std::to_string(local_memory_bytes);
            }
            if (host_threads != 0) spec.settings["host_threads"] = std::to_string(host_threads);
            if (!settings.is_none()) {
              for (auto [key, value] : nb::cast<nb::dict>(settings)) {
                spec.settings[nb::cast<std::string>(nb::str(key))] = nb::cast<std::string>(nb::str(value));
              }
            }
            auto st = std::make_shared<DeviceState>();
            Status s;
            {
              nb::gil_scoped_release release;
              auto rt = Runtime::create(driver, spec);
              if (rt.ok()) {
                st->runtime = *std::move(rt);
              } else {
                s = rt.status();
                st->closed = true;
              }
            }
            check(s);
            remember_device(st);
            new (self) PyDevice{std::move(st)};
          },
          nb::arg("cores") = 8, nb::arg("sanitize") = false, nb::arg("global_memory_bytes") = 1ull << 30,
          nb::arg("local_memory_bytes") = kSimLocalMemoryBytes, nb::arg("host_threads") = 0,
          nb::arg("driver") = "sim", nb::arg("settings") = nb::none(),
          "Creates a device of the driver named `driver` (default sim, the simulated NPU; "
          "npurt.drivers() lists them) with `cores` cores and `global_memory_bytes` of memory. "
          "sanitize, local_memory_bytes and host_threads are the simulator's settings; `settings` "
          "passes any driver's by name. Bad options raise InvalidArgumentError naming the field, "
          "an unknown driver NotFoundError naming the ones there are.")
      .def_prop_ro(
          "info",
          [](PyDevice& d) {
            const hal::DeviceInfo info = device_run(*d.state, [&] { return d.state->runtime->device().info(); });
            nb::dict r;
            r["name"] = info.name;
            r["num_cores"] = info.num_cores;
            r["global_memory_bytes"] = info.global_memory_bytes;
            r["local_memory_bytes"] = info.local_memory_bytes;
            r["icache_line_bytes"] = info.icache_line_bytes;
            r["icache_sets"] = info.icache_sets;
            r["icache_ways"] = info.icache_ways;
            return r;
          },
          "The device's name, cores, memory sizes and instruction-cache geometry.")
      .def(
          "counters",
          [](PyDevice& d) {
            return counters_dict(device_run(*d.state, [&] { return d.state->runtime->device().counters(); }));
          },
          "The device's counters (monotonic since creation): bytes and transfers per "
          "direction, launches, streams, code uploads, icache hits/misses, faults, hazards.")
      .def(
          "memory_stats",
          [](PyDevice& d) {
            return memory_stats_dict(device_run(*d.state, [&] { return d.state->memory().stats(); }));
          },
          "The memory context's statistics: bytes moved and why, fences, waits, tracked "
          "pages collected.")
      .def(
          "synchronize", [](PyDevice& d) { device_call(*d.state, [&] { return d.state->memory().synchronize(); }); },
          "Waits (without the GIL) for all device work; raises the first failure.")
      .def(
          "buffer",
          [](nb::handle self, nb::handle shape, nb::handle dtype, const std::string& name,
             const std::string& tracking) {
            PyDevice& d = nb::cast<PyDevice&>(self);
            const isa::DType t = dtype.is_none() ? isa::DType::kF32 : parse_dtype(dtype);
            const std::string label = name.empty() ? std::string("buffer") : "buffer '" + name + "'";
            std::vector<size_t> dims = parse_shape(shape, label);
            const uint64_t count = shape_count(dims);
            const uint64_t bytes = take(element_bytes(t, count, label));
            BufferOptions o;
            static std::atomic<uint64_t> unnamed{0};
            o.name = name.empty() ? "buffer#" + std::to_string(unnamed.fetch_add(1)) : name;
            o.track_writes = true;
            o.mechanism = parse_tracking(tracking);
            std::optional<Buffer> created;
            device_call(*d.state, [&]() -> Status {
              auto b = d.state->memory().create_buffer(bytes, o);
              if (!b.ok()) return b.status();
              created.emplace(std::move(b).value());
              return ok_status();
            });
            auto res = std::make_shared<BufferResource>(d.state, std::move(*created));
            PyBuffer b;
            b.whole.state = d.state;
            b.whole.view = res->buffer.view();
            b.whole.dtype = t;
            b.whole.shape = isa::dtype_is_plain(t) ? dims : std::vector<size_t>{};
            b.whole.name = o.name;
            b.resource = std::move(res);
            return b;
          },
          nb::arg("shape"), nb::arg("dtype") = nb::none(), nb::arg("name") = "", nb::arg("tracking") = "auto",
          nb::sig("def buffer(self, shape: int | tuple[int, ...], dtype: object = None, name: str = '', "
                  "tracking: str = 'auto') -> Buffer"),
          "A device buffer with a host mirror, in tracked mode: any write to .data (numpy "
          "assignment, ufuncs, other threads) reaches the device before the next use. "
          "`shape` is a count or a tuple; `dtype` a numpy dtype or an npurt name "
          "(default float32); `tracking` 'auto', 'uffd' or 'mprotect'.")
      .def("launch", &device_launch, nb::arg("image"), nb::arg("grid"), nb::arg("args"),
           nb::sig("def launch(self, image: Image, grid: int, /, **args: Buffer | View | int | float) -> None"),
           "Runs `image` once over `grid` blocks and waits: buffer arguments by name as Buffers "
           "or Views of this device (uploaded as needed; outputs read back on access), scalars "
           "as ints or floats. The code is published (once per content) and run as an "
           "OperatorSequence step would be; a fault raises DeviceFaultError naming the "
           "instruction, and the device stays usable.")
      .def(
          "close", [](PyDevice& d) { without_gil([&] { d.state->close(); }); },
          "Waits for device work, releases every buffer, sequence and worker made from this "
          "device, and destroys it. Later operations raise FailedPreconditionError.")
      .def_prop_ro(
          "closed",
          [](PyDevice& d) {
            return d.state->closed.load();
          },
          "True once close() was called.")
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); }, nb::sig("def __enter__(self) -> Device"))
      .def(
          "__exit__", [](PyDevice& d, nb::args) { without_gil([&] { d.state->close(); }); },
          nb::sig("def __exit__(self, *args: object) -> None"));

  nb::class_<PyView>(m, "View",
                     "A range of elements of a buffer (or of an operator sequence's buffer). "
                     ".data is a zero-copy numpy array over the host mirror.")
      .def_prop_ro("data", [](nb::handle self) { return PyView::data_of(self, nb::cast<PyView&>(self)); },
                   nb::sig("def data(self) -> numpy.ndarray"),
                   "A numpy array over the view's host mirror (zero-copy; it keeps the buffer and "
                   "device alive). Reading it first brings back bytes the device wrote since the "
                   "host last saw them. Writes are tracked and reach the device before the next use.")
      .def_prop_ro("dtype", [](PyView& v) { return numpy_dtype(v.dtype); },
                   nb::sig("def dtype(self) -> numpy.dtype"), "The numpy dtype of .data.")
      .def_prop_ro("type_name", [](PyView& v) { return std::string(isa::dtype_name(v.dtype)); },
                   "The npurt element type: f32, bf16, f16, i32, q8_0, ...")
      .def_prop_ro("shape", [](PyView& v) { return v.shape_or_count(); },
                   nb::sig("def shape(self) -> tuple[int, ...]"), "The shape of .data (elements).")
      .def_prop_ro("offset", [](PyView& v) { return v.element_offset; }, "First element, in its buffer.")
      .def_prop_ro("count", [](PyView& v) { return element_count(v.dtype, v.view.size()); }, "Elements.")
      .def_prop_ro("nbytes", [](PyView& v) { return v.view.size(); }, "Bytes.")
      .def_prop_ro("name", [](PyView& v) { return v.name; }, "The buffer's name.")
      .def("__len__", [](PyView& v) { return element_count(v.dtype, v.view.size()); })
      .def(
          "view",
          [](nb::handle self, uint64_t offset, std::optional<uint64_t> count) {
            return make_subview(nb::cast<PyView&>(self), nb::borrow(self), offset, count);
          },
          nb::arg("offset") = 0, nb::arg("count") = nb::none(),
          "The `count` elements (default: the rest) at element `offset` of this view.")
      .def("write", &write_array, nb::arg("array"),
           nb::sig("def write(self, array: numpy.typing.ArrayLike) -> None"),
           "Copies `array` (the view's dtype, as many elements; any shape) into the view. "
           "DTypeError for another dtype, InvalidArgumentError for another size.")
      .def(
          "to_device", [](PyView& v) { device_call(*v.state, [&] { return v.state->memory().to_device(v.view); }); },
          "Uploads the view's host-newer bytes now (calls do this by themselves).")
      .def(
          "to_host", [](PyView& v) { device_call(*v.state, [&] { return v.state->memory().to_host(v.view); }); },
          "Downloads the view's device-newer bytes now (.data does this by itself).")
      .def("__repr__", [](PyView& v) {
        return "<npurt.View '" + v.name + "' " + std::string(isa::dtype_name(v.dtype)) + " [" +
               std::to_string(v.element_offset) + ":" +
               std::to_string(v.element_offset + element_count(v.dtype, v.view.size())) + "]>";
      });

  nb::class_<PyBuffer>(m, "Buffer",
                       "A device allocation with a page-aligned host mirror, in tracked mode.")
      .def_prop_ro(
          "data", [](nb::handle self) { return PyView::data_of(self, nb::cast<PyBuffer&>(self).whole); },
          nb::sig("def data(self) -> numpy.ndarray"),
          "A numpy array over the whole buffer, in its shape (see View.data).")
      .def_prop_ro("dtype", [](PyBuffer& b) { return numpy_dtype(b.whole.dtype); },
                   nb::sig("def dtype(self) -> numpy.dtype"), "The numpy dtype of .data.")
      .def_prop_ro("type_name", [](PyBuffer& b) { return std::string(isa::dtype_name(b.whole.dtype)); },
                   "The npurt element type: f32, bf16, f16, i32, q8_0, ...")
      .def_prop_ro("shape", [](PyBuffer& b) { return b.whole.shape_or_count(); },
                   nb::sig("def shape(self) -> tuple[int, ...]"), "The shape given at creation.")
      .def_prop_ro("count", [](PyBuffer& b) { return element_count(b.whole.dtype, b.whole.view.size()); },
                   "Elements.")
      .def_prop_ro("nbytes", [](PyBuffer& b) { return b.whole.view.size(); }, "Bytes.")
      .def_prop_ro("name", [](PyBuffer& b) { return b.whole.name; }, "The name given at creation.")
      .def("__len__", [](PyBuffer& b) { return element_count(b.whole.dtype, b.whole.view.size()); })
      .def(
          "view",
          [](nb::handle self, uint64_t offset, std::optional<uint64_t> count) {
            return make_subview(nb::cast<PyBuffer&>(self).whole, nb::borrow(self), offset, count);
          },
          nb::arg("offset") = 0, nb::arg("count") = nb::none(),
          "The `count` elements (default: the rest) at element `offset`; OutOfRangeError when "
          "they do not fit.")
      .def("write", [](PyBuffer& b, nb::handle a) { write_array(b.whole, a); }, nb::arg("array"),
           nb::sig("def write(self, array: numpy.typing.ArrayLike) -> None"),
           "Copies `array` (same dtype and element count) into the buffer; see View.write.")
      .def(
          "to_device",
          [](PyBuffer& b) { device_call(*b.whole.state, [&] { return b.whole.state->memory().to_device(b.whole.view); }); },
          "Uploads the buffer's host-newer bytes now.")
      .def(
          "to_host",
          [](PyBuffer& b) { device_call(*b.whole.state, [&] { return b.whole.state->memory().to_host(b.whole.view); }); },
          "Downloads the buffer's device-newer bytes now.")
      .def(
          "free",
          [](PyBuffer& b) { device_run(*b.whole.state, [&] { b.resource->release(); }); },
          "Releases the device allocation now (or when device work using it completes). "
          "Arrays over the mirror stay valid memory; device operations on the buffer raise.")
      .def("__repr__", [](PyBuffer& b) {
        return "<npurt.Buffer '" + b.whole.name + "' " + std::string(isa::dtype_name(b.whole.dtype)) + " x " +
               std::to_string(element_count(b.whole.dtype, b.whole.view.size())) + ">";
      });
}

nb::object PyView::data_of(nb::handle owner, PyView& v) {
  // Device-newer bytes of the view come back first (nothing moves when the host is
  // current, e.g. right after a sequence call, which already brought back its
  // outputs); raw writes made so far are recorded on the way.
  device_call(*v.state, [&] { return v.state->memory().to_host(v.view); });
  return mirror_array(v.view.data(), v.view.size(), v.dtype, v.shape, owner);
}

nb::tuple PyView::shape_or_count() const {
  if (!shape.empty()) return shape_tuple(shape);
  return shape_tuple({static_cast<size_t>(isa::dtype_is_plain(dtype) ? element_count(dtype, view.size())
                                                                     : view.size())});
}

}  // namespace npurt::python
