// The operator library: one Python class per operator (keyword parameters as in the
// C++ params structs, dtypes as numpy dtypes or npurt names), compile() to a Kernel,
// signature() and the f32 host reference().
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "device_objects.h"
#include "npurt/isa/disasm.h"
#include "npurt/ops/argmax.h"
#include "npurt/ops/attention.h"
#include "npurt/ops/copy.h"
#include "npurt/ops/elementwise.h"
#include "npurt/ops/embedding.h"
#include "npurt/ops/gemm.h"
#include "npurt/ops/gemv.h"
#include "npurt/ops/rmsnorm.h"
#include "npurt/ops/rope.h"
#include "npurt/ops/softmax.h"
#include "isa_objects.h"
#include "ops_objects.h"

namespace npurt::python {

using namespace nb::literals;

std::string access_string(isa::Access a) { return std::string(isa::access_name(a)); }

std::vector<PyArg> make_args(const std::vector<isa::ArgSpec>& args) {
  std::vector<PyArg> r;
  for (const isa::ArgSpec& a : args) {
    r.push_back(PyArg{a.name, a.is_scalar() ? "scalar" : "buffer", access_string(a.access),
                      std::string(isa::dtype_name(a.dtype)), a.elements});
  }
  return r;
}

namespace {

struct PyKernel {
  ops::Kernel kernel;
};

// Subclasses only give Python distinct types; the operator lives in the base.
#define NPURT_OP_TYPE(Name) \
  struct Py##Name : PyOperator {};
NPURT_OP_TYPE(Gemv)
NPURT_OP_TYPE(Gemm)
NPURT_OP_TYPE(RmsNorm)
NPURT_OP_TYPE(Elementwise)
NPURT_OP_TYPE(Softmax)
NPURT_OP_TYPE(Rope)
NPURT_OP_TYPE(DecodeAttention)
NPURT_OP_TYPE(Embedding)
NPURT_OP_TYPE(Argmax)
NPURT_OP_TYPE(Copy)
NPURT_OP_TYPE(StridedCopy)
NPURT_OP_TYPE(Transpose)
#undef NPURT_OP_TYPE

template <typename Op, typename Params>
void init_op(PyOperator* self, const Params& p) {
  new (self) PyOperator{std::make_shared<Op>(p)};
}

template <typename E>
E parse_enum(const std::string& what, const std::string& s, std::initializer_list<std::pair<const char*, E>> names) {
  std::string allowed;
  for (const auto& [n, e] : names) {
    if (s == n) return e;
    allowed += (allowed.empty() ? "'" : ", '") + std::string(n) + "'";
  }
  check(invalid_argument(what + " must be one of " + allowed + ", got '" + s + "'"));
  return names.begin()->second;
}

isa::DType dt(nb::handle h) { return parse_dtype(h); }

ops::Target target_for(std::optional<nb::handle> device, std::optional<uint32_t> cores,
                       std::optional<uint32_t> local_bytes) {
  ops::Target t;
  if (device && !device->is_none()) {
    PyDevice& d = nb::cast<PyDevice&>(*device);
    t = device_run(*d.state, [&] { return ops::Target::of(d.state->runtime->device().info()); });
  }
  if (cores) t.cores = *cores;
  if (local_bytes) t.local_bytes = *local_bytes;
  return t;
}

nb::bytes to_bytes(std::span<const uint8_t> b) { return nb::bytes(reinterpret_cast<const char*>(b.data()), b.size()); }

// Host reference over numpy arrays: inputs by argument name, scalars by keyword.
nb::dict run_reference(const ops::Operator& op, nb::dict inputs, nb::kwargs scalars) {
  check(op.validate());
  const std::vector<isa::ArgSpec> sig = op.signature();
  nb::module_ np = nb::module_::import_("numpy");
  for (auto [key, value] : inputs) {
    const std::string name = py_str(key);
    bool known = false;
    for (const isa::ArgSpec& a : sig) known |= (a.name == name && !a.is_scalar());
    if (!known) check(not_found(op.name() + ": no buffer argument '" + name + "'"));
  }
  std::string unknown, names;
  size_t count = 0;
  for (auto [key, value] : scalars) {
    const std::string name = py_str(key);
    bool known = false;
    for (const isa::ArgSpec& a : sig) known |= (a.name == name && a.is_scalar());
    if (!known) unknown += (count++ == 0 ? "'" : ", '") + name + "'";
  }
  if (count > 0) {
    for (const isa::ArgSpec& a : sig) {
      if (a.is_scalar()) names += (names.empty() ? "" : ", ") + a.name;
    }
    check(invalid_argument(op.name() + ": unknown scalar" + (count > 1 ? "s " : " ") + unknown +
                           (names.empty() ? " (it takes no scalars)" : " (its scalars: " + names + ")")));
  }
  std::vector<std::vector<uint8_t>> bytes(sig.size());
  std::vector<ops::HostArg> args;
  for (size_t i = 0; i < sig.size(); ++i) {
    const isa::ArgSpec& a = sig[i];
    if (a.is_scalar()) {
      if (!scalars.contains(a.name.c_str())) {
        check(invalid_argument(op.name() + ": no value for scalar '" + a.name + "'"));
      }
      nb::handle v = scalars[a.name.c_str()];
      if (a.dtype == isa::DType::kF32) {
        args.push_back(ops::HostArg::f32(nb::cast<float>(v)));
      } else {
        if (!nb::isinstance<nb::int_>(v)) {
          check(invalid_argument(op.name() + ": scalar '" + a.name + "' is an integer, got " +
                                 nb::cast<std::string>(nb::repr(v))));
        }
        args.push_back(ops::HostArg::i64(nb::cast<int64_t>(v)));
      }
      continue;
    }
    bytes[i].assign(a.bytes(), 0xFF);  // outputs start as NaN / -1
    if (inputs.contains(a.name.c_str())) {
      nb::object arr = np.attr("ascontiguousarray")(inputs[a.name.c_str()]);
      nb::object want = numpy_dtype(a.dtype);
      if (!arr.attr("dtype").equal(want)) {
        raise_dtype_error(op.name() + ": argument '" + a.name + "' holds " + dtype_description(a.dtype) +
                          ", got an array of " + py_str(arr.attr("dtype")));
      }
      const uint64_t nbytes = nb::cast<uint64_t>(arr.attr("nbytes"));
      if (nbytes != a.bytes()) {
        check(invalid_argument(op.name() + ": argument '" + a.name + "' holds " + std::to_string(a.bytes()) +
                               " bytes, got an array of " + std::to_string(nbytes)));
      }
      nb::bytes raw = nb::cast<nb::bytes>(arr.attr("tobytes")());
      std::memcpy(bytes[i].data(), raw.c_str(), a.bytes());
    } else if (a.reads()) {
      check(invalid_argument(op.name() + ": no array for input '" + a.name + "'"));
    }
    args.push_back(ops::HostArg::buffer(bytes[i]));
  }
  check(op.reference(args));
  nb::dict out;
  for (size_t i = 0; i < sig.size(); ++i) {
    const isa::ArgSpec& a = sig[i];
    if (a.is_scalar() || !a.writes()) continue;
    nb::object raw = to_bytes(bytes[i]);
    out[a.name.c_str()] = np.attr("frombuffer")(raw, numpy_dtype(a.dtype)).attr("copy")();
  }
  return out;
}

}  // namespace

void bind_ops(nb::module_& m) {
  nb::class_<PyArg>(m, "Arg", "One argument of an operator's kernel.")
      .def_ro("name", &PyArg::name)
      .def_ro("kind", &PyArg::kind, "'buffer' or 'scalar'")
      .def_ro("access", &PyArg::access, "'in', 'out' or 'inout'")
      .def_ro("type_name", &PyArg::type_name, "npurt element type (f32, bf16, q8_0, ...)")
      .def_ro("elements", &PyArg::elements, "element count of a buffer argument (0 for scalars)")
      .def("__repr__", [](const PyArg& a) {
        return "Arg(" + a.name + ", " + a.kind + ", " + a.access + ", " + a.type_name +
               (a.kind == "buffer" ? ", " + std::to_string(a.elements) : std::string()) + ")";
      });

  nb::class_<PyKernel>(m, "Kernel", "A compiled operator: a verified image, its grid and its arguments.")
      .def_prop_ro("name", [](const PyKernel& k) { return k.kernel.image.name(); })
      .def_prop_ro("grid", [](const PyKernel& k) { return k.kernel.grid; }, "Blocks per launch.")
      .def_prop_ro(
          "args",
          [](const PyKernel& k) { return make_args(k.kernel.args); },
          "The arguments in kernel order.")
      .def_prop_ro("image", [](const PyKernel& k) { return PyImage{k.kernel.image}; },
                   "The verified image (npurt.isa.Image: bytes, hash, disassemble(), save()).")
      .def_prop_ro("uses_barrier", [](const PyKernel& k) { return k.kernel.image.uses_barrier(); })
      .def("disassemble", [](const PyKernel& k) { return isa::disassemble(k.kernel.image); },
           "The image's disassembly, one instruction per line.")
      .def("__repr__", [](const PyKernel& k) {
        return "<npurt.Kernel '" + k.kernel.image.name() + "' grid " + std::to_string(k.kernel.grid) + ", " +
               std::to_string(k.kernel.image.bytes().size()) + " bytes>";
      });

  nb::class_<PyOperator>(m, "Operator",
                         "An operator: parameters that compile to one kernel, with an f32 host reference.")
      .def_prop_ro("name", [](const PyOperator& o) { return o.op->name(); }, "Kind and shape, e.g. 'gemv bf16 64x640'.")
      .def(
          "signature",
          [](const PyOperator& o) {
            check(o.op->validate());
            return make_args(o.op->signature());
          },
          "The kernel's arguments (names, directions, dtypes, element counts), from the "
          "parameters alone.")
      .def(
          "compile",
          [](const PyOperator& o, std::optional<nb::handle> device, std::optional<uint32_t> cores,
             std::optional<uint32_t> local_bytes) {
            const ops::Target t = target_for(device, cores, local_bytes);
            std::optional<ops::Kernel> k;
            Status s;
            {
              nb::gil_scoped_release release;
              auto r = o.op->compile(t);
              if (r.ok()) {
                k.emplace(std::move(r).value());
              } else {
                s = r.status();
              }
            }
            check(s);
            return PyKernel{std::move(*k)};
          },
          "device"_a = nb::none(), "cores"_a = nb::none(), "local_bytes"_a = nb::none(),
          nb::sig("def compile(self, device: Device | None = None, cores: int | None = None, "
                  "local_bytes: int | None = None) -> Kernel"),
          "Validates the parameters and compiles the kernel for `device` (or for `cores` "
          "cores with `local_bytes` of local memory each; default 8 and 256 KiB). A bad "
          "parameter raises InvalidArgumentError naming it.")
      .def(
          "reference",
          [](const PyOperator& o, nb::dict inputs, nb::kwargs scalars) {
            return run_reference(*o.op, inputs, scalars);
          },
          "inputs"_a, "scalars"_a,
          nb::sig("def reference(self, inputs: dict[str, numpy.ndarray], /, **scalars: int | float) "
                  "-> dict[str, numpy.ndarray]"),
          "Runs the f32 host reference on numpy arrays (inputs by argument name, in the "
          "argument's dtype) and returns the outputs by name.")
      .def("__repr__", [](const PyOperator& o) { return "<npurt.ops " + o.op->name() + ">"; });

  nb::class_<PyGemv, PyOperator>(m, "Gemv", "y = epilogue(A x): A is m x k (`weight` dtype), x and y f32.")
      .def(
          "__init__",
          [](PyGemv* self, uint64_t m_, uint64_t k, nb::handle weight, const std::string& epilogue,
             uint32_t rows_per_tile, uint32_t k_tile, uint32_t cores) {
            init_op<ops::Gemv>(self, ops::GemvParams{
                                         .m = m_,
                                         .k = k,
                                         .weight = dt(weight),
                                         .epilogue = parse_enum<ops::GemvEpilogue>(
                                             "gemv epilogue", epilogue,
                                             {{"none", ops::GemvEpilogue::kNone},
                                              {"gelu_tanh", ops::GemvEpilogue::kGeluTanh},
                                              {"silu", ops::GemvEpilogue::kSilu}}),
                                         .rows_per_tile = rows_per_tile,
                                         .k_tile = k_tile,
                                         .cores = cores,
                                     });
          },
          "m"_a, "k"_a, "weight"_a = "f32", "epilogue"_a = "none", "rows_per_tile"_a = 0, "k_tile"_a = 0,
          "cores"_a = 0,
          nb::sig("def __init__(self, m: int, k: int, weight: object = 'f32', epilogue: str = 'none', "
                  "rows_per_tile: int = 0, k_tile: int = 0, cores: int = 0) -> None"));

  nb::class_<PyGemm, PyOperator>(m, "Gemm", "C = A B: A m x k, B k x n (or n x k with b_layout='col_major').")
      .def(
          "__init__",
          [](PyGemm* self, uint64_t m_, uint64_t n, uint64_t k, nb::handle dtype, nb::handle out_dtype,
             const std::string& b_layout, uint32_t tile_m, uint32_t tile_n, uint32_t tile_k, uint32_t cores) {
            init_op<ops::Gemm>(self, ops::GemmParams{
                                         .m = m_,
                                         .n = n,
                                         .k = k,
                                         .dtype = dt(dtype),
                                         .out_dtype = dt(out_dtype),
                                         .b_layout = parse_enum<ops::GemmBLayout>(
                                             "gemm b_layout", b_layout,
                                             {{"row_major", ops::GemmBLayout::kRowMajor},
                                              {"col_major", ops::GemmBLayout::kColMajor}}),
                                         .tile_m = tile_m,
                                         .tile_n = tile_n,
                                         .tile_k = tile_k,
                                         .cores = cores,
                                     });
          },
          "m"_a, "n"_a, "k"_a, "dtype"_a = "f32", "out_dtype"_a = "f32", "b_layout"_a = "row_major",
          "tile_m"_a = 0, "tile_n"_a = 0, "tile_k"_a = 0, "cores"_a = 0,
          nb::sig("def __init__(self, m: int, n: int, k: int, dtype: object = 'f32', out_dtype: object = 'f32', "
                  "b_layout: str = 'row_major', tile_m: int = 0, tile_n: int = 0, tile_k: int = 0, "
                  "cores: int = 0) -> None"));

  nb::class_<PyRmsNorm, PyOperator>(m, "RmsNorm", "RMS normalization of each of `rows` rows of `dim` values.")
      .def(
          "__init__",
          [](PyRmsNorm* self, uint32_t dim, uint64_t rows, float eps, bool weighted, nb::handle dtype,
             uint32_t rows_per_tile, uint32_t cores) {
            init_op<ops::RmsNorm>(self, ops::RmsNormParams{.rows = rows, .dim = dim, .eps = eps, .weighted = weighted,
                .dtype = dt(dtype), .rows_per_tile = rows_per_tile, .cores = cores});
          },
          "dim"_a, "rows"_a = 1, "eps"_a = 1e-6f, "weighted"_a = true, "dtype"_a = "f32", "rows_per_tile"_a = 0,
          "cores"_a = 0,
          nb::sig("def __init__(self, dim: int, rows: int = 1, eps: float = 1e-06, weighted: bool = True, "
                  "dtype: object = 'f32', rows_per_tile: int = 0, cores: int = 0) -> None"));

  nb::class_<PyElementwise, PyOperator>(
      m, "Elementwise", "out = kind(a[, b]); kind is 'add', 'mul', 'gelu_tanh', 'silu' or 'gelu_tanh_mul'.")
      .def(
          "__init__",
          [](PyElementwise* self, const std::string& kind, uint64_t n, nb::handle dtype, uint32_t tile,
             uint32_t cores) {
            init_op<ops::Elementwise>(
                self, ops::ElementwiseParams{.kind = parse_enum<ops::ElementwiseKind>(
                                                 "elementwise kind", kind,
                                                 {{"add", ops::ElementwiseKind::kAdd},
                                                  {"mul", ops::ElementwiseKind::kMul},
                                                  {"gelu_tanh", ops::ElementwiseKind::kGeluTanh},
                                                  {"silu", ops::ElementwiseKind::kSilu},
                                                  {"gelu_tanh_mul", ops::ElementwiseKind::kGeluTanhMul}}),
                                             .n = n,
                                             .dtype = dt(dtype),
                                             .tile = tile,
                                             .cores = cores});
          },
          "kind"_a, "n"_a, "dtype"_a = "f32", "tile"_a = 0, "cores"_a = 0,
          nb::sig("def __init__(self, kind: str, n: int, dtype: object = 'f32', tile: int = 0, "
                  "cores: int = 0) -> None"));

  nb::class_<PySoftmax, PyOperator>(m, "Softmax", "Row softmax with optional causal and sliding-window masks.")
      .def(
          "__init__",
          [](PySoftmax* self, uint32_t cols, uint64_t rows, bool causal, uint32_t window,
             std::optional<int64_t> offset, uint32_t rows_per_tile, uint32_t cores) {
            init_op<ops::Softmax>(self, ops::SoftmaxParams{.rows = rows, .cols = cols, .causal = causal,
                .window = window, .offset = offset, .rows_per_tile = rows_per_tile, .cores = cores});
          },
          "cols"_a, "rows"_a = 1, "causal"_a = false, "window"_a = 0, "offset"_a = nb::none(),
          "rows_per_tile"_a = 0, "cores"_a = 0);

  nb::class_<PyRope, PyOperator>(m, "Rope", "NeoX half-rotation RoPE; runtime scalars `pos` (int) and `base` (float).")
      .def(
          "__init__",
          [](PyRope* self, uint32_t n_heads, uint32_t head_dim, uint32_t rotary_dim, uint32_t heads_per_tile,
             uint32_t cores) {
            init_op<ops::Rope>(self, ops::RopeParams{.n_heads = n_heads, .head_dim = head_dim,
                .rotary_dim = rotary_dim, .heads_per_tile = heads_per_tile, .cores = cores});
          },
          "n_heads"_a, "head_dim"_a, "rotary_dim"_a = 0, "heads_per_tile"_a = 0, "cores"_a = 0);

  nb::class_<PyDecodeAttention, PyOperator>(
      m, "DecodeAttention", "One query position against a KV cache; runtime scalar `len` (positions).")
      .def(
          "__init__",
          [](PyDecodeAttention* self, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim, uint32_t max_len,
             uint32_t window, float scale, nb::handle kv_dtype, uint32_t tile_t, uint32_t cores,
             bool split_positions) {
            init_op<ops::DecodeAttention>(self, ops::DecodeAttentionParams{.n_heads = n_heads,
                .n_kv_heads = n_kv_heads, .head_dim = head_dim, .max_len = max_len, .window = window, .scale = scale,
                .kv_dtype = dt(kv_dtype), .tile_t = tile_t, .cores = cores, .split_positions = split_positions});
          },
          "n_heads"_a, "n_kv_heads"_a, "head_dim"_a, "max_len"_a, "window"_a = 0, "scale"_a = 0.0f,
          "kv_dtype"_a = "f32", "tile_t"_a = 0, "cores"_a = 0, "split_positions"_a = false,
          nb::sig("def __init__(self, n_heads: int, n_kv_heads: int, head_dim: int, max_len: int, "
                  "window: int = 0, scale: float = 0.0, kv_dtype: object = 'f32', tile_t: int = 0, "
                  "cores: int = 0, split_positions: bool = False) -> None"));

  nb::class_<PyEmbedding, PyOperator>(m, "Embedding", "One row of a vocab x dim table, scaled; runtime scalar `token`.")
      .def(
          "__init__",
          [](PyEmbedding* self, uint64_t vocab, uint32_t dim, nb::handle dtype, float scale) {
            init_op<ops::Embedding>(
                self, ops::EmbeddingParams{.vocab = vocab, .dim = dim, .dtype = dt(dtype), .scale = scale});
          },
          "vocab"_a, "dim"_a, "dtype"_a = "f32", "scale"_a = 1.0f,
          nb::sig("def __init__(self, vocab: int, dim: int, dtype: object = 'f32', scale: float = 1.0) -> None"));

  nb::class_<PyArgmax, PyOperator>(m, "Argmax", "Index (int32) of the first maximum of n f32 values.")
      .def(
          "__init__",
          [](PyArgmax* self, uint64_t n, uint32_t chunk) {
            init_op<ops::Argmax>(self, ops::ArgmaxParams{.n = n, .chunk = chunk});
          },
          "n"_a, "chunk"_a = 0);

  nb::class_<PyCopy, PyOperator>(m, "Copy", "dst = src, converting between plain dtypes.")
      .def(
          "__init__",
          [](PyCopy* self, uint64_t n, nb::handle src_dtype, nb::handle dst_dtype, uint32_t tile, uint32_t cores) {
            init_op<ops::Copy>(self, ops::CopyParams{.n = n, .src_dtype = dt(src_dtype), .dst_dtype = dt(dst_dtype),
                .tile = tile, .cores = cores});
          },
          "n"_a, "src_dtype"_a = "f32", "dst_dtype"_a = "f32", "tile"_a = 0, "cores"_a = 0,
          nb::sig("def __init__(self, n: int, src_dtype: object = 'f32', dst_dtype: object = 'f32', "
                  "tile: int = 0, cores: int = 0) -> None"));

  nb::class_<PyStridedCopy, PyOperator>(m, "StridedCopy",
                                        "Rows of `cols` values between strided layouts (the KV-cache append).")
      .def(
          "__init__",
          [](PyStridedCopy* self, uint32_t cols, uint64_t rows, uint64_t src_stride, uint64_t dst_stride,
             uint64_t dst_rows, bool dst_row_runtime, nb::handle src_dtype, nb::handle dst_dtype,
             uint32_t rows_per_tile, uint32_t cores) {
            init_op<ops::StridedCopy>(self, ops::StridedCopyParams{.rows = rows, .cols = cols,
                .src_stride = src_stride, .dst_stride = dst_stride, .dst_rows = dst_rows,
                .dst_row_runtime = dst_row_runtime, .src_dtype = dt(src_dtype), .dst_dtype = dt(dst_dtype),
                .rows_per_tile = rows_per_tile, .cores = cores});
          },
          "cols"_a, "rows"_a = 1, "src_stride"_a = 0, "dst_stride"_a = 0, "dst_rows"_a = 0,
          "dst_row_runtime"_a = false, "src_dtype"_a = "f32", "dst_dtype"_a = "f32", "rows_per_tile"_a = 0,
          "cores"_a = 0,
          nb::sig("def __init__(self, cols: int, rows: int = 1, src_stride: int = 0, dst_stride: int = 0, "
                  "dst_rows: int = 0, dst_row_runtime: bool = False, src_dtype: object = 'f32', "
                  "dst_dtype: object = 'f32', rows_per_tile: int = 0, cores: int = 0) -> None"));

  nb::class_<PyTranspose, PyOperator>(m, "Transpose", "dst (cols x rows) = src (rows x cols) transposed.")
      .def(
          "__init__",
          [](PyTranspose* self, uint64_t rows, uint64_t cols, nb::handle dtype, uint32_t tile_rows,
             uint32_t tile_cols, uint32_t cores) {
            init_op<ops::Transpose>(self, ops::TransposeParams{.rows = rows, .cols = cols, .dtype = dt(dtype),
                .tile_rows = tile_rows, .tile_cols = tile_cols, .cores = cores});
          },
          "rows"_a, "cols"_a, "dtype"_a = "f32", "tile_rows"_a = 0, "tile_cols"_a = 0, "cores"_a = 0,
          nb::sig("def __init__(self, rows: int, cols: int, dtype: object = 'f32', tile_rows: int = 0, "
                  "tile_cols: int = 0, cores: int = 0) -> None"));
}

}  // namespace npurt::python
