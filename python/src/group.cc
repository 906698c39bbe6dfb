// npurt.DeviceGroup: simulated NPUs in this process, one npurt.Device per rank, and
// synchronous collectives over one buffer (or view) per rank.
//
// The C++ collectives are asynchronous and meet on the devices' stream threads, so
// one host thread enqueues every rank's part in rank order, never blocking between
// them, and only then waits for every rank's stream. A rank whose part cannot be
// enqueued leaves the ranks before it waiting for a peer that never comes; the
// arguments are therefore checked for every rank before anything is enqueued, and
// a late failure aborts the group so the waiting ranks fail at once.
#include <nanobind/stl/string.h>

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "device_objects.h"
#include "npurt/comm/device_group.h"
#include "npurt/exec/stream_pool.h"

namespace npurt::python {
namespace {

class PyDeviceGroup {
 public:
  PyDeviceGroup(int devices, uint32_t cores, uint64_t memory) {
    // 0 means "the driver's default" to a DeviceSpec; here it is a mistake.
    if (cores == 0) check(invalid_argument("DeviceGroup: cores must be at least 1"));
    if (memory == 0) check(invalid_argument("DeviceGroup: memory must be at least 1"));
    // The simulated devices share this machine's cores: one host thread each.
    const hal::DeviceSpec spec{.cores = cores, .memory_bytes = memory, .settings = {{"host_threads", "1"}}};
    Status s;
    {
      nb::gil_scoped_release release;
      s = create(devices, spec);
    }
    check(s);
    for (int r = 0; r < size(); ++r) states_.push_back(adopt_runtime(group_->shared_runtime(r)));
  }

  int size() const { return group_->size(); }

  PyDevice device(int rank) const {
    if (rank < 0 || rank >= size()) {
      raise_status(out_of_range("device group: rank " + std::to_string(rank) + " is not in [0, " +
                                std::to_string(size()) + ")"));
    }
    return PyDevice{states_[rank]};
  }

  nb::list devices() const {
    nb::list l;
    for (int r = 0; r < size(); ++r) l.append(device(r));
    return l;
  }

  void all_reduce(nb::handle buffers, nb::handle dtype) {
    const std::vector<PyView> views = rank_views(buffers, "all_reduce");
    const isa::DType t = dtype.is_none() ? views[0].dtype : parse_dtype(dtype);
    if (comm::reduce_element_bytes(t) == 0) {
      raise_dtype_error("all_reduce sums float32 or bfloat16, not " + dtype_description(t));
    }
    check_dtypes(views, t, "all_reduce");
    check_same_size(views, "all_reduce");
    run("all_reduce", [&](int r) { return group_->communicator(r)->all_reduce(stream(r), views[r].view, t); });
  }

  void all_gather(nb::handle locals, nb::handle gathereds) {
    const std::vector<PyView> local = rank_views(locals, "all_gather (locals)");
    const std::vector<PyView> gathered = rank_views(gathereds, "all_gather (gathereds)");
    check_dtypes(local, local[0].dtype, "all_gather (locals)");
    check_dtypes(gathered, local[0].dtype, "all_gather (gathereds)");
    check_same_size(local, "all_gather (locals)");
    const uint64_t want = local[0].view.size() * static_cast<uint64_t>(size());
    for (int r = 0; r < size(); ++r) {
      if (gathered[r].view.size() != want) {
        raise_status(invalid_argument("all_gather: gathered " + std::to_string(r) + " holds " +
                                      std::to_string(gathered[r].view.size()) + " bytes; " + std::to_string(size()) +
                                      " ranks of " + std::to_string(local[0].view.size()) + " need " +
                                      std::to_string(want)));
      }
    }
    run("all_gather", [&](int r) {
      return group_->communicator(r)->all_gather(stream(r), local[r].view, gathered[r].view);
    });
  }

  void broadcast(nb::handle buffers, int root) {
    const std::vector<PyView> views = rank_views(buffers, "broadcast");
    if (root < 0 || root >= size()) {
      raise_status(out_of_range("broadcast: root " + std::to_string(root) + " is not in [0, " +
                                std::to_string(size()) + ")"));
    }
    check_dtypes(views, views[root].dtype, "broadcast");
    check_same_size(views, "broadcast");
    run("broadcast", [&](int r) { return group_->communicator(r)->broadcast(stream(r), views[r].view, root); });
  }

  void barrier() {
    run("barrier", [&](int r) { return group_->communicator(r)->barrier(stream(r)); });
  }

  void close() {
    without_gil([&] {
      for (const auto& st : states_) st->close();
    });
  }

 private:
  Status create(int devices, const hal::DeviceSpec& spec) {
    NPURT_ASSIGN_OR_RETURN(group_, comm::DeviceGroup::create("sim", devices, spec));
    for (int r = 0; r < group_->size(); ++r) {
      NPURT_ASSIGN_OR_RETURN(std::shared_ptr<exec::StreamPool> pool,
                             group_->runtime(r).make_stream_pool("python group collectives"));
      pools_.push_back(std::move(pool));
    }
    return ok_status();
  }

  // The stream of the collective run_locked() is running on rank `rank`.
  hal::StreamId stream(int rank) const { return leases_[rank].stream; }

  // One view per rank, in rank order, each on that rank's device.
  std::vector<PyView> rank_views(nb::handle objs, const std::string& what) const {
    if (!nb::isinstance<nb::list>(objs) && !nb::isinstance<nb::tuple>(objs)) {
      raise_status(invalid_argument(what + ": expected a list of one Buffer or View per rank, got " +
                                    nb::cast<std::string>(nb::repr(objs))));
    }
    std::vector<PyView> views;
    for (nb::handle h : objs) views.push_back(as_view(h, what, static_cast<int>(views.size())));
    if (static_cast<int>(views.size()) != size()) {
      raise_status(invalid_argument(what + ": " + std::to_string(views.size()) + " buffers for a group of " +
                                    std::to_string(size()) + " devices (one per rank, in rank order)"));
    }
    for (int r = 0; r < size(); ++r) {
      if (views[r].state != states_[r]) {
        raise_status(invalid_argument(what + ": buffer " + std::to_string(r) + " ('" + views[r].name +
                                      "') is not on rank " + std::to_string(r) + "'s device (group.device(" +
                                      std::to_string(r) + "))"));
      }
    }
    return views;
  }

  static PyView as_view(nb::handle h, const std::string& what, int index) {
    if (nb::isinstance<PyBuffer>(h)) return nb::cast<PyBuffer&>(h).whole;
    if (nb::isinstance<PyView>(h)) return nb::cast<PyView&>(h);
    raise_status(invalid_argument(what + ": entry " + std::to_string(index) + " is not an npurt.Buffer or View: " +
                                  nb::cast<std::string>(nb::repr(h))));
  }

  static void check_dtypes(const std::vector<PyView>& views, isa::DType t, const std::string& what) {
    for (size_t r = 0; r < views.size(); ++r) {
      if (views[r].dtype != t) {
        raise_dtype_error(what + ": buffer " + std::to_string(r) + " holds " + dtype_description(views[r].dtype) +
                          ", not " + dtype_description(t));
      }
    }
  }

  // Every rank must send as many bytes: a mismatch would leave ranks waiting.
  static void check_same_size(const std::vector<PyView>& views, const std::string& what) {
    for (size_t r = 1; r < views.size(); ++r) {
      if (views[r].view.size() != views[0].view.size()) {
        raise_status(invalid_argument(what + ": buffer " + std::to_string(r) + " holds " +
                                      std::to_string(views[r].view.size()) + " bytes, buffer 0 " +
                                      std::to_string(views[0].view.size()) + "; every rank's must be the same size"));
      }
    }
  }

  // Enqueues enqueue(r) for every rank, then waits for every rank's stream; raises
  // the first failure. Without the GIL, one collective of the group at a time (ranks
  // must issue theirs in the same order). A device closed meanwhile fails it as
  // "device is closed", naming the rank.
  void run(const std::string& what, const std::function<Status(int)>& enqueue) {
    Status s;
    {
      nb::gil_scoped_release release;
      std::lock_guard<std::mutex> one_at_a_time(mu_);
      s = run_locked(what, enqueue);
      if (s.code() == StatusCode::kFailedPrecondition) s = closed_rank(what).value_or(s);
    }
    check(s);
  }

  std::optional<Status> closed_rank(const std::string& what) const {
    for (int r = 0; r < size(); ++r) {
      if (states_[r]->closed) return closed_error().with_context(what + " on rank " + std::to_string(r));
    }
    return std::nullopt;
  }

  Status run_locked(const std::string& what, const std::function<Status(int)>& enqueue) {
    if (std::optional<Status> closed = closed_rank(what)) return *closed;
    leases_.clear();
    for (int r = 0; r < size(); ++r) {
      StatusOr<exec::SlotLease> lease = pools_[r]->acquire();
      if (!lease.ok()) {
        for (int e = 0; e < r; ++e) pools_[e]->finish(leases_[e]).ignore();
        return lease.status().with_context(what + " on rank " + std::to_string(r));
      }
      leases_.push_back(*lease);
    }
    Status first;
    int enqueued = 0;
    for (; enqueued < size(); ++enqueued) {
      first = enqueue(enqueued).with_context("rank " + std::to_string(enqueued));
      if (!first.ok()) break;
    }
    // Ranks already enqueued wait for this one: make them fail now, not at the timeout.
    if (!first.ok() && enqueued > 0) group_->communicator(enqueued)->abort(first);
    // A failed stream is replaced by its pool at the next acquire.
    for (int r = 0; r < size(); ++r) {
      Status done = pools_[r]->finish(leases_[r]);
      if (r < enqueued && first.ok()) first = done;
    }
    return first;
  }

  std::shared_ptr<comm::DeviceGroup> group_;
  std::vector<std::shared_ptr<DeviceState>> states_;  // one per rank; the group's Devices share them
  // One pool per rank for the collectives, and the streams of the one running; guarded by mu_.
  std::vector<std::shared_ptr<exec::StreamPool>> pools_;
  std::vector<exec::SlotLease> leases_;
  std::mutex mu_;
};

}  // namespace

void bind_group(nb::module_& m) {
  nb::class_<PyDeviceGroup>(m, "DeviceGroup",
                            "Simulated NPUs in this process, each with its own memory, cores and streams "
                            "(an npurt.Device per rank), joined by an in-process communicator.\n\n"
                            "The collectives take one Buffer or View per rank, in rank order, each on "
                            "that rank's device; they run on every device and return when all are done. "
                            "A collective that fails leaves the group failed: later ones raise too.")
      .def(nb::init<int, uint32_t, uint64_t>(), nb::arg("devices"), nb::arg("cores") = 2,
           nb::arg("memory") = 1ull << 30,
           "`devices` simulated NPUs of `cores` cores and `memory` bytes of global memory each "
           "(reserved lazily). Bad options raise InvalidArgumentError naming the field.")
      .def_prop_ro("size", &PyDeviceGroup::size, "Devices in the group.")
      .def("__len__", &PyDeviceGroup::size)
      .def("device", &PyDeviceGroup::device, nb::arg("rank"),
           "Rank `rank`'s npurt.Device (the same device every call); OutOfRangeError outside the group.")
      .def_prop_ro("devices", &PyDeviceGroup::devices, nb::sig("def devices(self) -> list[Device]"),
                   "Every rank's npurt.Device, in rank order.")
      .def("all_reduce", &PyDeviceGroup::all_reduce, nb::arg("buffers"), nb::arg("dtype") = nb::none(),
           nb::sig("def all_reduce(self, buffers: typing.Sequence[Buffer | View], dtype: object = None) -> None"),
           "Sums the ranks' buffers elementwise, in place: every buffer ends with the same "
           "bytes (ranks added in rank order). `dtype` is float32 or bfloat16 (default: the "
           "buffers'); bfloat16 sums are formed in float32 and rounded once per addition.")
      .def("all_gather", &PyDeviceGroup::all_gather, nb::arg("locals"), nb::arg("gathereds"),
           nb::sig("def all_gather(self, locals: typing.Sequence[Buffer | View], "
                   "gathereds: typing.Sequence[Buffer | View]) -> None"),
           "Every rank's gathered buffer (size x a local's elements) receives every rank's "
           "local buffer, in rank order.")
      .def("broadcast", &PyDeviceGroup::broadcast, nb::arg("buffers"), nb::arg("root"),
           nb::sig("def broadcast(self, buffers: typing.Sequence[Buffer | View], root: int) -> None"),
           "Every rank's buffer receives the bytes of rank `root`'s.")
      .def("barrier", &PyDeviceGroup::barrier,
           "Returns once every rank's device reached it (after the work enqueued before it).")
      .def("close", &PyDeviceGroup::close,
           "Closes every rank's device (see Device.close); later collectives raise FailedPreconditionError.")
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); },
           nb::sig("def __enter__(self) -> DeviceGroup"))
      .def(
          "__exit__", [](PyDeviceGroup& g, nb::args) { g.close(); },
          nb::sig("def __exit__(self, *args: object) -> None"));
}

}  // namespace npurt::python
