// The cuBLAS call of kernels.matmul for signatures whose tuned plan is cuBLAS in every mode, in C++.
//
// Python builds a plan key per call (shapes, strides, dtype, device of two tensors), about 1.1 us of host
// time on the H100 box, 8% of a host-bound 13 us call (scripts/host_cost.py). Here the same key is read
// from the tensors directly and looked up in a set of the signatures kernels/_plans.py resolved to cuBLAS;
// a hit runs at::mm (what torch.mm runs, autograd and grad mode included), anything else returns None and
// the Python path decides as before. Only torch.Tensor and nn.Parameter objects are served, with no torch
// function mode active: another subclass or a mode takes the Python path, where torch.mm's overrides apply.
#include <ATen/PythonTorchFunctionTLS.h>
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
PyObject* modes = nullptr;  // the kernels._modes module, for LOCAL.mode, ENV_MODE and capturing()
PyObject* local_modes = nullptr;
PyObject* eager_name = nullptr;
PyObject* auto_name = nullptr;
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

// 1 where kernels.matmul would run the eager plan of a call on a tensor of this device type, 0 where the
// graph plan, -1 on a Python error: _modes.current(on_cuda), as kernels.matmul inlines it.
int eager_now(bool on_cuda) {
  PyObject* mode = PyObject_GetAttrString(local_modes, "mode");  // the thread's forced mode
  if (mode == nullptr) return -1;
  const int forced = PyObject_IsTrue(mode);
  if (forced < 0) {
    Py_DECREF(mode);
    return -1;
  }
  if (!forced) {
    Py_DECREF(mode);
    mode = PyObject_GetAttrString(modes, "ENV_MODE");
    if (mode == nullptr) return -1;
  }
  int eager;
  if (mode == Py_None || PyUnicode_Compare(mode, auto_name) == 0) {
    eager = 1;
    if (on_cuda) {  // the capture check, the Python one (a test may stand in for it)
      PyObject* capturing = PyObject_CallMethod(modes, "capturing", nullptr);
      eager = capturing == nullptr ? -1 : !PyObject_IsTrue(capturing);
      Py_XDECREF(capturing);
    }
  } else {
    eager = PyUnicode_Compare(mode, eager_name) == 0;
  }
  Py_DECREF(mode);
  return PyErr_Occurred() ? -1 : eager;  // a mode that is not a string: the Python path says what is wrong
}

PyObject* try_mm(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  // A torch function mode would see torch.mm's call on the Python path: leave the call to it.
  if (nargs != 2 || !plain(args[0]) || !plain(args[1]) ||
      at::impl::torch_function_mode_enabled()) {
    Py_RETURN_NONE;
  }
  const at::Tensor& a = THPVariable_Unpack(args[0]);
  const at::Tensor& b = THPVariable_Unpack(args[1]);
  if (a.dim() != 2 || b.dim() != 2) Py_RETURN_NONE;
  const Signature signature = make_signature(a, b);
  if (!cublas_signatures.count(signature)) {
    if (local_modes == nullptr || !eager_signatures.count(signature)) Py_RETURN_NONE;
    const int eager = eager_now(a.device().is_cuda());
    if (eager < 0) {
      if (!PyErr_ExceptionMatches(PyExc_Exception)) return nullptr;  // KeyboardInterrupt and the like go on
      PyErr_Clear();  // the Python path asks again and says what is wrong
    }
    if (eager != 1) Py_RETURN_NONE;
  }
  try {
    return THPVariable_Wrap(at::mm(a, b));
  } catch (const std::exception&) {
    Py_RETURN_NONE;  // the Python path runs the call again and raises torch's own error
  }
}

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

void clear() {
  cublas_signatures.clear();
  eager_signatures.clear();
}

size_t size() { return cublas_signatures.size() + eager_signatures.size(); }

// kernels._modes, kept for the process: where a call of an eager-only signature learns its mode.
void use_modes(py::object module) {
  py::object local = module.attr("LOCAL");
  py::object eager = module.attr("EAGER");
  py::object automatic = module.attr("AUTO");
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
  m.attr("try_mm") = py::reinterpret_steal<py::object>(PyCFunction_New(&try_mm_def, nullptr));
  py::object parameter = py::module_::import("torch.nn.parameter").attr("Parameter");
  parameter_type = reinterpret_cast<PyTypeObject*>(parameter.release().ptr());  // kept for the process
}
