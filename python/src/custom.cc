// Kernels from images: npurt.ops.Custom (an image as an operator, with an optional
// Python reference) and Device.launch (one run of an image over device buffers).
// Both go through ops::ImageOperator, so a custom kernel is published, deduplicated,
// ordered and kept coherent exactly as library operators are.
#include <nanobind/stl/string.h>

#include <cstring>
#include <list>
#include <mutex>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common.h"
#include "device_objects.h"
#include "isa_objects.h"
#include "npurt/graph/operator_sequence.h"
#include "npurt/ops/image_operator.h"
#include "ops_objects.h"

namespace npurt::python {
namespace {

using namespace nb::literals;

std::string repr_of(nb::handle h) { return nb::cast<std::string>(nb::repr(h)); }

// A Python callable owned by C++ objects that may be destroyed on any thread.
struct PyCallable {
  nb::object fn;
  explicit PyCallable(nb::object f) : fn(std::move(f)) {}
  ~PyCallable() {
    if (!Py_IsInitialized()) {
      fn.release();  // the interpreter is gone; nothing to give the reference back to
      return;
    }
    nb::gil_scoped_acquire gil;
    fn = nb::object();
  }
};

// The numpy arrays a reference function gets: inputs (in their shapes) and scalars.
nb::dict reference_inputs(const std::vector<isa::ArgSpec>& sig, std::span<const ops::HostArg> args,
                          const std::map<std::string, std::vector<size_t>>& shapes) {
  nb::module_ np = nb::module_::import_("numpy");
  nb::dict kw;
  for (size_t i = 0; i < sig.size(); ++i) {
    const isa::ArgSpec& a = sig[i];
    if (a.is_scalar()) {
      kw[a.name.c_str()] = a.dtype == isa::DType::kF32 ? nb::object(nb::float_(args[i].as_f32()))
                                                       : nb::object(nb::int_(args[i].as_i64()));
      continue;
    }
    if (!a.reads()) continue;
    nb::bytes raw(reinterpret_cast<const char*>(args[i].bytes.data()), args[i].bytes.size());
    nb::object arr = np.attr("frombuffer")(raw, numpy_dtype(a.dtype)).attr("copy")();
    const auto shape = shapes.find(a.name);
    if (shape != shapes.end() && isa::dtype_is_plain(a.dtype)) arr = arr.attr("reshape")(shape_tuple(shape->second));
    kw[a.name.c_str()] = arr;
  }
  return kw;
}

// Copies the reference's result (a dict by output name, or the one output's array)
// into the output buffers, converted to their dtypes.
Status store_outputs(const std::vector<isa::ArgSpec>& sig, std::span<const ops::HostArg> args, nb::handle result) {
  nb::module_ np = nb::module_::import_("numpy");
  std::vector<size_t> outs;
  for (size_t i = 0; i < sig.size(); ++i) {
    if (!sig[i].is_scalar() && sig[i].writes()) outs.push_back(i);
  }
  nb::dict by_name;
  if (nb::isinstance<nb::dict>(result)) {
    by_name = nb::borrow<nb::dict>(result);
  } else if (outs.size() == 1 && !result.is_none()) {
    by_name[sig[outs[0]].name.c_str()] = result;
  } else {
    return invalid_argument("must return a dict of outputs by name" +
                            std::string(outs.size() == 1 ? " or the output's array" : "") + ", got " + repr_of(result));
  }
  for (const size_t i : outs) {
    const isa::ArgSpec& a = sig[i];
    if (!by_name.contains(a.name.c_str())) return invalid_argument("returned no array for output '" + a.name + "'");
    nb::object arr = np.attr("ascontiguousarray")(by_name[a.name.c_str()]).attr("astype")(numpy_dtype(a.dtype));
    const uint64_t nbytes = nb::cast<uint64_t>(arr.attr("nbytes"));
    if (nbytes != args[i].bytes.size()) {
      return invalid_argument("output '" + a.name + "' needs " + std::to_string(args[i].bytes.size()) +
                              " bytes, the reference returned " + std::to_string(nbytes));
    }
    nb::bytes raw = nb::cast<nb::bytes>(arr.attr("tobytes")());
    std::memcpy(args[i].bytes.data(), raw.c_str(), nbytes);
  }
  return ok_status();
}

ops::ReferenceFn python_reference(nb::object fn, std::vector<isa::ArgSpec> sig,
                                  std::map<std::string, std::vector<size_t>> shapes) {
  auto callable = std::make_shared<PyCallable>(std::move(fn));
  return [callable, sig = std::move(sig), shapes = std::move(shapes)](std::span<const ops::HostArg> args) -> Status {
    nb::gil_scoped_acquire gil;
    try {
      nb::object result = callable->fn(**reference_inputs(sig, args, shapes));
      return store_outputs(sig, args, result);
    } catch (nb::python_error& e) {
      return invalid_argument(std::string("raised ") + e.what());
    }
  };
}

struct PyCustom : PyOperator {};

}  // namespace

// The last few Device.launch runs, compiled: a run repeated over the same views reuses
// its sequence (no compile, its stream), and while an image has an entry its code stays
// published, so the same kernel over other views is a registry hit, not an upload.
struct LaunchCache {
  static constexpr size_t kEntries = 8;
  struct Entry {
    std::string key;  // image hash and grid
    std::map<std::string, View, std::less<>> views;
    std::unique_ptr<graph::CompiledSequence> run;
  };

  std::mutex mu;  // one launch at a time (a compiled sequence runs one call at a time)
  std::list<Entry> entries;  // most recently used first

  graph::CompiledSequence* find(const std::string& key, const std::map<std::string, View, std::less<>>& views) {
    for (auto it = entries.begin(); it != entries.end(); ++it) {
      if (it->key != key || !same_views(it->views, views)) continue;
      entries.splice(entries.begin(), entries, it);
      return entries.front().run.get();
    }
    return nullptr;
  }
  graph::CompiledSequence* add(std::string key, std::map<std::string, View, std::less<>> views,
                               std::unique_ptr<graph::CompiledSequence> run) {
    entries.push_front(Entry{std::move(key), std::move(views), std::move(run)});
    if (entries.size() > kEntries) entries.pop_back();
    return entries.front().run.get();
  }

 private:
  static bool same_views(const std::map<std::string, View, std::less<>>& a,
                         const std::map<std::string, View, std::less<>>& b) {
    if (a.size() != b.size()) return false;
    for (auto ia = a.begin(), ib = b.begin(); ia != a.end(); ++ia, ++ib) {
      if (ia->first != ib->first || !ia->second.same_buffer(ib->second) || ia->second.offset() != ib->second.offset() ||
          ia->second.size() != ib->second.size()) {
        return false;
      }
    }
    return true;
  }
};

std::shared_ptr<LaunchCache> make_launch_cache() { return std::make_shared<LaunchCache>(); }

void clear_launch_cache(LaunchCache& cache) {
  std::lock_guard<std::mutex> lock(cache.mu);
  cache.entries.clear();
}

namespace {

// A keyword value of Device.launch for a buffer argument: the view it names.
const PyView& view_argument(nb::handle value, const std::string& kernel, const isa::ArgSpec& a) {
  if (nb::isinstance<PyBuffer>(value)) return nb::cast<PyBuffer&>(value).whole;
  if (nb::isinstance<PyView>(value)) return nb::cast<PyView&>(value);
  check(invalid_argument(kernel + ": argument '" + a.name + "' is a buffer; pass an npurt Buffer or View, got " +
                         repr_of(value)));
  std::abort();  // check() raised
}

graph::ScalarValue scalar_argument(nb::handle value, const std::string& kernel, const isa::ArgSpec& a) {
  nb::module_ np = nb::module_::import_("numpy");
  if (!nb::isinstance<nb::bool_>(value)) {
    nb::object dtype = np.attr("asarray")(value).attr("dtype");
    if (nb::cast<bool>(np.attr("issubdtype")(dtype, np.attr("integer")))) return nb::cast<int64_t>(nb::int_(value));
    if (nb::cast<bool>(np.attr("issubdtype")(dtype, np.attr("floating")))) {
      return nb::cast<double>(nb::float_(value));
    }
  }
  check(invalid_argument(kernel + ": argument '" + a.name + "' is a scalar; pass an int or a float, got " +
                         repr_of(value)));
  std::abort();
}

}  // namespace

void device_launch(PyDevice& d, const PyImage& img, uint32_t grid, nb::kwargs kwargs) {
  const isa::Image& image = img.image;
  const std::string kernel = "launch of kernel '" + image.name() + "'";
  ops::ImageOperatorParams p{image, grid, {}, {}};
  graph::CompileOptions options;
  graph::Scalars scalars;
  std::map<std::string, uint64_t> counts;
  std::vector<std::string> bindings;
  std::map<std::string, bool> writes;  // buffer arguments bound so far
  for (const isa::ArgSpec& a : image.args()) {
    if (!kwargs.contains(a.name.c_str())) check(invalid_argument(kernel + ": no value for argument '" + a.name + "'"));
    nb::handle value = kwargs[a.name.c_str()];
    bindings.push_back(a.name);
    if (a.is_scalar()) {
      scalars[a.name] = scalar_argument(value, kernel, a);
      continue;
    }
    const PyView& v = view_argument(value, kernel, a);
    if (v.state != d.state) check(invalid_argument(kernel + ": argument '" + a.name + "' belongs to another device"));
    if (v.dtype != a.dtype) {
      raise_dtype_error(kernel + ": argument '" + a.name + "' holds " + dtype_description(a.dtype) + ", got " +
                        std::string(isa::dtype_name(v.dtype)) + " '" + v.name + "'");
    }
    for (const auto& [other, ov] : options.shared) {
      if ((a.writes() || writes[other]) && v.view.overlaps(ov)) {
        check(invalid_argument(kernel + ": arguments '" + other + "' and '" + a.name +
                               "' overlap and one of them is written"));
      }
    }
    writes[a.name] = a.writes();
    counts[a.name] = element_count(a.dtype, v.view.size());
    p.elements[a.name] = counts[a.name];
    options.shared.emplace(a.name, v.view);
  }
  for (auto [key, value] : kwargs) {
    const std::string k = py_str(key);
    if (std::none_of(image.args().begin(), image.args().end(), [&](const isa::ArgSpec& a) { return a.name == k; })) {
      check(invalid_argument(kernel + ": the kernel has no argument '" + k + "'"));
    }
  }
  auto op = std::make_shared<ops::ImageOperator>(std::move(p));
  const std::string key = image_hash_hex(image) + " grid " + std::to_string(grid);
  device_call(*d.state, [&]() -> Status {
    LaunchCache& cache = *d.state->launches;
    std::lock_guard<std::mutex> lock(cache.mu);
    graph::CompiledSequence* run = cache.find(key, options.shared);
    if (run == nullptr) {
      graph::OperatorSequence seq(image.name(), {{op, bindings}}, {}, {}, counts, graph::Dispatch::kSeparate);
      NPURT_ASSIGN_OR_RETURN(std::unique_ptr<graph::CompiledSequence> compiled,
                             seq.compile(*d.state->runtime, options));
      run = cache.add(key, options.shared, std::move(compiled));
    }
    return run->call(scalars);
  });
}

void bind_custom(nb::module_& m) {
  nb::class_<PyCustom, PyOperator>(
      m, "Custom",
      "An operator whose code is an npurt.isa.Image: a step of OperatorSequence (fused or "
      "separate) like any library operator.")
      .def(
          "__init__",
          [](PyCustom* self, const PyImage& img, uint32_t grid, nb::dict sizes, nb::object reference) {
            ops::ImageOperatorParams p{img.image, grid, {}, {}};
            std::map<std::string, std::vector<size_t>> shapes;
            for (auto [key, value] : sizes) {
              const std::string name = py_str(key);
              shapes[name] = parse_shape(value, "size of argument '" + name + "'");
              p.elements[name] = shape_count(shapes[name]);
            }
            if (!reference.is_none()) {
              if (!PyCallable_Check(reference.ptr())) {
                check(invalid_argument("kernel '" + img.image.name() + "': reference must be callable, got " +
                                       repr_of(reference)));
              }
              p.reference = python_reference(reference, img.image.args(), shapes);
            }
            auto op = std::make_shared<ops::ImageOperator>(std::move(p));
            check(op->validate());
            // The reference needs the element counts the signature now has.
            new (self) PyCustom{PyOperator{std::move(op)}};
          },
          "image"_a, "grid"_a, "sizes"_a, "reference"_a = nb::none(),
          nb::sig("def __init__(self, image: Image, grid: int, sizes: dict[str, int | tuple[int, ...]], "
                  "reference: typing.Callable[..., typing.Any] | None = None) -> None"),
          "`grid` blocks per launch; `sizes` each buffer argument's element count or shape "
          "(an image does not record them). `reference(**inputs_and_scalars)` returns the "
          "outputs (a dict by name, or the one output's array) for reference() and "
          "OperatorSequence.reference(). The image may exit only at its end.");
}

}  // namespace npurt::python
