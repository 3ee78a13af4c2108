// The host path of a repeated norm call in C++: allocate the outputs, launch Triton's compiled
// kernels with cuLaunchKernel, and attach a C++ autograd node. Built on first use by
// kerneltriage/kernels/native.py (torch.utils.cpp_extension); see that file for why.
//
// A Program is one bound call of one input signature: the tensors it allocates (sizes fixed
// at bind time), the tensors it keeps (scratch), and its launches, each with Triton 3.6's
// parameter layout (the non-constexpr parameters in order, then the global and profile scratch
// pointers, both null here). Tensors are named by their index ("ref") in a per-call table:
// the call's inputs first, then allocations and kept tensors.
//
// No CUDA headers: cuLaunchKernel comes from libcuda.so.1 through dlsym (as Triton's own
// launcher does) and the current stream from c10's device guard, so this builds with any
// torch, CPU builds included.

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <dlfcn.h>

#include <array>
#include <cstring>
#include <stdexcept>
#include <unordered_map>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

namespace py = pybind11;
using torch::autograd::Edge;
using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

namespace {

// Errors are std::runtime_error (RuntimeError in Python), not TORCH_CHECK: with torch 2.11 and
// g++ 13 a TORCH_CHECK whose message has several parts crashed the process when it fired
// (benchmarks/probes/native_throw.py), while a std::runtime_error crossed cleanly.
[[noreturn]] void fail(const std::string& msg) { throw std::runtime_error("kerneltriage native: " + msg); }

// ---------------------------------------------------------------------------------------------
// cuLaunchKernel without CUDA headers
// ---------------------------------------------------------------------------------------------

using LaunchFn = int (*)(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                         unsigned bz, unsigned smem, void* stream, void** params, void** extra);
using ErrorNameFn = int (*)(int code, const char** name);

struct Driver {
  LaunchFn launch = nullptr;
  ErrorNameFn error_name = nullptr;
  std::string why;
};

const Driver& driver() {
  static Driver d = [] {
    Driver d;
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (h == nullptr) h = dlopen("libcuda.so.1", RTLD_NOW);
    if (h == nullptr) {
      d.why = "libcuda.so.1 not found";
      return d;
    }
    d.launch = reinterpret_cast<LaunchFn>(dlsym(h, "cuLaunchKernel"));
    d.error_name = reinterpret_cast<ErrorNameFn>(dlsym(h, "cuGetErrorName"));
    if (d.launch == nullptr) d.why = "cuLaunchKernel not found in libcuda.so.1";
    return d;
  }();
  return d;
}

void* current_stream(const at::Device& device) {
  auto* impl = c10::impl::getDeviceGuardImpl(device.type());
  return impl->getStream(device).native_handle();
}

// ---------------------------------------------------------------------------------------------
// Programs
// ---------------------------------------------------------------------------------------------

enum Kind : int8_t { PTR = 0, I32 = 1, I64 = 2, F32 = 3 };

struct Slot {
  int8_t kind;
  int32_t ref;  // PTR: the table index (its tensor may be undefined: a null pointer)
  int64_t i;
  float f;
};

struct Launch {
  uintptr_t function;
  unsigned gx, gy, gz, block, smem;
  std::vector<Slot> slots;
};

struct Alloc {
  int32_t ref;
  std::vector<int64_t> sizes;
  at::ScalarType dtype;
};

union Arg {
  uint64_t p;
  int32_t i32;
  int64_t i64;
  float f32;
};

constexpr size_t kMaxParams = 64;

struct Program {
  int32_t n_inputs = 0;
  int32_t n_refs = 0;
  at::Device device{at::kCUDA, 0};
  std::vector<Alloc> allocs;
  std::vector<std::pair<int32_t, at::Tensor>> kept;
  std::vector<Launch> launches;
  std::vector<int32_t> outputs;

  Program(int32_t n_inputs, int32_t n_refs, int64_t device_index)
      : n_inputs(n_inputs), n_refs(n_refs), device(at::kCUDA, static_cast<c10::DeviceIndex>(device_index)) {
    if (n_inputs < 0 || n_inputs > n_refs) fail("bad program size");
  }

  void check_ref(int32_t ref) const {
    if (ref < 0 || ref >= n_refs) fail("ref " + std::to_string(ref) + " out of range");
  }

  void add_alloc(int32_t ref, std::vector<int64_t> sizes, const at::Tensor& like) {
    check_ref(ref);
    allocs.push_back({ref, std::move(sizes), like.scalar_type()});
  }

  void add_kept(int32_t ref, at::Tensor t) {
    check_ref(ref);
    kept.emplace_back(ref, std::move(t));
  }

  void add_launch(uintptr_t function, std::vector<unsigned> grid, unsigned block, unsigned smem,
                  std::vector<int8_t> kinds, std::vector<int64_t> ints, std::vector<double> floats) {
    if (grid.size() != 3) fail("grid must have 3 dims");
    if (kinds.size() != ints.size() || kinds.size() != floats.size()) fail("slot lists differ in length");
    if (kinds.size() + 2 > kMaxParams) fail("too many kernel parameters");
    Launch l{function, grid[0], grid[1], grid[2], block, smem, {}};
    for (size_t k = 0; k < kinds.size(); ++k) {
      Slot s{kinds[k], 0, 0, 0.f};
      switch (kinds[k]) {
        case PTR:
          check_ref(static_cast<int32_t>(ints[k]));
          s.ref = static_cast<int32_t>(ints[k]);
          break;
        case I32:
        case I64:
          s.i = ints[k];
          break;
        case F32:
          s.f = static_cast<float>(floats[k]);
          break;
        default:
          fail("unknown slot kind " + std::to_string(kinds[k]));
      }
      l.slots.push_back(s);
    }
    launches.push_back(std::move(l));
  }

  void set_outputs(std::vector<int32_t> refs) {
    for (auto r : refs) check_ref(r);
    outputs = std::move(refs);
  }

  // Runs on the current stream of the program's device; table holds the inputs on entry.
  void run(std::vector<at::Tensor>& table) const {
    const Driver& d = driver();
    if (d.launch == nullptr) fail(d.why);
    table.resize(n_refs);
    auto options = at::TensorOptions().device(device);
    for (const auto& a : allocs) table[a.ref] = at::empty(a.sizes, options.dtype(a.dtype));
    for (const auto& k : kept) table[k.first] = k.second;
    void* stream = current_stream(device);
    std::array<Arg, kMaxParams> args;
    std::array<void*, kMaxParams> params;
    for (const auto& l : launches) {
      size_t n = 0;
      for (const auto& s : l.slots) {
        Arg& a = args[n];
        switch (s.kind) {
          case PTR: {
            const at::Tensor& t = table[s.ref];
            a.p = t.defined() ? reinterpret_cast<uint64_t>(t.data_ptr()) : 0;
            break;
          }
          case I32:
            a.i32 = static_cast<int32_t>(s.i);
            break;
          case I64:
            a.i64 = s.i;
            break;
          default:
            a.f32 = s.f;
        }
        params[n] = &args[n];
        ++n;
      }
      args[n].p = 0;  // global scratch
      params[n] = &args[n];
      ++n;
      args[n].p = 0;  // profile scratch
      params[n] = &args[n];
      int err = d.launch(reinterpret_cast<void*>(l.function), l.gx, l.gy, l.gz, l.block, 1, 1, l.smem, stream,
                         params.data(), nullptr);
      if (err != 0) {
        const char* name = nullptr;
        if (d.error_name != nullptr) d.error_name(err, &name);
        fail(std::string("cuLaunchKernel failed: ") + (name ? name : "error " + std::to_string(err)));
      }
    }
  }
};

// ---------------------------------------------------------------------------------------------
// A norm: forward program, backward programs per gradient signature, Python fallback
// ---------------------------------------------------------------------------------------------

// Inputs of the forward program: x, residual, weight, bias; its outputs: y, h, mean, rstd.
// Inputs of a backward program: dy, xs, weight, mean, rstd, dres; its outputs: dx, dw, db.
struct Backward {
  bool need_dw, need_db, has_dres, dy_aligned, dres_aligned;
  std::vector<int64_t> dy_strides, dres_strides;
  at::ScalarType dy_dtype, dres_dtype;
  std::shared_ptr<Program> program;

  bool matches(const at::Tensor& dy, const at::Tensor& dres, bool dw, bool db) const {
    if (dw != need_dw || db != need_db || dres.defined() != has_dres) return false;
    if (dy.scalar_type() != dy_dtype || dy.strides() != c10::IntArrayRef(dy_strides)) return false;
    if (((reinterpret_cast<uintptr_t>(dy.data_ptr()) & 15) == 0) != dy_aligned) return false;
    if (!has_dres) return true;
    return dres.scalar_type() == dres_dtype && dres.strides() == c10::IntArrayRef(dres_strides) &&
           ((reinterpret_cast<uintptr_t>(dres.data_ptr()) & 15) == 0) == dres_aligned;
  }
};

py::object* g_fallback = nullptr;  // kerneltriage.kernels.native._fallback_backward, never freed

struct Norm {
  std::string name;  // what a profiler shows for the forward, e.g. "kerneltriage::rms_norm"
  std::shared_ptr<Program> forward;
  bool has_res, has_bias;
  double w_offset;
  bool cast_x;
  std::mutex mu;  // backward programs are added from the autograd engine's threads
  std::vector<Backward> backwards;

  static constexpr size_t kMaxBackwards = 8;

  std::shared_ptr<Program> backward_for(const at::Tensor& dy, const at::Tensor& dres, bool dw, bool db) {
    std::lock_guard<std::mutex> g(mu);
    for (const auto& b : backwards)
      if (b.matches(dy, dres, dw, db)) return b.program;
    return nullptr;
  }

  void add_backward(std::shared_ptr<Program> p, bool need_dw, bool need_db, const at::Tensor& dy,
                    const c10::optional<at::Tensor>& dres) {
    Backward b;
    b.need_dw = need_dw;
    b.need_db = need_db;
    b.has_dres = dres.has_value() && dres->defined();
    b.dy_strides = dy.strides().vec();
    b.dy_dtype = dy.scalar_type();
    b.dy_aligned = (reinterpret_cast<uintptr_t>(dy.data_ptr()) & 15) == 0;
    b.dres_dtype = b.has_dres ? dres->scalar_type() : dy.scalar_type();
    b.dres_strides = b.has_dres ? dres->strides().vec() : std::vector<int64_t>{};
    b.dres_aligned = b.has_dres && (reinterpret_cast<uintptr_t>(dres->data_ptr()) & 15) == 0;
    b.program = std::move(p);
    std::lock_guard<std::mutex> g(mu);
    if (backwards.size() >= kMaxBackwards) backwards.erase(backwards.begin());
    backwards.push_back(std::move(b));
  }
};

struct NormBackward : public Node {
  std::shared_ptr<Norm> norm;
  SavedVariable xs_, weight_, mean_, rstd_;
  std::vector<int64_t> shape;
  at::ScalarType dtype;

  std::string name() const override { return "kerneltriage::NormBackward"; }

  void release_variables() override {
    xs_.reset_data();
    weight_.reset_data();
    mean_.reset_data();
    rstd_.reset_data();
  }

  variable_list apply(variable_list&& grads) override {
    at::Tensor xs = xs_.unpack(getptr()), weight = weight_.unpack(), mean = mean_.unpack(), rstd = rstd_.unpack();
    at::Tensor dy = grads[0];
    at::Tensor dres = norm->has_res ? grads[1] : at::Tensor();
    if (!dy.defined()) dy = at::zeros(shape, xs.options().dtype(dtype));
    bool need_dw = weight.defined() && task_should_compute_output(2);
    bool need_db = norm->has_bias && task_should_compute_output(3);
    at::Tensor dx, dw, db;
    auto program = norm->backward_for(dy, dres, need_dw, need_db);
    if (program) {
      std::vector<at::Tensor> table{dy, xs, weight, mean, rstd, dres};
      program->run(table);
      dx = table[program->outputs[0]];
      dw = table[program->outputs[1]];
      db = table[program->outputs[2]];
    } else {  // first backward of this gradient signature: the generic path, which binds it
      if (g_fallback == nullptr) fail("no fallback backward set");
      py::gil_scoped_acquire gil;
      py::tuple r = (*g_fallback)(py::cast(norm), dy, xs, weight, mean, rstd, dres, need_dw, need_db);
      dx = r[0].cast<at::Tensor>();
      dw = r[1].is_none() ? at::Tensor() : r[1].cast<at::Tensor>();
      db = r[2].is_none() ? at::Tensor() : r[2].cast<at::Tensor>();
    }
    variable_list out(4);
    out[0] = dx;
    if (norm->has_res) out[1] = dx;
    out[2] = need_dw ? dw : at::Tensor();
    out[3] = need_db ? db : at::Tensor();
    return out;
  }
};

// torch up to 2.11 owns autograd nodes by std::shared_ptr (deleted through deleteNode, which
// frees long graphs without deep recursion); later torch by c10::intrusive_ptr. The branch not
// taken is never instantiated, and deleteNode is found by argument-dependent lookup.
template <class T, class Base = Node>
auto make_node() {
  if constexpr (std::is_base_of_v<c10::intrusive_ptr_target, Base>) {
    return c10::make_intrusive<T>();
  } else {
    return std::shared_ptr<T>(new T(), [](T* p) { deleteNode(static_cast<Base*>(p)); });
  }
}

at::Tensor opt(const c10::optional<at::Tensor>& t) { return t.has_value() ? *t : at::Tensor(); }

// y, or (y, new_residual); with autograd when ``grad`` (the caller checked that an input
// requires a gradient and grad mode is on).
py::object norm_call(const std::shared_ptr<Norm>& norm, const at::Tensor& x, const c10::optional<at::Tensor>& res,
                     const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias, bool grad) {
  RECORD_FUNCTION(norm->name.c_str(), std::vector<c10::IValue>());
  std::vector<at::Tensor> table{x, opt(res), opt(weight), opt(bias)};
  const Program& p = *norm->forward;
  p.run(table);
  at::Tensor y = table[p.outputs[0]];
  at::Tensor h = norm->has_res ? table[p.outputs[1]] : at::Tensor();
  if (grad) {
    auto node = make_node<NormBackward>();
    node->norm = norm;
    node->set_next_edges(torch::autograd::collect_next_edges(table[0], table[1], table[2], table[3]));
    torch::autograd::set_history(y, node);
    if (norm->has_res) torch::autograd::set_history(h, node);
    // Backward reads the normalized input: x, or x + residual, which new_residual holds.
    node->xs_ = norm->has_res ? SavedVariable(h, true) : SavedVariable(x, false);
    node->weight_ = SavedVariable(table[2], false);
    node->mean_ = SavedVariable(table[p.outputs[2]], false);
    node->rstd_ = SavedVariable(table[p.outputs[3]], false);
    node->shape = x.sizes().vec();
    node->dtype = x.scalar_type();
  }
  if (norm->has_res) return py::make_tuple(y, h);
  return py::cast(y);
}

// ---------------------------------------------------------------------------------------------
// The signature table: call -> its bound Norm, looked up without Python
// ---------------------------------------------------------------------------------------------

// What a bound call depends on: the norm kind and its scalars, whether autograd records it,
// the current device, and per input tensor its dtype, device, sizes, strides and 16-byte
// alignment (what Triton specializes on). A hit is a call the generic path already accepted,
// checked and launched with these very properties.
using Key = std::vector<int64_t>;

struct KeyHash {
  size_t operator()(const Key& k) const noexcept {
    size_t h = 1469598103934665603ull;
    for (int64_t v : k) h = (h ^ static_cast<size_t>(v)) * 1099511628211ull;
    return h;
  }
};

int64_t bits(double v) {
  int64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

void add_tensor(Key& k, const at::Tensor* t) {
  if (t == nullptr || !t->defined()) {
    k.push_back(-1);
    return;
  }
  k.push_back(static_cast<int64_t>(t->scalar_type()));
  k.push_back(static_cast<int64_t>(t->device().type()) * 1024 + t->device().index());
  k.push_back(t->dim());
  for (auto v : t->sizes()) k.push_back(v);
  for (auto v : t->strides()) k.push_back(v);
  k.push_back((reinterpret_cast<uintptr_t>(t->data_ptr()) & 15) == 0);
}

bool needs_grad(const at::Tensor& x, const at::Tensor* r, const at::Tensor* w, const at::Tensor* b) {
  if (!at::GradMode::is_enabled()) return false;
  auto rg = [](const at::Tensor* t) { return t != nullptr && t->defined() && t->requires_grad(); };
  return x.requires_grad() || rg(r) || rg(w) || rg(b);
}

Key make_key(int64_t kind, const at::Tensor& x, const at::Tensor* r, const at::Tensor* w, const at::Tensor* b,
             double eps, double w_offset, bool cast_x, bool grad) {
  Key k;
  k.reserve(40);
  k.push_back(kind);
  k.push_back(grad);
  k.push_back(cast_x);
  k.push_back(bits(eps));
  k.push_back(bits(w_offset));
  k.push_back(c10::impl::getDeviceGuardImpl(at::kCUDA)->getDevice().index());
  add_tensor(k, &x);
  add_tensor(k, r);
  add_tensor(k, w);
  add_tensor(k, b);
  return k;
}

const at::Tensor* ptr(const c10::optional<at::Tensor>& t) { return t.has_value() ? &*t : nullptr; }

struct Table {
  std::unordered_map<Key, std::shared_ptr<Norm>, KeyHash> map;
  static constexpr size_t kMax = 1024;  // signatures; cleared beyond (unbounded shapes)

  void add(int64_t kind, const at::Tensor& x, const c10::optional<at::Tensor>& r,
           const c10::optional<at::Tensor>& w, const c10::optional<at::Tensor>& b, double eps, double w_offset,
           bool cast_x, bool grad, std::shared_ptr<Norm> norm) {
    if (map.size() >= kMax) map.clear();
    map[make_key(kind, x, ptr(r), ptr(w), ptr(b), eps, w_offset, cast_x, grad)] = std::move(norm);
  }

  // The call's output if its signature is bound, else None (the caller takes the generic path).
  py::object call(int64_t kind, const at::Tensor& x, const c10::optional<at::Tensor>& r,
                  const c10::optional<at::Tensor>& w, const c10::optional<at::Tensor>& b, double eps,
                  double w_offset, bool cast_x) {
    if (map.empty() || !x.is_cuda()) return py::none();
    bool grad = needs_grad(x, ptr(r), ptr(w), ptr(b));
    auto it = map.find(make_key(kind, x, ptr(r), ptr(w), ptr(b), eps, w_offset, cast_x, grad));
    if (it == map.end()) return py::none();
    return norm_call(it->second, x, r, w, b, grad);
  }
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "kerneltriage's bound norm calls: cuLaunchKernel and a C++ autograd node";
  py::class_<Program, std::shared_ptr<Program>>(m, "Program")
      .def(py::init<int32_t, int32_t, int64_t>(), py::arg("n_inputs"), py::arg("n_refs"), py::arg("device_index"))
      .def("add_alloc", &Program::add_alloc)
      .def("add_kept", &Program::add_kept)
      .def("add_launch", &Program::add_launch)
      .def("set_outputs", &Program::set_outputs)
      .def("run", [](const Program& p, std::vector<at::Tensor> inputs) {
        if (static_cast<int32_t>(inputs.size()) != p.n_inputs)
          fail("expected " + std::to_string(p.n_inputs) + " inputs");
        p.run(inputs);
        std::vector<at::Tensor> out;
        for (auto r : p.outputs) out.push_back(inputs[r]);
        return out;
      });
  py::class_<Norm, std::shared_ptr<Norm>>(m, "Norm")
      .def(py::init([](std::string name, std::shared_ptr<Program> forward, bool has_res, bool has_bias,
                       double w_offset, bool cast_x) {
        auto n = std::make_shared<Norm>();
        n->name = std::move(name);
        n->forward = std::move(forward);
        n->has_res = has_res;
        n->has_bias = has_bias;
        n->w_offset = w_offset;
        n->cast_x = cast_x;
        return n;
      }))
      .def_readonly("w_offset", &Norm::w_offset)
      .def_readonly("cast_x", &Norm::cast_x)
      .def("add_backward", &Norm::add_backward)
      .def("n_backwards", [](Norm& n) {
        std::lock_guard<std::mutex> g(n.mu);
        return n.backwards.size();
      });
  m.def("norm_call", &norm_call);
  py::class_<Table, std::shared_ptr<Table>>(m, "Table")
      .def(py::init<>())
      .def("add", &Table::add)
      .def("call", &Table::call)
      .def("clear", [](Table& t) { t.map.clear(); })
      .def("__len__", [](const Table& t) { return t.map.size(); })
      .def("norms", [](const Table& t) {
        std::vector<std::shared_ptr<Norm>> out;
        for (const auto& kv : t.map) out.push_back(kv.second);
        return out;
      });
  m.def("set_fallback", [](py::object fn) {
    if (g_fallback == nullptr) g_fallback = new py::object();  // never freed: outlives interpreter teardown
    *g_fallback = std::move(fn);
  });
  m.def("has_fallback", []() { return g_fallback != nullptr; });
  m.def("driver_error", []() { return driver().why; });
}
