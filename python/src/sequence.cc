// npurt.OperatorSequence (compiled at construction), npurt.Worker and npurt.RunHandle.
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "device_objects.h"
#include "npurt/exec/worker.h"
#include "npurt/graph/operator_sequence.h"
#include "npurt/isa/numeric.h"
#include "ops_objects.h"

namespace npurt::python {
namespace {

using namespace nb::literals;

// A compiled sequence (its arenas, code and streams).
class SequenceResource {
 public:
  explicit SequenceResource(std::shared_ptr<DeviceState> st) : state(std::move(st)) {}
  ~SequenceResource() {
    without_gil([&] { seq.reset(); });
  }

  const std::shared_ptr<DeviceState> state;
  // One call (or Worker enqueue) at a time, as CompiledSequence requires.
  std::mutex call_mu;
  std::unique_ptr<graph::CompiledSequence> seq;  // guarded by call_mu once published
};

struct PySequence {
  std::shared_ptr<SequenceResource> res;
  std::shared_ptr<graph::OperatorSequence> def;
  std::string name;
  std::vector<std::string> inputs, outputs;
  std::map<std::string, std::vector<size_t>> shapes;  // from `sizes`, per buffer
  std::vector<graph::BufferPlacement> placements;
};

class WorkerResource {
 public:
  explicit WorkerResource(std::shared_ptr<DeviceState> st) : state(std::move(st)) {}
  ~WorkerResource() {
    without_gil([&] { release(); });
  }
  // Closes the worker: waits for every submitted run to retire (called with the GIL
  // released). Worker::close is safe against calls racing with it.
  void release() {
    if (std::shared_ptr<exec::Worker> w = worker.exchange(nullptr)) w->close();
  }
  // Runs f(worker); "worker is closed" once released, and for a call it overtook.
  template <typename F>
  Status use(F&& f) {
    std::shared_ptr<exec::Worker> w = worker.load();
    if (!w) return worker_closed();
    return named(f(*w));
  }
  // A refusal because the worker or its device closed meanwhile, in the module's words.
  Status named(Status s) const {
    if (s.code() != StatusCode::kFailedPrecondition) return s;
    if (!worker.load()) return worker_closed();
    return name_closed(*state, std::move(s));
  }
  static Status worker_closed() { return failed_precondition("worker is closed"); }

  const std::shared_ptr<DeviceState> state;
  std::atomic<std::shared_ptr<exec::Worker>> worker;
};

struct PyWorker {
  std::shared_ptr<WorkerResource> res;
};

struct PyRunHandle {
  exec::RunHandle handle;
  std::shared_ptr<WorkerResource> worker;  // names a run its closing overtook
};

std::string repr_of(nb::handle h) { return nb::cast<std::string>(nb::repr(h)); }

graph::Scalars parse_scalars(const nb::kwargs& kwargs) {
  graph::Scalars scalars;
  for (auto [key, value] : kwargs) {
    const std::string name = nb::cast<std::string>(key);
    if (nb::isinstance<nb::bool_>(value)) {
      check(invalid_argument("scalar '" + name + "' must be an int or a float, got " + repr_of(value)));
    } else if (nb::isinstance<nb::int_>(value)) {
      scalars[name] = nb::cast<int64_t>(value);
    } else if (nb::isinstance<nb::float_>(value)) {
      scalars[name] = nb::cast<double>(value);
    } else {
      // numpy scalars and other numbers: integers stay integers.
      nb::object np = nb::module_::import_("numpy");
      if (nb::cast<bool>(np.attr("issubdtype")(np.attr("asarray")(value).attr("dtype"), np.attr("integer")))) {
        scalars[name] = nb::cast<int64_t>(nb::int_(value));
      } else if (nb::cast<bool>(
                     np.attr("issubdtype")(np.attr("asarray")(value).attr("dtype"), np.attr("floating")))) {
        scalars[name] = nb::cast<double>(nb::float_(value));
      } else {
        check(invalid_argument("scalar '" + name + "' must be an int or a float, got " + repr_of(value)));
      }
    }
  }
  return scalars;
}

// One step: (operator, bindings), bindings a list in signature order or a dict from
// argument name to buffer/scalar name (scalars default to their own names).
graph::SequenceStep parse_step(size_t index, nb::handle step) {
  const std::string where = "step " + std::to_string(index);
  if (!(nb::isinstance<nb::tuple>(step) || nb::isinstance<nb::list>(step)) || nb::len(step) != 2) {
    check(invalid_argument(where + ": expected (operator, bindings), got " + repr_of(step)));
  }
  nb::handle op_obj = step[0];
  if (!nb::isinstance<PyOperator>(op_obj)) {
    check(invalid_argument(where + ": expected an npurt operator, got " + repr_of(op_obj)));
  }
  const PyOperator& op = nb::cast<const PyOperator&>(op_obj);
  const std::string what = where + " (" + op.op->name() + ")";
  check(op.op->validate());
  const std::vector<isa::ArgSpec> sig = op.op->signature();
  graph::SequenceStep out{op.op, {}};
  nb::handle b = step[1];
  if (nb::isinstance<nb::dict>(b)) {
    nb::dict d = nb::borrow<nb::dict>(b);
    size_t used = 0;
    for (const isa::ArgSpec& a : sig) {
      if (d.contains(a.name.c_str())) {
        out.bindings.push_back(nb::cast<std::string>(d[a.name.c_str()]));
        ++used;
      } else if (a.is_scalar()) {
        out.bindings.push_back(a.name);
      } else {
        check(invalid_argument(what + ": no binding for argument '" + a.name + "'"));
      }
    }
    if (used != nb::len(d)) {
      for (auto [key, value] : d) {
        const std::string k = py_str(key);
        bool known = false;
        for (const isa::ArgSpec& a : sig) known |= (a.name == k);
        if (!known) check(invalid_argument(what + ": the operator has no argument '" + k + "'"));
      }
    }
  } else if (nb::isinstance<nb::list>(b) || nb::isinstance<nb::tuple>(b)) {
    for (nb::handle h : b) out.bindings.push_back(nb::cast<std::string>(h));
  } else {
    check(invalid_argument(what + ": bindings must be a dict or a list of names, got " + repr_of(b)));
  }
  return out;
}

const graph::BufferPlacement* find_placement(const PySequence& s, const std::string& buffer) {
  for (const graph::BufferPlacement& p : s.placements) {
    if (p.name == buffer) return &p;
  }
  return nullptr;
}

std::string arena_name(graph::BufferPlacement::Arena a) {
  switch (a) {
    case graph::BufferPlacement::Arena::kInput: return "input";
    case graph::BufferPlacement::Arena::kOutput: return "output";
    case graph::BufferPlacement::Arena::kScratch: return "scratch";
  }
  return "?";
}

PyView get_buffer(nb::handle self, const std::string& name) {
  PySequence& s = nb::cast<PySequence&>(self);
  std::optional<View> view;
  device_call(*s.res->state, [&]() -> Status {
    std::lock_guard<std::mutex> lock(s.res->call_mu);
    if (!s.res->seq) return closed_error();
    auto v = s.res->seq->get_buffer(name);
    if (!v.ok()) return v.status();
    view = std::move(v).value();
    return ok_status();
  });
  const std::string base = name.substr(0, name.find('['));
  const graph::BufferPlacement* p = find_placement(s, base);
  if (p == nullptr) check(internal_error("no placement for buffer '" + base + "'"));
  PyView v;
  v.state = s.res->state;
  v.view = std::move(*view);
  v.dtype = p->dtype;
  v.name = name;
  v.element_offset = element_count(p->dtype, v.view.offset() - p->offset);
  if (base == name && isa::dtype_is_plain(p->dtype)) {
    auto it = s.shapes.find(base);
    if (it != s.shapes.end()) v.shape = it->second;
  }
  v.parent = nb::borrow(self);
  return v;
}

nb::dict sequence_reference(PySequence& s, nb::dict inputs, nb::kwargs kwargs) {
  const graph::Scalars scalars = parse_scalars(kwargs);
  std::map<std::string, std::vector<uint8_t>> host;
  nb::module_ np = nb::module_::import_("numpy");
  for (auto [key, value] : inputs) {
    const std::string name = py_str(key);
    const graph::BufferPlacement* p = find_placement(s, name);
    if (p == nullptr) check(not_found("no buffer '" + name + "' in this sequence"));
    nb::object arr = np.attr("ascontiguousarray")(value);
    if (!arr.attr("dtype").equal(numpy_dtype(p->dtype))) {
      raise_dtype_error("buffer '" + name + "' holds " + dtype_description(p->dtype) + ", got an array of " +
                        py_str(arr.attr("dtype")));
    }
    const uint64_t nbytes = nb::cast<uint64_t>(arr.attr("nbytes"));
    if (nbytes != p->bytes) {
      check(invalid_argument("buffer '" + name + "' holds " + std::to_string(p->bytes) + " bytes, got an array of " +
                             std::to_string(nbytes)));
    }
    nb::bytes raw = nb::cast<nb::bytes>(arr.attr("tobytes")());
    host[name].assign(reinterpret_cast<const uint8_t*>(raw.c_str()),
                      reinterpret_cast<const uint8_t*>(raw.c_str()) + nbytes);
  }
  Status st;
  {
    nb::gil_scoped_release release;
    st = s.def->run_reference(host, scalars);
  }
  check(st);
  nb::dict out;
  for (const std::string& name : s.outputs) {
    const graph::BufferPlacement* p = find_placement(s, name);
    const auto it = host.find(name);
    if (p == nullptr || it == host.end()) continue;
    nb::object arr = np.attr("frombuffer")(nb::bytes(reinterpret_cast<const char*>(it->second.data()), it->second.size()),
                                           numpy_dtype(p->dtype))
                         .attr("copy")();
    auto shape = s.shapes.find(name);
    if (shape != s.shapes.end() && isa::dtype_is_plain(p->dtype)) arr = arr.attr("reshape")(shape_tuple(shape->second));
    out[name.c_str()] = arr;
  }
  return out;
}

nb::dict worker_stats_dict(const exec::WorkerStats& w) {
  nb::dict d;
  d["runs_submitted"] = w.runs_submitted;
  d["runs_completed"] = w.runs_completed;
  d["runs_failed"] = w.runs_failed;
  d["prime_launches"] = w.prime_launches;
  d["stale_leases_rejected"] = w.stale_leases_rejected;
  d["streams_created"] = w.streams.streams_created;
  d["streams_destroyed"] = w.streams.streams_destroyed;
  d["stream_reuse_hits"] = w.streams.reuse_hits;
  d["stale_stream_replacements"] = w.streams.stale_replacements;
  d["code_publications"] = w.code.publications;
  d["code_dedup_hits"] = w.code.dedup_hits;
  d["code_live_images"] = w.code.live_images;
  return d;
}

}  // namespace

void bind_sequence(nb::module_& m) {
  nb::class_<PySequence>(
      m, "OperatorSequence",
      "Operators bound to named buffers, compiled for a device into one fused launch (or one "
      "launch per step). get_buffer(name).data is a tracked numpy view; calling the sequence "
      "uploads exactly what was written, runs, and brings back the outputs.")
      .def(
          "__init__",
          [](PySequence* self, nb::handle device, const std::string& name, nb::handle steps,
             std::vector<std::string> inputs, std::vector<std::string> outputs, nb::dict sizes, bool fused) {
            PyDevice& d = nb::cast<PyDevice&>(device);
            std::vector<graph::SequenceStep> parsed;
            size_t i = 0;
            for (nb::handle step : steps) parsed.push_back(parse_step(i++, step));
            std::map<std::string, uint64_t> counts;
            std::map<std::string, std::vector<size_t>> shapes;
            for (auto [key, value] : sizes) {
              const std::string buffer = py_str(key);
              std::vector<size_t> shape = parse_shape(value, "size of buffer '" + buffer + "'");
              counts[buffer] = shape_count(shape);
              shapes[buffer] = std::move(shape);
            }
            auto def = std::make_shared<graph::OperatorSequence>(name, std::move(parsed), inputs, outputs, counts,
                                                                 fused ? graph::Dispatch::kFused
                                                                       : graph::Dispatch::kSeparate);
            auto res = std::make_shared<SequenceResource>(d.state);
            device_call(*d.state, [&]() -> Status {
              auto compiled = def->compile(*d.state->runtime);
              if (!compiled.ok()) return compiled.status();
              res->seq = std::move(compiled).value();
              return ok_status();
            });
            std::vector<graph::BufferPlacement> placements = res->seq->placements();
            new (self) PySequence{std::move(res), std::move(def), name, std::move(inputs), std::move(outputs),
                                  std::move(shapes), std::move(placements)};
          },
          "device"_a, "name"_a, "steps"_a, "inputs"_a, "outputs"_a, "sizes"_a, "fused"_a = true,
          nb::sig("def __init__(self, device: Device, name: str, steps: typing.Sequence[tuple[Operator, "
                  "dict[str, str] | typing.Sequence[str]]], inputs: typing.Sequence[str], outputs: "
                  "typing.Sequence[str], sizes: dict[str, int | tuple[int, ...]], fused: bool = True) -> None"),
          "Lays out and compiles the sequence. `steps` are (operator, bindings): a dict from "
          "argument name to buffer name (scalar arguments default to their own names) or a "
          "list in signature order. `sizes` gives each buffer's element count or shape. "
          "Errors name the step and the binding.")
      .def("get_buffer", &get_buffer, "name"_a,
           nb::sig("def get_buffer(self, name: str) -> View"),
           "A view of buffer `name` (or a slice 'name[first:last]', in elements). Raises "
           "NotFoundError (a KeyError) for an unknown name.")
      .def(
          "__call__",
          [](PySequence& s, nb::kwargs kwargs) {
            const graph::Scalars scalars = parse_scalars(kwargs);
            device_call(*s.res->state, [&]() -> Status {
              std::lock_guard<std::mutex> lock(s.res->call_mu);
              if (!s.res->seq) return closed_error();
              return s.res->seq->call(scalars);
            });
          },
          nb::sig("def __call__(self, **scalars: int | float) -> None"),
          "Runs the sequence (without the GIL): uploads exactly the stale bytes it reads, "
          "launches, waits, and brings back the outputs. Keyword arguments give the runtime "
          "scalars (e.g. pos=3).")
      .def("reference", &sequence_reference, "inputs"_a, "scalars"_a,
           nb::sig("def reference(self, inputs: dict[str, numpy.ndarray], /, **scalars: int | float) "
                   "-> dict[str, numpy.ndarray]"),
           "Runs every step's f32 host reference over numpy arrays (by buffer name; missing "
           "buffers are zeros) and returns the outputs by name.")
      .def_prop_ro("name", [](const PySequence& s) { return s.name; })
      .def_prop_ro("inputs", [](const PySequence& s) { return s.inputs; })
      .def_prop_ro("outputs", [](const PySequence& s) { return s.outputs; })
      .def_prop_ro(
          "launches_per_call",
          [](PySequence& s) {
            size_t n = 0;
            device_call(*s.res->state, [&]() -> Status {
              std::lock_guard<std::mutex> lock(s.res->call_mu);
              if (!s.res->seq) return closed_error();
              n = s.res->seq->launches_per_call();
              return ok_status();
            });
            return n;
          },
          "1 for a fused sequence (within the argument limit), one per step otherwise.")
      .def_prop_ro(
          "placements",
          [](const PySequence& s) {
            nb::list l;
            for (const graph::BufferPlacement& p : s.placements) {
              nb::dict d;
              d["name"] = p.name;
              d["arena"] = arena_name(p.arena);
              d["offset"] = p.offset;
              d["bytes"] = p.bytes;
              d["type_name"] = std::string(isa::dtype_name(p.dtype));
              d["intermediate"] = p.intermediate;
              l.append(d);
            }
            return l;
          },
          nb::sig("def placements(self) -> list[dict[str, object]]"),
          "Where each buffer lives: arena ('input', 'output', 'scratch'), byte offset, bytes, "
          "type_name, and whether it is an intermediate sharing space.")
      .def("__repr__", [](const PySequence& s) {
        return "<npurt.OperatorSequence '" + s.name + "' " + std::to_string(s.placements.size()) + " buffers>";
      });

  nb::class_<PyRunHandle>(m, "RunHandle", "A run submitted to a Worker.")
      .def(
          "wait",
          [](PyRunHandle& h) {
            Status s;
            {
              nb::gil_scoped_release release;
              s = h.worker->named(h.handle.wait());
            }
            check(s);
          },
          "Blocks (without the GIL) until the run retired; raises its error, if any.")
      .def("done", [](PyRunHandle& h) { return h.handle.done(); }, "True once the run retired.")
      .def_prop_ro("run_id", [](PyRunHandle& h) { return h.handle.run_id(); })
      .def_prop_ro("slot", [](PyRunHandle& h) { return h.handle.slot(); });

  nb::class_<PyWorker>(m, "Worker",
                       "Pipelined runs of operator sequences: run i goes to pipeline slot i % depth, "
                       "each slot with its own stream, reused only while no new code was published.")
      .def(
          "__init__",
          [](PyWorker* self, nb::handle device, uint32_t depth, bool stream_per_run) {
            PyDevice& d = nb::cast<PyDevice&>(device);
            auto res = std::make_shared<WorkerResource>(d.state);
            exec::WorkerOptions o;
            o.depth = depth;
            o.stream_per_run = stream_per_run;
            device_call(*d.state, [&]() -> Status {
              auto w = d.state->runtime->make_worker(o);
              if (!w.ok()) return w.status();
              res->worker = std::move(w).value();
              return ok_status();
            });
            new (self) PyWorker{std::move(res)};
          },
          "device"_a, "depth"_a = exec::StreamSlots::kDefaultDepth, "stream_per_run"_a = false,
          nb::sig("def __init__(self, device: Device, depth: int = 2, stream_per_run: bool = False) -> None"))
      .def(
          "submit",
          [](PyWorker& w, nb::handle seq_obj, nb::kwargs kwargs) {
            PySequence& s = nb::cast<PySequence&>(seq_obj);
            graph::Scalars scalars = parse_scalars(kwargs);
            if (s.res->state != w.res->state) {
              check(invalid_argument("sequence '" + s.name + "' belongs to another device"));
            }
            exec::RunHandle handle;
            std::shared_ptr<SequenceResource> seq = s.res;
            device_call(*w.res->state, [&]() -> Status {
              std::vector<exec::CodeHandle> code;
              {
                std::lock_guard<std::mutex> lock(seq->call_mu);
                if (!seq->seq) return closed_error();
                // Here rather than in the run: a misspelled scalar raises from submit().
                if (Status known = seq->seq->check_scalars(scalars); !known.ok()) return known;
                code = seq->seq->code_handles();
              }
              return w.res->use([&](exec::Worker& worker) {
              handle = worker.submit(
                  [seq, scalars](exec::RunContext& ctx) -> Status {
                    std::lock_guard<std::mutex> lock(seq->call_mu);
                    if (!seq->seq) return closed_error();
                    return seq->seq->enqueue(ctx.stream(), scalars);
                  },
                  std::move(code));
              return ok_status();
              });
            });
            return PyRunHandle{std::move(handle), w.res};
          },
          "sequence"_a, "scalars"_a,
          nb::sig("def submit(self, sequence: OperatorSequence, /, **scalars: int | float) -> RunHandle"),
          "Enqueues one call of `sequence` on the next slot's stream and returns at once (it "
          "blocks only while that slot's previous run is still in flight). Outputs come back "
          "when their .data is next read.")
      .def(
          "drain",
          [](PyWorker& w) {
            device_call(*w.res->state, [&] {
              return w.res->use([](exec::Worker& worker) {
                worker.drain();
                return ok_status();
              });
            });
          },
          "Waits (without the GIL) until every submitted run retired.")
      .def(
          "stats",
          [](PyWorker& w) {
            exec::WorkerStats st;
            device_call(*w.res->state, [&] {
              return w.res->use([&](exec::Worker& worker) {
                st = worker.stats();
                return ok_status();
              });
            });
            return worker_stats_dict(st);
          },
          "Runs submitted/completed/failed, priming launches, streams created and reused, "
          "code publications.")
      .def(
          "close",
          [](PyWorker& w) { device_run(*w.res->state, [&] { w.res->release(); }); },
          "Waits for every run to retire and releases the worker's streams; later submits "
          "raise.");
}

}  // namespace npurt::python
