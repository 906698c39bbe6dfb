// npurt.isa: the tile-ISA kernel builder (Builder, Reg, Tile) and verified images
// (Image) -- the Python face of isa/builder.h, isa/image.h and isa/disasm.h.
//
// Registers are Reg and Tile objects, never bare ints, so an immediate can never be
// taken for a register. Operands are encoded as given (0..255): a register the ISA
// does not have is refused by build()'s verifier, naming the instruction, as in C++.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common.h"
#include "isa_objects.h"
#include "npurt/exec/code_registry.h"
#include "npurt/isa/assembler.h"
#include "npurt/isa/builder.h"
#include "npurt/isa/disasm.h"
#include "npurt/isa/names.h"
#include "ops_objects.h"

namespace npurt::python {

std::vector<PyArg> make_args(const std::vector<isa::ArgSpec>& args);  // ops.cc

namespace {

using namespace nb::literals;

struct PyReg {
  uint8_t index;
};
struct PyTile {
  uint8_t index;
};

uint8_t operand_byte(int64_t v, const char* what) {
  if (v < 0 || v > 255) check(invalid_argument(std::string(what) + " index must be 0..255, got " + std::to_string(v)));
  return static_cast<uint8_t>(v);
}

isa::Reg reg(const PyReg& r) { return isa::Reg{r.index}; }
isa::Tile tile(const PyTile& t) { return isa::Tile{t.index}; }
std::optional<isa::Reg> opt_reg(const std::optional<PyReg>& r) {
  return r ? std::optional<isa::Reg>(reg(*r)) : std::nullopt;
}

// A memory operand: an argument index (what arg_buffer returned) or "const".
using ArgOperand = std::variant<int64_t, std::string>;
uint8_t arg_operand(const ArgOperand& a) {
  if (const auto* s = std::get_if<std::string>(&a)) {
    if (*s == "const") return isa::kConstArg;
    check(invalid_argument("a memory operand is an argument index or 'const', got '" + *s + "'"));
  }
  return operand_byte(std::get<int64_t>(a), "argument");
}

// Sub-op names: the ones `npurt disasm` prints ("add", "silu", ...).
template <typename E>
E sub_op(isa::SubOpFamily family, const std::string& name) {
  return static_cast<E>(take(isa::parse_sub_op(family, name)));
}

isa::Access parse_access(const std::string& s) {
  if (s == "in") return isa::Access::kIn;
  if (s == "out") return isa::Access::kOut;
  if (s == "inout") return isa::Access::kInOut;
  check(invalid_argument("access must be 'in', 'out' or 'inout', got '" + s + "'"));
  return isa::Access::kIn;
}

uint8_t parse_bcast(const std::string& s) {
  if (s == "none") return isa::kBcastNone;
  if (s == "row") return isa::kBcastRow;
  if (s == "col") return isa::kBcastCol;
  check(invalid_argument("broadcast must be 'none', 'row' or 'col', got '" + s + "'"));
  return isa::kBcastNone;
}

isa::Dim dim(const std::variant<int64_t, PyReg>& d) {
  if (const auto* r = std::get_if<PyReg>(&d)) return isa::Dim(reg(*r));
  const int64_t v = std::get<int64_t>(d);
  if (v < 0 || v > 65535) check(invalid_argument("a tile dimension must be 0..65535, got " + std::to_string(v)));
  return isa::Dim(static_cast<int>(v));
}

struct PyBuilder {
  isa::KernelBuilder b;
};

// `with b.loop(r3):` -- loop_begin on entry, loop_end on exit.
struct PyLoopScope {
  nb::object builder;
  isa::Reg count;
};

nb::bytes to_bytes(std::span<const uint8_t> b) { return nb::bytes(reinterpret_cast<const char*>(b.data()), b.size()); }

std::vector<uint8_t> bytes_of(nb::handle data) {
  // Anything with the buffer protocol or numpy's tobytes (arrays of any dtype).
  nb::object raw = nb::hasattr(data, "tobytes") ? data.attr("tobytes")() : nb::bytes(data);
  if (!nb::isinstance<nb::bytes>(raw)) raw = nb::module_::import_("builtins").attr("bytes")(data);
  const nb::bytes b = nb::cast<nb::bytes>(raw);
  const auto* p = reinterpret_cast<const uint8_t*>(b.c_str());
  return std::vector<uint8_t>(p, p + b.size());
}


PyImage image_from(StatusOr<isa::Image> image) { return PyImage{take(std::move(image))}; }

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) check(not_found("cannot open '" + path + "'"));
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

}  // namespace

std::string image_hash_hex(const isa::Image& image) {
  const exec::CodeHash h = exec::hash_code(image.bytes());
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(h.hi),
                static_cast<unsigned long long>(h.lo));
  return buf;
}

void bind_isa(nb::module_& m) {
  nb::class_<PyReg>(m, "Reg", "A scalar register r0..r31 (npurt.isa.r0 ...).")
      .def("__init__", [](PyReg* self, int64_t i) { new (self) PyReg{operand_byte(i, "register")}; }, "index"_a)
      .def_prop_ro("index", [](const PyReg& r) { return r.index; })
      .def("__eq__", [](const PyReg& a, const PyReg& b) { return a.index == b.index; })
      .def("__hash__", [](const PyReg& r) { return static_cast<int>(r.index); })
      .def("__repr__", [](const PyReg& r) { return "r" + std::to_string(r.index); });
  nb::class_<PyTile>(m, "Tile", "A tile register t0..t15 (npurt.isa.t0 ...).")
      .def("__init__", [](PyTile* self, int64_t i) { new (self) PyTile{operand_byte(i, "tile")}; }, "index"_a)
      .def_prop_ro("index", [](const PyTile& t) { return t.index; })
      .def("__eq__", [](const PyTile& a, const PyTile& b) { return a.index == b.index; })
      .def("__hash__", [](const PyTile& t) { return static_cast<int>(t.index); })
      .def("__repr__", [](const PyTile& t) { return "t" + std::to_string(t.index); });

  nb::class_<PyImage>(m, "Image",
                      "A verified kernel image: header, argument signature, code and constants. "
                      "Build one with npurt.isa.Builder, load one with Image.load(), or take "
                      "an operator's (Kernel.image).")
      .def_static(
          "from_bytes",
          [](nb::handle data, uint32_t max_local_bytes) {
            return image_from(isa::Image::from_bytes(bytes_of(data), max_local_bytes));
          },
          "data"_a, "max_local_bytes"_a = 0xFFFFFFFFu,
          "Verifies `data` (bytes) and makes an Image; InvalidArgumentError names the "
          "field or instruction the verifier refused.")
      .def_static(
          "load",
          [](const std::string& path, uint32_t max_local_bytes) {
            StatusOr<isa::Image> img = isa::Image::from_bytes(read_file(path), max_local_bytes);
            if (!img.ok()) check(img.status().with_context(path));
            return PyImage{std::move(img).value()};
          },
          "path"_a, "max_local_bytes"_a = 0xFFFFFFFFu, "Reads and verifies an image file (see save()).")
      .def_static(
          "assemble",
          [](const std::string& text) { return image_from(isa::assemble(text)); }, "text"_a,
          "Assembles the text `disassemble()` prints (and `npurt asm` reads); errors name "
          "line and column.")
      .def_prop_ro("name", [](const PyImage& i) { return i.image.name(); })
      .def_prop_ro("bytes", [](const PyImage& i) { return to_bytes(i.image.bytes()); }, "The image's bytes.")
      .def_prop_ro("hash", [](const PyImage& i) { return image_hash_hex(i.image); },
                   "Content hash (XXH3-128, 32 hex digits): the code registry's dedup key.")
      .def(
          "signature", [](const PyImage& i) { return make_args(i.image.args()); },
          "The arguments in kernel order (element counts 0: an image does not record them).")
      .def_prop_ro("num_insns", [](const PyImage& i) { return i.image.code().size(); })
      .def_prop_ro("local_bytes", [](const PyImage& i) { return i.image.layout().local_bytes; },
                   "Local memory per core the kernel declares.")
      .def_prop_ro("constants", [](const PyImage& i) { return to_bytes(i.image.constants()); })
      .def_prop_ro("uses_barrier", [](const PyImage& i) { return i.image.uses_barrier(); })
      .def("disassemble", [](const PyImage& i) { return isa::disassemble(i.image); },
           "The listing `npurt disasm` prints (and Image.assemble reads back).")
      .def(
          "save",
          [](const PyImage& i, const std::string& path) {
            std::ofstream f(path, std::ios::binary | std::ios::trunc);
            const auto b = i.image.bytes();
            f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
            f.close();
            if (!f) check(internal_error("cannot write '" + path + "'"));
          },
          "path"_a, "Writes the image's bytes to `path` (`npurt disasm` and Image.load read them).")
      .def("__bytes__", [](const PyImage& i) { return to_bytes(i.image.bytes()); })
      .def("__len__", [](const PyImage& i) { return i.image.bytes().size(); })
      .def("__eq__", [](const PyImage& a, const PyImage& b) {
        return std::ranges::equal(a.image.bytes(), b.image.bytes());
      })
      .def("__hash__", [](const PyImage& i) { return static_cast<int64_t>(exec::hash_code(i.image.bytes()).lo >> 1); })
      .def("__repr__", [](const PyImage& i) {
        return "<npurt.isa.Image '" + i.image.name() + "' " + std::to_string(i.image.code().size()) + " insns, " +
               std::to_string(i.image.bytes().size()) + " bytes>";
      });

  nb::class_<PyLoopScope>(m, "LoopScope", "The context manager Builder.loop() returns.")
      .def("__enter__", [](PyLoopScope& s) {
        nb::cast<PyBuilder&>(s.builder).b.loop_begin(s.count);
      })
      .def("__exit__", [](PyLoopScope& s, nb::args) { nb::cast<PyBuilder&>(s.builder).b.loop_end(); },
           nb::sig("def __exit__(self, *args: object) -> None"));

  nb::class_<PyBuilder> b(m, "Builder",
                          "Emits a kernel image instruction by instruction (the C++ KernelBuilder): "
                          "arguments, registers, tiles, loops, constants; build() verifies it.");
  b.def("__init__", [](PyBuilder* self, const std::string& name) { new (self) PyBuilder{isa::KernelBuilder(name)}; },
        "name"_a)
      .def(
          "arg_buffer",
          [](PyBuilder& s, const std::string& name, const std::string& access, nb::handle dtype) {
            return s.b.arg_buffer(name, parse_access(access), parse_dtype(dtype));
          },
          "name"_a, "access"_a, "dtype"_a,
          "Adds a buffer argument ('in', 'out' or 'inout'; any npurt dtype) and returns its index.")
      .def(
          "arg_scalar",
          [](PyBuilder& s, const std::string& name, nb::handle dtype) {
            return s.b.arg_scalar(name, parse_dtype(dtype));
          },
          "name"_a, "dtype"_a, "Adds a scalar argument (f32 or i32) and returns its index.")
      .def(
          "add_constants", [](PyBuilder& s, nb::handle data) { return s.b.add_constants(bytes_of(data)); },
          "data"_a,
          "Appends bytes (or a numpy array's bytes) to the constant section; returns their "
          "offset, which loads from 'const' use.")
      .def("reserve_local", [](PyBuilder& s, uint32_t bytes) { s.b.reserve_local(bytes); }, "bytes"_a,
           "Declares at least `bytes` of local memory (for tiles placed by a register).")
      .def("nop", [](PyBuilder& s) { s.b.nop(); })
      .def("exit", [](PyBuilder& s) { s.b.exit(); }, "Ends the block (build() needs a final exit).")
      .def("barrier", [](PyBuilder& s) { s.b.barrier(); }, "Waits for every block of the launch.")
      .def("loop_begin", [](PyBuilder& s, const PyReg& count) { s.b.loop_begin(reg(count)); }, "count"_a,
           "Runs the code up to loop_end() r[count] times (count <= 0: not at all).")
      .def("loop_end", [](PyBuilder& s) { s.b.loop_end(); })
      .def(
          "loop", [](nb::handle self, const PyReg& count) { return PyLoopScope{nb::borrow(self), reg(count)}; },
          "count"_a, "`with b.loop(r):` -- loop_begin(r) ... loop_end().")
      .def("li", [](PyBuilder& s, const PyReg& d, int64_t v) { s.b.li(reg(d), v); }, "dst"_a, "value"_a)
      .def("mov", [](PyBuilder& s, const PyReg& d, const PyReg& r) { s.b.mov(reg(d), reg(r)); }, "dst"_a, "src"_a)
      .def(
          "special",
          [](PyBuilder& s, const PyReg& d, const std::string& which, int64_t arg) {
            s.b.special(reg(d), sub_op<isa::Special>(isa::SubOpFamily::kSpecial, which), arg);
          },
          "dst"_a, "which"_a, "arg"_a = 0, "block_id, block_count, arg_value or arg_bytes (of argument `arg`).")
      .def("block_id", [](PyBuilder& s, const PyReg& d) { s.b.block_id(reg(d)); }, "dst"_a)
      .def("block_count", [](PyBuilder& s, const PyReg& d) { s.b.block_count(reg(d)); }, "dst"_a)
      .def("arg_value", [](PyBuilder& s, const PyReg& d, int64_t a) { s.b.special(reg(d), isa::Special::kArgValue, a); },
           "dst"_a, "arg"_a, "A scalar argument's bits (f32 bits or int64).")
      .def("arg_bytes", [](PyBuilder& s, const PyReg& d, int64_t a) { s.b.special(reg(d), isa::Special::kArgBytes, a); },
           "dst"_a, "arg"_a, "A buffer argument's byte length.")
      .def(
          "alu",
          [](PyBuilder& s, const std::string& op, const PyReg& d, const PyReg& l, const PyReg& r) {
            s.b.alu(sub_op<isa::AluOp>(isa::SubOpFamily::kAlu, op), reg(d), reg(l), reg(r));
          },
          "op"_a, "dst"_a, "lhs"_a, "rhs"_a, "int64: add sub mul div rem min max shl shr and or.")
      .def(
          "alui",
          [](PyBuilder& s, const std::string& op, const PyReg& d, const PyReg& l, int64_t imm) {
            s.b.alui(sub_op<isa::AluOp>(isa::SubOpFamily::kAlu, op), reg(d), reg(l), imm);
          },
          "op"_a, "dst"_a, "lhs"_a, "imm"_a)
      .def(
          "falu",
          [](PyBuilder& s, const std::string& op, const PyReg& d, const PyReg& l, const PyReg& r) {
            s.b.falu(sub_op<isa::FaluOp>(isa::SubOpFamily::kFalu, op), reg(d), reg(l), reg(r));
          },
          "op"_a, "dst"_a, "lhs"_a, "rhs"_a, "f32: add sub mul div min max.")
      .def("i2f", [](PyBuilder& s, const PyReg& d, const PyReg& r) { s.b.i2f(reg(d), reg(r)); }, "dst"_a, "src"_a)
      .def("f2i", [](PyBuilder& s, const PyReg& d, const PyReg& r) { s.b.f2i(reg(d), reg(r)); }, "dst"_a, "src"_a)
      .def(
          "tdef",
          [](PyBuilder& s, const PyTile& t, nb::handle dtype, const std::variant<int64_t, PyReg>& rows,
             const std::variant<int64_t, PyReg>& cols, int64_t local_offset, const std::optional<PyReg>& offset_reg) {
            if (local_offset < 0 || local_offset > 0xFFFFFFFFll) {
              check(invalid_argument("local_offset must be 0..2^32-1, got " + std::to_string(local_offset)));
            }
            s.b.tdef(tile(t), parse_dtype(dtype), dim(rows), dim(cols), static_cast<uint32_t>(local_offset),
                     opt_reg(offset_reg));
          },
          "tile"_a, "dtype"_a, "rows"_a, "cols"_a, "local_offset"_a = 0, "offset_reg"_a = nb::none(),
          "Defines a tile: rows x cols (ints, or Regs read at run time) of `dtype` at local "
          "byte `local_offset` (+ offset_reg).")
      .def(
          "tld",
          [](PyBuilder& s, const PyTile& t, const ArgOperand& a, const PyReg& off, nb::handle dtype,
             const std::optional<PyReg>& stride) {
            s.b.tld(tile(t), arg_operand(a), reg(off), parse_dtype(dtype), opt_reg(stride));
          },
          "dst"_a, "arg"_a, "offset"_a, "dtype"_a, "row_stride"_a = nb::none(),
          "Loads a tile from argument `arg` (or 'const') at byte r[offset]; row stride in elements.")
      .def(
          "tst",
          [](PyBuilder& s, const PyTile& t, const ArgOperand& a, const PyReg& off, nb::handle dtype,
             const std::optional<PyReg>& stride) {
            s.b.tst(tile(t), arg_operand(a), reg(off), parse_dtype(dtype), opt_reg(stride));
          },
          "src"_a, "arg"_a, "offset"_a, "dtype"_a, "row_stride"_a = nb::none(), "Stores a tile (see tld).")
      .def(
          "tldq",
          [](PyBuilder& s, const PyTile& t, const ArgOperand& a, const PyReg& off, const PyReg& stride,
             nb::handle dtype, bool transposed) {
            s.b.tldq(tile(t), arg_operand(a), reg(off), reg(stride), parse_dtype(dtype), transposed);
          },
          "dst"_a, "arg"_a, "offset"_a, "row_stride_bytes"_a, "dtype"_a, "transposed"_a = false,
          "Dequantizes blocks into an f32 tile.")
      .def(
          "tgather",
          [](PyBuilder& s, const PyTile& t, const ArgOperand& a, const PyTile& idx, const PyReg& pitch,
             nb::handle dtype) { s.b.tgather(tile(t), arg_operand(a), tile(idx), reg(pitch), parse_dtype(dtype)); },
          "dst"_a, "arg"_a, "indices"_a, "row_pitch_bytes"_a, "dtype"_a,
          "Row i of dst = row indices[i] (an i32 tile) of the argument.")
      .def("tfill", [](PyBuilder& s, const PyTile& t, const PyReg& v) { s.b.tfill(tile(t), reg(v)); }, "dst"_a,
           "value"_a)
      .def("tcvt", [](PyBuilder& s, const PyTile& d, const PyTile& t) { s.b.tcvt(tile(d), tile(t)); }, "dst"_a,
           "src"_a)
      .def(
          "tbin",
          [](PyBuilder& s, const std::string& op, const PyTile& d, const PyTile& l, const PyTile& r,
             const std::string& bcast) {
            s.b.tbin(sub_op<isa::BinOp>(isa::SubOpFamily::kBin, op), tile(d), tile(l), tile(r), parse_bcast(bcast));
          },
          "op"_a, "dst"_a, "lhs"_a, "rhs"_a, "bcast"_a = "none",
          "Elementwise add sub mul div max min; rhs broadcast over rows ('row') or columns ('col').")
      .def(
          "tun",
          [](PyBuilder& s, const std::string& op, const PyTile& d, const PyTile& t) {
            s.b.tun(sub_op<isa::UnOp>(isa::SubOpFamily::kUn, op), tile(d), tile(t));
          },
          "op"_a, "dst"_a, "src"_a, "exp rsqrt sqrt tanh gelu_tanh silu recip neg abs sin cos log.")
      .def(
          "tsop",
          [](PyBuilder& s, const std::string& op, const PyTile& d, const PyTile& t, const PyReg& r) {
            s.b.tsop(sub_op<isa::BinOp>(isa::SubOpFamily::kBin, op), tile(d), tile(t), reg(r));
          },
          "op"_a, "dst"_a, "src"_a, "scalar"_a, "Tile op f32 scalar register.")
      .def(
          "tred",
          [](PyBuilder& s, const std::string& op, const PyTile& d, const PyTile& t) {
            s.b.tred(sub_op<isa::RedOp>(isa::SubOpFamily::kRed, op), tile(d), tile(t));
          },
          "op"_a, "dst"_a, "src"_a, "Row reduction: sum max sumsq argmax.")
      .def(
          "tbcast",
          [](PyBuilder& s, const PyTile& d, const PyTile& t, const std::string& bcast) {
            s.b.tbcast(tile(d), tile(t), parse_bcast(bcast));
          },
          "dst"_a, "src"_a, "bcast"_a)
      .def(
          "tmma",
          [](PyBuilder& s, const PyTile& acc, const PyTile& l, const PyTile& r, bool trans_b, bool accumulate) {
            s.b.tmma(tile(acc), tile(l), tile(r),
                     static_cast<uint8_t>((trans_b ? isa::kTransB : 0) | (accumulate ? isa::kAccumulate : 0)));
          },
          "acc"_a, "lhs"_a, "rhs"_a, "trans_b"_a = false, "accumulate"_a = false, "acc (+)= lhs x rhs (f32).")
      .def("tget", [](PyBuilder& s, const PyReg& d, const PyTile& t, const PyReg& i) { s.b.tget(reg(d), tile(t), reg(i)); },
           "dst"_a, "src"_a, "flat_index"_a)
      .def(
          "tmv",
          [](PyBuilder& s, const PyTile& acc, const ArgOperand& a, const PyReg& off, const PyReg& stride,
             const PyTile& x, nb::handle dtype, bool accumulate) {
            s.b.tmv(tile(acc), arg_operand(a), reg(off), reg(stride), tile(x), parse_dtype(dtype), accumulate);
          },
          "acc"_a, "arg"_a, "offset"_a, "row_stride_bytes"_a, "x"_a, "dtype"_a, "accumulate"_a = false,
          "acc (+)= W x^T with W's rows streamed from the argument.")
      .def(
          "emit",
          [](PyBuilder& s, int64_t op, int64_t a, int64_t b_, int64_t c, int64_t d, int64_t e, int64_t sub,
             int64_t flags, int64_t imm) {
            isa::Insn in{operand_byte(op, "opcode"), operand_byte(a, "operand a"), operand_byte(b_, "operand b"),
                         operand_byte(c, "operand c"),  operand_byte(d, "operand d"), operand_byte(e, "operand e"),
                         operand_byte(sub, "sub-op"),   operand_byte(flags, "flags"), imm};
            return s.b.emit(in);
          },
          "opcode"_a, "a"_a = 0, "b"_a = 0, "c"_a = 0, "d"_a = 0, "e"_a = 0, "sub"_a = 0, "flags"_a = 0, "imm"_a = 0,
          "Appends one raw instruction, unchecked until build(); returns its index.")
      .def_prop_ro("num_insns", [](const PyBuilder& s) { return s.b.num_insns(); })
      .def(
          "build",
          [](const PyBuilder& s, uint32_t max_local_bytes) {
            std::optional<StatusOr<isa::Image>> img;
            {
              nb::gil_scoped_release release;
              img.emplace(s.b.build(max_local_bytes));
            }
            return image_from(std::move(*img));
          },
          "max_local_bytes"_a = 1u << 20,
          "Lays out and verifies the image; InvalidArgumentError names the instruction and "
          "the reason when the verifier refuses it.");
}

}  // namespace npurt::python
