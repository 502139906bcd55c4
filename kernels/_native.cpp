// The cuBLAS call of kernels.matmul for signatures whose tuned plan is cuBLAS in every mode, in C++; and
// torch.addmm for kernels.matmul_bias signatures that dispatch sends there in every mode.
//
// Python builds a plan key per call (shapes, strides, dtype, device of two tensors), about 1.1 us of host
// time on the H100 box, 8% of a host-bound 13 us call (scripts/host_cost.py). Here the same key is read
// from the tensors directly and looked up in a set of the signatures kernels/_plans.py resolved to cuBLAS;
// a hit runs at::mm (what torch.mm runs, autograd and grad mode included), anything else returns None and
// the Python path decides as before. Only torch.Tensor and nn.Parameter objects are served, with no torch
// function mode active: another subclass or a mode takes the Python path, where torch.mm's overrides apply.
#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/extension.h>
#include <torch/csrc/autograd/python_variable.h>

#include <array>
#include <unordered_set>

namespace {

struct Signature {
  std::array<int64_t, 8> dims;  // a's sizes, b's sizes, a's strides, b's strides
  std::array<int16_t, 6> kind;  // a's and b's dtypes, device types and device indices
  bool operator==(const Signature& other) const { return dims == other.dims && kind == other.kind; }
};

struct SignatureHash {
  size_t operator()(const Signature& s) const {
    size_t h = 1469598103934665603ull;  // FNV-1a over the fields
    for (int64_t d : s.dims) { h ^= static_cast<size_t>(d); h *= 1099511628211ull; }
    for (int16_t k : s.kind) { h ^= static_cast<size_t>(k); h *= 1099511628211ull; }
    return h;
  }
};

std::unordered_set<Signature, SignatureHash> cublas_signatures;  // every access holds the GIL
// Signatures whose eager plan is cuBLAS and whose graph plan is not: served where kernels.matmul would
// run the eager plan (kernels._modes.current() is eager), else left to the Python path.
std::unordered_set<Signature, SignatureHash> eager_signatures;
// matmul_bias signatures that dispatch sends to torch.addmm in every mode (kernels/epilogue.py _PATHS),
// valid while the dispatcher's ``changes`` counter reads ``addmm_changes``: a clear, another database or a
// pin bumps it, and the set is then stale until matmul_bias's Python path puts signatures again.
std::unordered_set<Signature, SignatureHash> addmm_signatures;
int64_t addmm_changes = -1;
constexpr size_t kAddmmCapacity = 4096;  // as _PATHS: ever-new shapes must not grow memory for ever
PyObject* dispatcher = nullptr;  // kernels.dispatch.DISPATCHER
PyObject* changes_name = nullptr;
PyObject* modes = nullptr;  // the kernels._modes module, for LOCAL.mode, ENV_MODE and capturing()
PyObject* local_modes = nullptr;
PyObject* eager_name = nullptr;
PyObject* auto_name = nullptr;
PyObject* mode_name = nullptr;  // interned attribute names: "mode", "ENV_MODE", "capturing"
PyObject* env_mode_name = nullptr;
PyObject* capturing_name = nullptr;
PyObject* own_capturing = nullptr;  // _modes.capturing as imported: a test's stand-in is another object
PyTypeObject* parameter_type = nullptr;  // torch.nn.Parameter: a subclass whose torch functions are torch's

bool plain(PyObject* obj) {
  return THPVariable_CheckExact(obj) || (parameter_type != nullptr && Py_TYPE(obj) == parameter_type);
}

Signature make_signature(const at::Tensor& a, const at::Tensor& b) {
  return Signature{{a.size(0), a.size(1), b.size(0), b.size(1), a.stride(0), a.stride(1), b.stride(0), b.stride(1)},
                   {static_cast<int16_t>(a.scalar_type()), static_cast<int16_t>(b.scalar_type()),
                    static_cast<int16_t>(a.device().type()), static_cast<int16_t>(b.device().type()),
                    static_cast<int16_t>(a.device().index()), static_cast<int16_t>(b.device().index())}};
}

// Whether the current stream of ``device`` is its default (legacy) stream, which CUDA cannot capture.
// c10's device-generic stream interface answers without the CUDA headers (this file builds without
// them); anything it cannot say (no CUDA backend loaded) answers false, and the Python check decides.
bool on_default_stream(const c10::Device& device) {
  try {
    const c10::impl::DeviceGuardImplInterface* impl = c10::impl::getDeviceGuardImpl(device.type());
    return impl->getStream(device) == impl->getDefaultStream(device);
  } catch (...) {
    return false;
  }
}

// 1 where kernels.matmul would run the eager plan of a call on a tensor of ``device``, 0 where the graph
// plan, -1 on a Python error: _modes.current(on_cuda), as kernels.matmul inlines it. Where the tensor's
// device is on its default stream, the capture check is answered here, without _modes._capturing's
// Python call (about 1 us a call on the H100 box, 2026-11-25), unless a test replaced _modes.capturing.
// _capturing asks about the current device's stream, this about the tensor's: they differ only for a
// tensor on a device that is not current, where this one names the stream at::mm will launch on.
int eager_now(const c10::Device& device) {
  PyObject* mode = PyObject_GetAttr(local_modes, mode_name);  // the thread's forced mode
  if (mode == nullptr) return -1;
  const int forced = PyObject_IsTrue(mode);
  if (forced < 0) {
    Py_DECREF(mode);
    return -1;
  }
  if (!forced) {
    Py_DECREF(mode);
    mode = PyObject_GetAttr(modes, env_mode_name);
    if (mode == nullptr) return -1;
  }
  int eager;
  if (mode == Py_None || PyUnicode_Compare(mode, auto_name) == 0) {
    eager = 1;
    if (device.is_cuda()) {  // the capture check
      PyObject* check = PyObject_GetAttr(modes, capturing_name);
      if (check == nullptr) {
        eager = -1;
      } else if (check != own_capturing || !on_default_stream(device)) {
        PyObject* capturing = PyObject_CallNoArgs(check);
        eager = capturing == nullptr ? -1 : !PyObject_IsTrue(capturing);
        Py_XDECREF(capturing);
      }
      Py_XDECREF(check);
    }
  } else {
    eager = PyUnicode_Compare(mode, eager_name) == 0;
  }
  Py_DECREF(mode);
  return PyErr_Occurred() ? -1 : eager;  // a mode that is not a string: the Python path says what is wrong
}

// ``op()`` with the GIL released, as torch's own bindings run their ops (other Python threads go on, and a
// CPU GEMM does not hold them up); None where it throws (the Python path runs the call again and raises
// torch's own error). The operands must be owned copies: another thread may rebind a tensor's data.
template <typename Op>
PyObject* run_released(Op&& op) {
  at::Tensor result;
  bool failed = false;
  Py_BEGIN_ALLOW_THREADS
  try {
    result = op();
  } catch (...) {  // every exception: none may leave this block without the GIL taken back
    failed = true;
  }
  Py_END_ALLOW_THREADS
  if (failed) Py_RETURN_NONE;
  return THPVariable_Wrap(std::move(result));
}

PyObject* try_mm(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  // A torch function mode would see torch.mm's call on the Python path: leave the call to it.
  if (nargs != 2 || !plain(args[0]) || !plain(args[1]) ||
      at::impl::torch_function_mode_enabled()) {
    Py_RETURN_NONE;
  }
  const at::Tensor a = THPVariable_Unpack(args[0]);
  const at::Tensor b = THPVariable_Unpack(args[1]);
  if (a.dim() != 2 || b.dim() != 2) Py_RETURN_NONE;
  const Signature signature = make_signature(a, b);
  if (!cublas_signatures.count(signature)) {
    if (local_modes == nullptr || !eager_signatures.count(signature)) Py_RETURN_NONE;
    const int eager = eager_now(a.device());
    if (eager < 0) {
      if (!PyErr_ExceptionMatches(PyExc_Exception)) return nullptr;  // KeyboardInterrupt and the like go on
      PyErr_Clear();  // the Python path asks again and says what is wrong
    }
    if (eager != 1) Py_RETURN_NONE;
  }
  return run_released([&] { return at::mm(a, b); });
}

// 1 where the dispatcher's ``changes`` counter still reads what the addmm set was put under, 0 where not,
// -1 on a Python error.
int addmm_current() {
  PyObject* changes = PyObject_GetAttr(dispatcher, changes_name);
  if (changes == nullptr) return -1;
  const long long now = PyLong_AsLongLong(changes);
  Py_DECREF(changes);
  if (now == -1 && PyErr_Occurred()) return -1;
  return now == addmm_changes;
}

PyObject* try_addmm(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || dispatcher == nullptr || addmm_signatures.empty() || !plain(args[0]) || !plain(args[1]) || !plain(args[2]) ||
      at::impl::torch_function_mode_enabled()) {
    Py_RETURN_NONE;
  }
  const at::Tensor a = THPVariable_Unpack(args[0]);
  const at::Tensor b = THPVariable_Unpack(args[1]);
  if (a.dim() != 2 || b.dim() != 2 || !addmm_signatures.count(make_signature(a, b))) Py_RETURN_NONE;
  const int current = addmm_current();
  if (current < 0) {
    if (!PyErr_ExceptionMatches(PyExc_Exception)) return nullptr;  // KeyboardInterrupt and the like go on
    PyErr_Clear();
  }
  if (current != 1) Py_RETURN_NONE;
  const at::Tensor bias = THPVariable_Unpack(args[2]);
  return run_released([&] { return at::addmm(bias, a, b); });
}

PyMethodDef try_addmm_def = {
    "try_addmm", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(try_addmm)), METH_FASTCALL,
    "torch.addmm(bias, a, b) if (a, b) has a matmul_bias signature dispatch sends to addmm, else None"};

PyMethodDef try_mm_def = {"try_mm", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(try_mm)),
                          METH_FASTCALL, "a @ b by at::mm if (a, b) has a cuBLAS signature, else None"};

}  // namespace

// The signature of a plan key's fields, as kernels/_plans.py passes them (b's dtype and device are a's:
// the signature's first call checked that).
Signature signature_of(const std::vector<int64_t>& dims, at::ScalarType dtype, at::Device device) {
  TORCH_CHECK(dims.size() == 8, "a signature has 8 sizes and strides, got ", dims.size());
  const auto type = static_cast<int16_t>(device.type());
  const auto index = static_cast<int16_t>(device.index());
  return Signature{{dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], dims[7]},
                   {static_cast<int16_t>(dtype), static_cast<int16_t>(dtype), type, type, index, index}};
}

void add(std::vector<int64_t> dims, at::ScalarType dtype, at::Device device) {
  const Signature signature = signature_of(dims, dtype, device);
  eager_signatures.erase(signature);
  cublas_signatures.insert(signature);
}

void add_eager(std::vector<int64_t> dims, at::ScalarType dtype, at::Device device) {
  const Signature signature = signature_of(dims, dtype, device);
  cublas_signatures.erase(signature);
  eager_signatures.insert(signature);
}

void discard(std::vector<int64_t> dims, at::ScalarType dtype, at::Device device) {
  const Signature signature = signature_of(dims, dtype, device);
  cublas_signatures.erase(signature);
  eager_signatures.erase(signature);
}

// A matmul_bias signature that dispatch sends to torch.addmm in every mode, as the dispatcher's ``changes``
// counter read ``changes``: a newer count drops the set's older signatures, an older one is ignored.
void add_addmm(std::vector<int64_t> dims, at::ScalarType dtype, at::Device device, int64_t changes) {
  if (changes < addmm_changes) return;
  if (changes > addmm_changes || addmm_signatures.size() >= kAddmmCapacity) {
    addmm_signatures.clear();
    addmm_changes = changes;
  }
  addmm_signatures.insert(signature_of(dims, dtype, device));
}

void clear_addmm() { addmm_signatures.clear(); }

// kernels.dispatch.DISPATCHER, kept for the process: whose ``changes`` counter try_addmm reads.
void use_dispatcher(py::object object) {
  changes_name = PyUnicode_InternFromString("changes");
  dispatcher = object.release().ptr();
}

void clear() {
  cublas_signatures.clear();
  eager_signatures.clear();
}

size_t size() { return cublas_signatures.size() + eager_signatures.size(); }

size_t addmm_size() { return addmm_signatures.size(); }

// kernels._modes, kept for the process: where a call of an eager-only signature learns its mode.
void use_modes(py::object module) {
  py::object local = module.attr("LOCAL");
  py::object eager = module.attr("EAGER");
  py::object automatic = module.attr("AUTO");
  mode_name = PyUnicode_InternFromString("mode");
  env_mode_name = PyUnicode_InternFromString("ENV_MODE");
  capturing_name = PyUnicode_InternFromString("capturing");
  own_capturing = py::object(module.attr("capturing")).release().ptr();
  modes = module.release().ptr();
  eager_name = eager.release().ptr();
  auto_name = automatic.release().ptr();
  local_modes = local.release().ptr();  // set last: try_mm serves eager-only signatures once it is
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("add", &add);
  m.def("add_eager", &add_eager);
  m.def("discard", &discard);
  m.def("use_modes", &use_modes);
  m.def("clear", &clear);
  m.def("size", &size);
  m.def("add_addmm", &add_addmm);
  m.def("clear_addmm", &clear_addmm);
  m.def("use_dispatcher", &use_dispatcher);
  m.def("addmm_size", &addmm_size);
  m.attr("try_mm") = py::reinterpret_steal<py::object>(PyCFunction_New(&try_mm_def, nullptr));
  m.attr("try_addmm") = py::reinterpret_steal<py::object>(PyCFunction_New(&try_addmm_def, nullptr));
  py::object parameter = py::module_::import("torch.nn.parameter").attr("Parameter");
  parameter_type = reinterpret_cast<PyTypeObject*>(parameter.release().ptr());  // kept for the process
}
