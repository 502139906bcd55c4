// The cuBLAS call of kernels.matmul for signatures whose tuned plan is cuBLAS in every mode, in C++; and
// torch.addmm for kernels.matmul_bias signatures that dispatch sends there in every mode; and the launch of
// the tiled, split-K or repack Triton kernels that a signature's eager plan runs, on a device's default stream;
// and the Triton epilogue kernels (kernels/epilogue.py) that kernels.matmul_bias and kernels.gated_matmul
// signatures run, while the dispatcher's answers stand; and kernels.moe_matmul's and moe_gated_matmul's eager
// plans (their Triton launch, or torch._grouped_mm alone), handed over by kernels/_grouped_dispatch.py.
//
// Python builds a plan key per call (shapes, strides, dtype, device of two tensors), about 1.1 us of host
// time on the H100 box, 8% of a host-bound 13 us call (scripts/host_cost.py). Here the same key is read
// from the tensors directly and looked up in a set of the signatures kernels/_plans.py resolved to cuBLAS;
// a hit runs a kept cublasLt plan where at::mm would do nothing more (``lt`` below), else at::mm (what torch.mm
// runs, autograd and grad mode included); anything else returns None and
// the Python path decides as before. Only torch.Tensor and nn.Parameter objects are served, with no torch
// function mode active: another subclass or a mode takes the Python path, where torch.mm's overrides apply.
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/autocast_mode.h>
#include <ATen/record_function.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/extension.h>
#include <torch/csrc/autograd/python_variable.h>

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace {

struct Signature {
  // A GEMM's: a's sizes, b's sizes, a's strides, b's strides, then zeros. A MoE GEMM's (make_moe_signature):
  // x's and w's sizes, x's and w's strides, offsets' size and stride.
  std::array<int64_t, 12> dims;
  // a's and b's dtypes, device types and device indices, then zeros; a MoE GEMM's: offsets' dtype last
  std::array<int16_t, 8> kind;
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
// matmul_bias signatures that dispatch sends to torch.addmm in eager calls and to a Triton kernel under
// capture (an eager record cuBLAS won beside a graph record a kernel won): served where the call is eager,
// as ``eager_signatures`` are for kernels.matmul. On the H100 such a call from Python (its ready call, then
// torch.addmm) read 0.81-0.90x of torch.addmm where the GPU takes 16 us (docs/BENCHMARKS.md,
// 2026-11-27). Valid under the same ``addmm_changes``.
std::unordered_set<Signature, SignatureHash> addmm_eager_signatures;
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

// A Triton kernel launched from here: what its compiled launcher (triton 3.6's CudaLauncher) passes the
// driver, with the operands' addresses filled in per call. Each parameter is one 8-byte slot; an int32
// parameter is read from its slot's first 4 bytes (little-endian), as cuLaunchKernel copies each
// parameter's declared size from the address it is given. kSlotD: a MoE GEMM's offsets (x, w and the output
// are its A, B and C).
enum Slot : int { kSlotA = 0, kSlotB = 1, kSlotC = 2, kSlotFixed64 = 3, kSlotFixed32 = 4, kSlotBias = 5, kSlotD = 6 };
constexpr size_t kMaxParams = 32;
constexpr size_t kMaxKernels = 2;  // repack: the padding copy, then the GEMM on the padded buffer

struct KernelLaunch {
  void* function = nullptr;  // the CUfunction, loaded in the primary context of the signature's device
  std::array<unsigned, 3> grid{};
  unsigned threads = 0;
  unsigned shared = 0;
  std::vector<int> codes;        // Slot per kernel parameter
  std::vector<uint64_t> values;  // fixed values (addresses of kept buffers, integers)
};

struct LaunchPlan {
  bool both_modes = false;  // the graph plan is this one too: served whatever the mode
  std::array<int64_t, 2> out_shape{};
  std::vector<KernelLaunch> kernels;  // launched in order, on one stream
  std::vector<at::Tensor> keep;       // buffers the fixed addresses point into (split-K's, repack's)
  // An epilogue plan's: the dispatcher's ``changes`` count it was made under (served while it stands), and
  // the dtype its kernel reads the bias in (-1: no bias).
  int64_t changes = -1;
  int16_t bias_dtype = -1;
};

// Held across the launches of a plan of several kernels: they share a buffer of the plan's own (repack's
// padded operands), which another thread's copy must not overwrite between this call's copy and its GEMM.
std::mutex sequence_mutex;

using LaunchPlans = std::unordered_map<Signature, LaunchPlan, SignatureHash>;
LaunchPlans launch_plans;  // every access holds the GIL
// kernels.matmul_bias's and kernels.gated_matmul's Triton signatures (kernels/epilogue.py _triton_call), each
// valid while the dispatcher's ``changes`` count reads the plan's own.
LaunchPlans bias_plans;
LaunchPlans gated_plans;
constexpr size_t kEpiloguePlanCapacity = 4096;  // as epilogue.py's ready calls
// kernels.moe_matmul's and kernels.moe_gated_matmul's eager signatures whose ready plan (kernels/moe.py
// ``Ready``) launches a Triton kernel, each valid while the dispatcher's ``changes`` count reads its own; and
// moe_matmul's signatures whose plan is torch._grouped_mm itself (its baseline, where dispatch found it
// faster), by the count they were put under. In Python such a call cost its signature's key and lookup, 2.8-6.1
// us of host time above torch._grouped_mm's own call at a decode step's 8 routed rows (H200, 2026-11-29,
// docs/BENCHMARKS.md "MoE eager calls after one lookup").
LaunchPlans moe_plans;
LaunchPlans moe_gated_plans;
std::unordered_map<Signature, int64_t, SignatureHash> moe_baseline;
int64_t moe_baseline_served = 0;  // calls served by torch._grouped_mm from here (the tests read it)
int64_t launched = 0;  // calls served by a launch from here (the GPU tests read it)
PyObject* launch_allowed = nullptr;  // kernels._launch.native_allowed: no launch hooks, shortcut enabled

// The driver's entry points, looked up in the libcuda that torch loaded: no CUDA headers are needed to
// build this file (CPU machines build it too), and where no libcuda is loaded nothing is launched here.
using LaunchKernel = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             void*, void**, void**);
using CtxGetCurrent = int (*)(void**);
LaunchKernel launch_kernel = nullptr;
CtxGetCurrent ctx_get_current = nullptr;

bool driver_found() {
  if (launch_kernel != nullptr) return true;
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (library == nullptr) return false;
  launch_kernel = reinterpret_cast<LaunchKernel>(dlsym(library, "cuLaunchKernel"));
  ctx_get_current = reinterpret_cast<CtxGetCurrent>(dlsym(library, "cuCtxGetCurrent"));
  if (launch_kernel == nullptr || ctx_get_current == nullptr) launch_kernel = nullptr;
  return launch_kernel != nullptr;
}

bool plain(PyObject* obj) {
  return THPVariable_CheckExact(obj) || (parameter_type != nullptr && Py_TYPE(obj) == parameter_type);
}

Signature make_signature(const at::Tensor& a, const at::Tensor& b) {
  return Signature{{a.size(0), a.size(1), b.size(0), b.size(1), a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                    0, 0, 0, 0},
                   {static_cast<int16_t>(a.scalar_type()), static_cast<int16_t>(b.scalar_type()),
                    static_cast<int16_t>(a.device().type()), static_cast<int16_t>(b.device().type()),
                    static_cast<int16_t>(a.device().index()), static_cast<int16_t>(b.device().index()), 0, 0}};
}

// The signature of a kernels.moe_matmul (or moe_gated_matmul) call: x [T, K], w [E, K, N], offsets [E], all
// three on one device (the caller checked), w's dtype x's (else no plan matches: the Python path says what
// is wrong). offsets' dtype is stored one above its ScalarType, so that no GEMM signature (zero there) is one.
Signature make_moe_signature(const at::Tensor& x, const at::Tensor& w, const at::Tensor& offsets) {
  const auto type = static_cast<int16_t>(x.device().type());
  const auto index = static_cast<int16_t>(x.device().index());
  return Signature{{x.size(0), x.size(1), w.size(0), w.size(1), w.size(2), x.stride(0), x.stride(1), w.stride(0),
                    w.stride(1), w.stride(2), offsets.size(0), offsets.stride(0)},
                   {static_cast<int16_t>(x.scalar_type()), static_cast<int16_t>(w.scalar_type()), type, type, index,
                    index, static_cast<int16_t>(static_cast<int16_t>(offsets.scalar_type()) + 1), 0}};
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

// Whether ``device`` is its backend's current device (a kernel loaded there launches in its context).
bool is_current(const c10::Device& device) {
  try {
    return c10::impl::getDeviceGuardImpl(device.type())->getDevice() == device;
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

// What a question put to Python (``answer``: 1 yes, 0 no, -1 an error is set) means for a call here: 1 serve
// it, 0 leave it to the Python path, -1 let the error propagate. An Exception is the Python path's to raise
// again, with its own message; KeyboardInterrupt and the like go on at once.
int serve_if(int answer) {
  if (answer >= 0) return answer == 1;
  if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
  PyErr_Clear();
  return 0;
}

// ``check()``'s truth, as ``serve_if`` takes it.
int call_says(PyObject* check) {
  PyObject* result = PyObject_CallNoArgs(check);
  if (result == nullptr) return -1;
  const int truth = PyObject_IsTrue(result);
  Py_DECREF(result);
  return truth;
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

// 1 where the dispatcher's ``changes`` counter still reads ``made_under`` (what an addmm set or an epilogue
// plan was put under), 0 where not (or no dispatcher is known), -1 on a Python error.
int dispatcher_reads(int64_t made_under) {
  if (dispatcher == nullptr) return 0;
  PyObject* changes = PyObject_GetAttr(dispatcher, changes_name);
  if (changes == nullptr) return -1;
  const long long now = PyLong_AsLongLong(changes);
  Py_DECREF(changes);
  if (now == -1 && PyErr_Occurred()) return -1;
  return now == made_under;
}

// As dispatcher_reads, for a launch plan: a matmul plan (made under -1) serves whatever the count; an
// epilogue plan while the count reads its own. Takes the count, not the plan: the Python it runs may change
// the plans.
int plan_current(int64_t made_under) { return made_under < 0 ? 1 : dispatcher_reads(made_under); }

// The address of the bias row ``plan``'s kernel reads, from ``bias`` (one contiguous, 16-byte aligned row of
// the output's width, in the plan's bias dtype, on a's device, with nothing to record); 0 where it is not one.
uintptr_t bias_address(const LaunchPlan& plan, const at::Tensor& a, const at::Tensor& bias) {
  if (bias.dim() != 1 || bias.size(0) != plan.out_shape[1] || (bias.size(0) > 1 && bias.stride(0) != 1) ||
      static_cast<int16_t>(bias.scalar_type()) != plan.bias_dtype || bias.device() != a.device() ||
      !bias.has_storage() || bias.key_set() != a.key_set() || bias._fw_grad(0).defined()) {
    return 0;
  }
  try {
    const auto address = reinterpret_cast<uintptr_t>(bias.const_data_ptr());
    return address & 15 ? 0 : address;  // the kernel was specialized for a 16-byte aligned bias
  } catch (...) {
    return 0;
  }
}

// The plan's kernel on (a, b) (and ``bias``, for a matmul_bias plan), into a fresh C, on the default stream of
// their device; None where this call is not the plan's to serve here (the Python path then runs it, and says
// what is wrong if anything is). The default stream alone: it cannot be capturing, and split-K's kept
// workspace belongs to it.
PyObject* run_launch(LaunchPlans& plans, const Signature& signature, const at::Tensor& a, const at::Tensor& b,
                     const at::Tensor* bias = nullptr, const at::Tensor* offsets = nullptr) {
  // A Triton launch records no autograd graph: a call that wants a gradient is the Python path's, which runs
  // it through the operator with a backward (kernels.ops).
  if (at::GradMode::is_enabled() &&
      (a.requires_grad() || b.requires_grad() || (bias != nullptr && bias->requires_grad()))) {
    Py_RETURN_NONE;
  }
  const c10::Device device = a.device();
  auto found = plans.find(signature);
  if (found == plans.end() || launch_kernel == nullptr || !device.is_cuda() || !on_default_stream(device) ||
      !is_current(device)) {
    Py_RETURN_NONE;
  }
  // An epilogue plan made before the dispatcher's answers changed (a pin, a clear, another database) is
  // dropped: the Python path resolves the call again and hands over the new plan.
  const int64_t made_under = found->second.changes;
  const bool both_modes = found->second.both_modes;
  const int current = serve_if(plan_current(made_under));
  if (current != 1) {
    if (current < 0) return nullptr;
    found = plans.find(signature);  // Python ran, which may have changed the plans
    if (found != plans.end() && found->second.changes == made_under) plans.erase(found);
    Py_RETURN_NONE;
  }
  // The mode, where the graph plan is another one; then what Python says of launch hooks and
  // KERNELS_DIRECT_LAUNCH=0 (kernels._launch.native_allowed, asked on every call as DirectLaunch asks):
  // a profiler's hook must see every launch.
  const int serve = serve_if(both_modes ? 1 : eager_now(device));
  const int allowed = serve != 1 ? serve : launch_allowed == nullptr ? 0 : serve_if(call_says(launch_allowed));
  if (allowed != 1) return allowed < 0 ? nullptr : Py_NewRef(Py_None);
  found = plans.find(signature);  // Python ran, which may have changed the plans
  if (found == plans.end() || found->second.changes != made_under) Py_RETURN_NONE;  // gone, or another one
  const LaunchPlan& plan = found->second;
  // Tensors without storage (under torch.func's vmap or grad, functionalization) match a signature by their
  // sizes and strides but have no address: the Python path says what happens to them.
  if (!a.has_storage() || !b.has_storage() || (offsets != nullptr && !offsets->has_storage())) Py_RETURN_NONE;
  uintptr_t bias_at = 0;
  if (plan.bias_dtype >= 0) {
    if (bias == nullptr || (bias_at = bias_address(plan, a, *bias)) == 0) Py_RETURN_NONE;
  }
  uintptr_t a_address = 0, b_address = 0, d_address = 0;
  try {
    a_address = reinterpret_cast<uintptr_t>(a.data_ptr());
    b_address = reinterpret_cast<uintptr_t>(b.data_ptr());
    if (offsets != nullptr) d_address = reinterpret_cast<uintptr_t>(offsets->data_ptr());
  } catch (...) {
    Py_RETURN_NONE;
  }
  // The kernels were specialized for 16-byte alignment.
  if ((a_address | b_address | d_address) & 15) Py_RETURN_NONE;
  void* context = nullptr;
  if (ctx_get_current(&context) != 0 || context == nullptr) Py_RETURN_NONE;
  // Everything the launches need is copied out of the plan while the GIL is held: another thread may
  // replace or erase it once the GIL is released. The kept buffers are held until the launches are queued.
  const size_t kernels = plan.kernels.size();
  std::array<std::array<uint64_t, kMaxParams + 2>, kMaxKernels> slots{};
  std::array<std::array<void*, kMaxParams + 2>, kMaxKernels> params{};
  std::array<std::pair<size_t, size_t>, kMaxKernels * kMaxParams> c_slots{};
  struct Launch { void* function; std::array<unsigned, 3> grid; unsigned threads, shared; };
  std::array<Launch, kMaxKernels> copies{};
  size_t c_count = 0;
  for (size_t k = 0; k < kernels; ++k) {
    const KernelLaunch& kernel = plan.kernels[k];
    copies[k] = {kernel.function, kernel.grid, kernel.threads, kernel.shared};
    const size_t count = kernel.codes.size();
    for (size_t i = 0; i < count; ++i) {
      switch (kernel.codes[i]) {
        case kSlotA: slots[k][i] = a_address; break;
        case kSlotB: slots[k][i] = b_address; break;
        case kSlotC: c_slots[c_count++] = {k, i}; break;
        case kSlotBias: slots[k][i] = bias_at; break;
        case kSlotD: slots[k][i] = d_address; break;
        case kSlotFixed32: {
          const auto value = static_cast<int32_t>(kernel.values[i]);
          std::memcpy(&slots[k][i], &value, sizeof(value));
          break;
        }
        default: slots[k][i] = kernel.values[i];
      }
      params[k][i] = &slots[k][i];
    }
    params[k][count] = &slots[k][count];          // global scratch: none (add_launch's caller refused any)
    params[k][count + 1] = &slots[k][count + 1];  // profile scratch: none
  }
  const std::array<int64_t, 2> out_shape = plan.out_shape;
  const std::vector<at::Tensor> keep = plan.keep.empty() ? std::vector<at::Tensor>() : plan.keep;
  at::Tensor c;
  int status = 0;
  bool failed = false;
  Py_BEGIN_ALLOW_THREADS
  try {
    c = at::empty({out_shape[0], out_shape[1]}, a.options());
    const auto c_address = reinterpret_cast<uintptr_t>(c.data_ptr());
    for (size_t i = 0; i < c_count; ++i) slots[c_slots[i].first][c_slots[i].second] = c_address;
    std::unique_lock<std::mutex> sequence(sequence_mutex, std::defer_lock);
    if (kernels > 1) sequence.lock();
    for (size_t k = 0; k < kernels && status == 0; ++k) {
      const Launch& launch = copies[k];
      status = launch_kernel(launch.function, launch.grid[0], launch.grid[1], launch.grid[2], launch.threads, 1, 1,
                             launch.shared, nullptr, params[k].data(), nullptr);
    }
  } catch (...) {
    failed = true;
  }
  Py_END_ALLOW_THREADS
  if (failed || status != 0) {
    // The Python path runs the call again and raises what it raises; a plan whose launch the driver refused
    // is not tried again (each call would pay an allocation and a failed launch first).
    if (status != 0) plans.erase(signature);
    Py_RETURN_NONE;
  }
  ++launched;
  return THPVariable_Wrap(std::move(c));
}

// ---- cublasLt: a cuBLAS signature's plan, made once ----------------------------------------------------
// at::mm asks cuBLAS for its kernel on every call (cublasGemmEx: descriptors and the algorithm's heuristic,
// then the launch). cublasLt splits the two: the descriptors and the algorithm are made once per signature
// and operand alignment, and each call is one cublasLtMatmul. On the H100 box one call from Python cost
// 0.82-0.84x of torch.matmul's host time this way, against 0.96-0.98x through at::mm, with the same time on
// the GPU where the GPU bounds the call (scripts/probes/cublaslt_host_probe.py, retired at 1996844, 2026-11-26). Served only where
// at::mm would do nothing more: fp16/bf16 operands with no gradient to record, on the default stream of the
// current device (it cannot be capturing; the kept workspace belongs to it), with torch's default reduced-
// precision reductions. Anything else, or any failure, takes at::mm. KERNELS_NATIVE_LT=0 switches it off.
// torch.addmm's signatures (try_addmm) take a plan of their own, the bias added by its epilogue
// (CUBLASLT_EPILOGUE_BIAS, as torch's own addmm does for a 1-D bias), where the bias is one aligned row.
// Like the driver's, cublasLt's entry points are looked up in the library torch loaded: no CUDA headers.
namespace lt {

constexpr int kR32F = 0, kR16F = 2, kR16BF = 14;  // cudaDataType_t
constexpr int kCompute32F = 68;                   // cublasComputeType_t CUBLAS_COMPUTE_32F
constexpr int kOpN = 0, kOpT = 1;                 // cublasOperation_t
constexpr int kDescTransA = 3, kDescTransB = 4, kDescEpilogue = 7, kDescBiasPointer = 8;  // cublasLtMatmulDescAttributes_t
constexpr int kEpilogueBias = 4;                  // cublasLtEpilogue_t CUBLASLT_EPILOGUE_BIAS
constexpr int kPrefMaxWorkspace = 1, kPrefAlignA = 5, kPrefAlignB = 6, kPrefAlignC = 7, kPrefAlignD = 8;
constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr size_t kMaxPlans = 4096;  // ever-new shapes: past this many plans, the map starts again

struct Algo { uint64_t data[8]; };
struct Heuristic { Algo algo; size_t workspace; int state; float waves; int reserved[4]; };
using Create = int (*)(void**);
using DescCreate = int (*)(void**, int, int);
using SetAttribute = int (*)(void*, int, const void*, size_t);
using LayoutCreate = int (*)(void**, int, uint64_t, uint64_t, int64_t);
using Destroy = int (*)(void*);
using GetHeuristic = int (*)(void*, void*, void*, void*, void*, void*, void*, int, Heuristic*, int*);
using Matmul = int (*)(void*, void*, const void*, const void*, void*, const void*, void*, const void*, const void*,
                       void*, void*, void*, const Algo*, void*, size_t, void*);

struct Api {
  Create create = nullptr;
  DescCreate desc_create = nullptr;
  SetAttribute desc_set = nullptr;
  LayoutCreate layout_create = nullptr;
  Create pref_create = nullptr;
  SetAttribute pref_set = nullptr;
  Destroy pref_destroy = nullptr;
  GetHeuristic heuristic = nullptr;
  Matmul matmul = nullptr;
  Destroy desc_destroy = nullptr;
  Destroy layout_destroy = nullptr;
};
Api api;
int state = 0;  // 0 not looked up yet, 1 found, -1 not here or switched off
std::string soname;  // the libcublasLt of torch's CUDA major (use_cuda_major), looked for first

bool found() {
  if (state != 0) return state == 1;
  state = -1;
  const char* setting = std::getenv("KERNELS_NATIVE_LT");
  if (setting != nullptr && std::strcmp(setting, "0") == 0) return false;
  // The cublasLt that torch loaded: its own CUDA major's first (another library may have loaded a cublasLt
  // of another major into this process), then any.
  void* library = soname.empty() ? nullptr : dlopen(soname.c_str(), RTLD_NOW | RTLD_NOLOAD);
  for (const char* name : {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so.11", "libcublasLt.so"}) {
    if (library != nullptr) break;
    library = dlopen(name, RTLD_NOW | RTLD_NOLOAD);
  }
  if (library == nullptr) return false;
  api.create = reinterpret_cast<Create>(dlsym(library, "cublasLtCreate"));
  api.desc_create = reinterpret_cast<DescCreate>(dlsym(library, "cublasLtMatmulDescCreate"));
  api.desc_set = reinterpret_cast<SetAttribute>(dlsym(library, "cublasLtMatmulDescSetAttribute"));
  api.layout_create = reinterpret_cast<LayoutCreate>(dlsym(library, "cublasLtMatrixLayoutCreate"));
  api.pref_create = reinterpret_cast<Create>(dlsym(library, "cublasLtMatmulPreferenceCreate"));
  api.pref_set = reinterpret_cast<SetAttribute>(dlsym(library, "cublasLtMatmulPreferenceSetAttribute"));
  api.pref_destroy = reinterpret_cast<Destroy>(dlsym(library, "cublasLtMatmulPreferenceDestroy"));
  api.heuristic = reinterpret_cast<GetHeuristic>(dlsym(library, "cublasLtMatmulAlgoGetHeuristic"));
  api.matmul = reinterpret_cast<Matmul>(dlsym(library, "cublasLtMatmul"));
  api.desc_destroy = reinterpret_cast<Destroy>(dlsym(library, "cublasLtMatmulDescDestroy"));
  api.layout_destroy = reinterpret_cast<Destroy>(dlsym(library, "cublasLtMatrixLayoutDestroy"));
  if (api.create && api.desc_create && api.desc_set && api.layout_create && api.pref_create && api.pref_set &&
      api.pref_destroy && api.heuristic && api.matmul && api.desc_destroy && api.layout_destroy) {
    state = 1;
  }
  return state == 1;
}

// The column-major product cublasLt computes: c^T[N,M] = op(b)^T op(a)^T, its "A" being b and its "B" a.
struct Operands {
  int trans_a, trans_b;          // of cublasLt's A (our b) and B (our a)
  uint64_t a_rows, a_cols;       // cublasLt's A layout, as stored
  int64_t lda;
  uint64_t b_rows, b_cols;
  int64_t ldb;
};

// How b [K,N] and a [M,K] sit in memory as column-major matrices; false where neither is dense in a row or a
// column (at::mm copies those).
bool operands_of(const at::Tensor& a, const at::Tensor& b, Operands& out) {
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (b.stride(1) == 1 && (b.stride(0) >= n || k == 1)) {  // b row-major: A = b^T, [N,K] column-major
    out.trans_a = kOpN; out.a_rows = n; out.a_cols = k; out.lda = k == 1 ? n : b.stride(0);
  } else if (b.stride(0) == 1 && (b.stride(1) >= k || n == 1)) {  // b column-major (w.t()): [K,N], transposed
    out.trans_a = kOpT; out.a_rows = k; out.a_cols = n; out.lda = n == 1 ? k : b.stride(1);
  } else {
    return false;
  }
  if (a.stride(1) == 1 && (a.stride(0) >= k || m == 1)) {  // a row-major: B = a^T, [K,M] column-major
    out.trans_b = kOpN; out.b_rows = k; out.b_cols = m; out.ldb = m == 1 ? k : a.stride(0);
  } else if (a.stride(0) == 1 && (a.stride(1) >= m || k == 1)) {  // a column-major: [M,K], transposed
    out.trans_b = kOpT; out.b_rows = m; out.b_cols = k; out.ldb = k == 1 ? m : a.stride(1);
  } else {
    return false;
  }
  return out.lda >= 1 && out.ldb >= 1;
}

uint16_t alignment(const void* address) {
  uint16_t bytes = 256;
  while (bytes > 1 && reinterpret_cast<uintptr_t>(address) % bytes != 0) bytes >>= 1;
  return bytes;
}

struct Key {
  Signature signature;
  uint16_t align_a, align_b;
  bool bias;  // torch.addmm's: a bias row added by the epilogue
  bool operator==(const Key& other) const {
    return signature == other.signature && align_a == other.align_a && align_b == other.align_b &&
           bias == other.bias;
  }
};

struct KeyHash {
  size_t operator()(const Key& key) const {
    return SignatureHash()(key.signature) ^ (static_cast<size_t>(key.align_a) << 20) ^
           (static_cast<size_t>(key.align_b) << 4) ^ static_cast<size_t>(key.bias);
  }
};

struct Plan {
  void* op = nullptr;
  void* layout_a = nullptr;
  void* layout_b = nullptr;
  void* layout_c = nullptr;
  Algo algo{};
  size_t workspace = 0;
  // A bias plan sets the bias's address on its descriptor before each call: one call at a time per plan.
  std::shared_ptr<std::mutex> bias_lock;
};

struct DeviceState {
  void* handle = nullptr;
  at::Tensor workspace;  // used on the device's default stream only, so one serves every call
};

std::unordered_map<Key, Plan, KeyHash> plans;  // every access below holds the GIL
std::unordered_set<Key, KeyHash> refused;
std::unordered_map<int, DeviceState> devices;
// Plans dropped (the map full, or a call that failed) whose descriptors a call running with the GIL released
// may still use: destroyed once no call is in flight.
std::vector<Plan> retired;
int64_t in_flight = 0;
int64_t served = 0;  // calls served by cublasLt from here (the GPU tests read it)

void destroy(const Plan& plan) {
  if (plan.layout_c) api.layout_destroy(plan.layout_c);
  if (plan.layout_b) api.layout_destroy(plan.layout_b);
  if (plan.layout_a) api.layout_destroy(plan.layout_a);
  if (plan.op) api.desc_destroy(plan.op);
}

void retire(const Key& key) {
  auto found = plans.find(key);
  if (found == plans.end()) return;
  retired.push_back(found->second);
  plans.erase(found);
}

void destroy_retired() {
  if (in_flight != 0) return;
  for (const Plan& plan : retired) destroy(plan);
  retired.clear();
}

// A new plan for (a, b), kept in ``plans``; nullptr (the key refused) where cublasLt cannot serve them.
const Plan* make_plan(const Key& key, const at::Tensor& a, const at::Tensor& b, DeviceState& state_of_device) {
  refused.insert(key);  // until the plan below is made whole
  Operands operands{};
  if (!operands_of(a, b, operands)) return nullptr;
  if (state_of_device.handle == nullptr) {
    void* handle = nullptr;
    if (api.create(&handle) != 0 || handle == nullptr) return nullptr;
    state_of_device.handle = handle;
  }
  if (!state_of_device.workspace.defined()) {
    state_of_device.workspace = at::empty({static_cast<int64_t>(kWorkspaceBytes)}, a.options().dtype(at::kByte));
  }
  const int type = a.scalar_type() == at::kHalf ? kR16F : kR16BF;
  Plan plan;
  const int epilogue = kEpilogueBias;
  if (api.desc_create(&plan.op, kCompute32F, kR32F) != 0 ||
      api.desc_set(plan.op, kDescTransA, &operands.trans_a, sizeof(int)) != 0 ||
      api.desc_set(plan.op, kDescTransB, &operands.trans_b, sizeof(int)) != 0 ||
      (key.bias && api.desc_set(plan.op, kDescEpilogue, &epilogue, sizeof(int)) != 0) ||
      api.layout_create(&plan.layout_a, type, operands.a_rows, operands.a_cols, operands.lda) != 0 ||
      api.layout_create(&plan.layout_b, type, operands.b_rows, operands.b_cols, operands.ldb) != 0 ||
      api.layout_create(&plan.layout_c, type, b.size(1), a.size(0), b.size(1)) != 0) {
    destroy(plan);
    return nullptr;
  }
  void* preference = nullptr;
  if (api.pref_create(&preference) != 0) {
    destroy(plan);
    return nullptr;
  }
  const uint64_t workspace = kWorkspaceBytes;
  const uint32_t align_a = key.align_b, align_b = key.align_a, align_c = 256;  // cublasLt's A is our b
  Heuristic result{};
  int returned = 0;
  const bool ok = api.pref_set(preference, kPrefMaxWorkspace, &workspace, sizeof(workspace)) == 0 &&
                  api.pref_set(preference, kPrefAlignA, &align_a, sizeof(align_a)) == 0 &&
                  api.pref_set(preference, kPrefAlignB, &align_b, sizeof(align_b)) == 0 &&
                  api.pref_set(preference, kPrefAlignC, &align_c, sizeof(align_c)) == 0 &&
                  api.pref_set(preference, kPrefAlignD, &align_c, sizeof(align_c)) == 0 &&
                  api.heuristic(state_of_device.handle, plan.op, plan.layout_a, plan.layout_b, plan.layout_c,
                                plan.layout_c, preference, 1, &result, &returned) == 0 &&
                  returned > 0 && result.state == 0;
  api.pref_destroy(preference);
  if (!ok) {
    destroy(plan);
    return nullptr;
  }
  // A bias plan whose algorithm wants workspace (a split-K pass and its reduction) is not the kernel torch.addmm
  // runs: on the H100, unseen Qwen2.5-72B's 10240x8192 at 8 and 32 rows got a split-K 256x8 tile and a reduce
  // kernel (62.4 + 2.3 us) where torch.addmm ran one 128x8 tile (60.3 us): 0.92-0.95x torch.addmm's eager
  // call (scripts/probes/addmm_plan_probe.py, retired at 1996844, docs/BENCHMARKS.md, 2026-11-27). Such a key stays
  // refused, and at::addmm serves it: torch's own choice of kernel, with less host time than from Python.
  if (key.bias && result.workspace > 0) {
    destroy(plan);
    return nullptr;
  }
  plan.algo = result.algo;
  plan.workspace = result.workspace;
  if (key.bias) plan.bias_lock = std::make_shared<std::mutex>();
  refused.erase(key);
  return &plans.emplace(key, plan).first->second;
}

// The plan for (a, b) on the current device, made now if need be; nullptr where cublasLt cannot serve them.
const Plan* plan_for(const Key& key, const at::Tensor& a, const at::Tensor& b, DeviceState*& device_state) {
  auto known = plans.find(key);
  auto& state_of_device = devices[a.device().index()];
  device_state = &state_of_device;
  if (known != plans.end()) return &known->second;
  if (refused.count(key)) return nullptr;
  destroy_retired();
  if (plans.size() >= kMaxPlans) {  // ever-new shapes: start again rather than grow for ever
    for (const auto& entry : plans) retired.push_back(entry.second);
    plans.clear();
    refused.clear();
    destroy_retired();
  }
  try {
    return make_plan(key, a, b, state_of_device);
  } catch (...) {  // out of memory for the workspace, say: at::mm serves the call, and the key is tried again
    refused.erase(key);
    return nullptr;
  }
}

// The dispatch keys of a plain dense tensor on ``a``'s device, learnt once per device type.
c10::DispatchKeySet plain_keys(const at::Tensor& a) {
  static const c10::DispatchKeySet cuda = [&] {
    c10::InferenceMode normal(false);  // a tensor made in inference mode has no autograd keys
    return at::empty({0}, a.options().dtype(at::kByte)).key_set();
  }();
  return cuda;
}

// Whether at::mm would run (a, b) as one cuBLAS GEMM with nothing else to record or honour.
bool eligible(const at::Tensor& a, const at::Tensor& b) {
  const auto dtype = a.scalar_type();
  if ((dtype != at::kHalf && dtype != at::kBFloat16) || b.scalar_type() != dtype) return false;
  const c10::Device device = a.device();
  if (!device.is_cuda() || b.device() != device || a.size(0) == 0 || a.size(1) == 0 || b.size(1) == 0) return false;
  if (at::GradMode::is_enabled() && (a.requires_grad() || b.requires_grad())) return false;
  // Plain dense CUDA tensors alone (no ZeroTensor, conjugate or negative bit, functional or Python key), with no
  // forward-mode tangent to carry.
  if (a.key_set() != b.key_set() || a.key_set() != plain_keys(a)) return false;
  if (!a.has_storage() || !b.has_storage() || a._fw_grad(0).defined() || b._fw_grad(0).defined()) return false;
  // What the dispatcher would do around at::mm: a dispatch mode or a profiler sees aten::mm, autocast casts,
  // deterministic mode checks cuBLAS's workspace setting, fp16 accumulation changes the kernel.
  if (c10::impl::TorchDispatchModeTLS::any_modes_set() || at::hasCallbacks() ||
      at::autocast::is_autocast_enabled(at::kCUDA) || at::globalContext().deterministicAlgorithms() ||
      at::globalContext().allowFP16AccumulationCuBLAS()) {
    return false;
  }
  const auto reduction = dtype == at::kHalf ? at::globalContext().allowFP16ReductionCuBLAS()
                                            : at::globalContext().allowBF16ReductionCuBLAS();
  if (reduction != at::CuBLASReductionOption::AllowReducedPrecisionWithSplitK) return false;
  return on_default_stream(device) && is_current(device);
}

}  // namespace lt

// (a, b) by cublasLt's kept plan, plus ``bias`` (a row of N, or nullptr) by its epilogue, into a fresh C on the
// device's default stream; nullptr where not served here (then at::mm or at::addmm runs it), or the product.
PyObject* run_lt(const Signature& signature, const at::Tensor& a, const at::Tensor& b, const at::Tensor* bias) {
  if (!lt::found() || !lt::eligible(a, b)) return nullptr;
  const void* a_data = nullptr;
  const void* b_data = nullptr;
  const void* bias_data = nullptr;
  try {
    if (bias != nullptr) {
      // torch.addmm's bias as the epilogue takes it: one contiguous row of N, 16-byte aligned, nothing to record.
      if (bias->dim() != 1 || bias->size(0) != b.size(1) || (bias->size(0) > 1 && bias->stride(0) != 1) ||
          bias->scalar_type() != a.scalar_type() || bias->device() != a.device() || !bias->has_storage() ||
          bias->key_set() != a.key_set() || bias->_fw_grad(0).defined() ||
          (at::GradMode::is_enabled() && bias->requires_grad())) {
        return nullptr;
      }
      bias_data = bias->const_data_ptr();
      if (lt::alignment(bias_data) < 16) return nullptr;
    }
    a_data = a.const_data_ptr();
    b_data = b.const_data_ptr();
  } catch (...) {
    return nullptr;
  }
  const lt::Key key{signature, lt::alignment(a_data), lt::alignment(b_data), bias != nullptr};
  lt::DeviceState* device_state = nullptr;
  const lt::Plan* found = lt::plan_for(key, a, b, device_state);
  if (found == nullptr) return nullptr;
  const lt::Plan plan = *found;  // copied while the GIL is held
  void* handle = device_state->handle;
  const at::Tensor workspace = device_state->workspace;
  const int64_t m = a.size(0), n = b.size(1);
  at::Tensor c;
  int status = 0;
  bool failed = false;
  ++lt::in_flight;  // the plan's descriptors stay until every call that copied them is back
  Py_BEGIN_ALLOW_THREADS
  try {
    c = at::empty({m, n}, a.options());
    const float alpha = 1.0f, beta = 0.0f;
    std::unique_lock<std::mutex> hold;
    if (plan.bias_lock) {
      hold = std::unique_lock<std::mutex>(*plan.bias_lock);
      status = lt::api.desc_set(plan.op, lt::kDescBiasPointer, &bias_data, sizeof(bias_data));
    }
    if (status == 0) {
      status = lt::api.matmul(handle, plan.op, &alpha, b_data, plan.layout_a, a_data, plan.layout_b, &beta,
                              c.data_ptr(), plan.layout_c, c.data_ptr(), plan.layout_c, &plan.algo,
                              workspace.data_ptr(), plan.workspace, nullptr);
    }
  } catch (...) {
    failed = true;
  }
  Py_END_ALLOW_THREADS
  --lt::in_flight;
  if (status != 0) {  // cublasLt refused the plan: never again for this key
    lt::refused.insert(key);
    lt::retire(key);
  }
  if (failed || status != 0) return nullptr;  // an exception (out of memory for C): at::mm runs the call
  ++lt::served;
  return THPVariable_Wrap(std::move(c));
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
    if (local_modes == nullptr) Py_RETURN_NONE;
    if (!eager_signatures.count(signature)) {
      if (launch_plans.empty()) Py_RETURN_NONE;
      return run_launch(launch_plans, signature, a, b);
    }
    const int eager = serve_if(eager_now(a.device()));
    if (eager != 1) return eager < 0 ? nullptr : Py_NewRef(Py_None);
  }
  if (PyObject* served = run_lt(signature, a, b, nullptr)) return served;
  return run_released([&] { return at::mm(a, b); });
}

PyObject* try_addmm(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || dispatcher == nullptr ||
      (addmm_signatures.empty() && addmm_eager_signatures.empty() && bias_plans.empty()) || !plain(args[0]) ||
      !plain(args[1]) || !plain(args[2]) || at::impl::torch_function_mode_enabled()) {
    Py_RETURN_NONE;
  }
  const at::Tensor a = THPVariable_Unpack(args[0]);
  const at::Tensor b = THPVariable_Unpack(args[1]);
  if (a.dim() != 2 || b.dim() != 2) Py_RETURN_NONE;
  const Signature signature = make_signature(a, b);
  const at::Tensor bias = THPVariable_Unpack(args[2]);
  // matmul_bias takes one row of N in a's dtype, whichever path serves it; at::addmm would broadcast another
  // shape. The Python path refuses it, with the fix.
  if (bias.dim() != 1 || bias.size(0) != b.size(1) || bias.scalar_type() != a.scalar_type()) Py_RETURN_NONE;
  const bool every_mode = addmm_signatures.count(signature) > 0;
  if (every_mode || addmm_eager_signatures.count(signature)) {
    const int current = serve_if(dispatcher_reads(addmm_changes));
    if (current < 0) return nullptr;
    if (current == 1) {
      const int eager = every_mode ? 1 : serve_if(eager_now(a.device()));
      if (eager != 1) return eager < 0 ? nullptr : Py_NewRef(Py_None);  // a graph call: the Python path's plan
      if (PyObject* served = run_lt(signature, a, b, &bias)) return served;
      return run_released([&] { return at::addmm(bias, a, b); });
    }
  }
  // Not addmm's now (a stale addmm signature must not hide a Triton plan made since: a pin, a new table).
  if (bias_plans.empty()) Py_RETURN_NONE;
  return run_launch(bias_plans, signature, a, b, &bias);
}

PyObject* try_gated(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || gated_plans.empty() || !plain(args[0]) || !plain(args[1]) ||
      at::impl::torch_function_mode_enabled()) {
    Py_RETURN_NONE;
  }
  const at::Tensor a = THPVariable_Unpack(args[0]);
  const at::Tensor b = THPVariable_Unpack(args[1]);
  if (a.dim() != 2 || b.dim() != 2) Py_RETURN_NONE;
  return run_launch(gated_plans, make_signature(a, b), a, b);
}

// A MoE call (x, w, offsets) as the Python path checks it before its kept plan: plain tensors, no torch
// function or dispatch mode (a FLOP counter, a fake or functional tracer), x 2-D, w 3-D and offsets 1-D on one
// device; else None. Then its signature's plan: torch._grouped_mm (moe_matmul alone) or the handed-over launch.
PyObject* try_moe_call(PyObject* const* args, Py_ssize_t nargs, bool gated) {
  LaunchPlans& plans = gated ? moe_gated_plans : moe_plans;
  if (nargs != 3 || dispatcher == nullptr || (plans.empty() && (gated || moe_baseline.empty())) ||
      !plain(args[0]) || !plain(args[1]) || !plain(args[2]) || at::impl::torch_function_mode_enabled() ||
      c10::impl::TorchDispatchModeTLS::any_modes_set()) {
    Py_RETURN_NONE;
  }
  const at::Tensor x = THPVariable_Unpack(args[0]);
  const at::Tensor w = THPVariable_Unpack(args[1]);
  const at::Tensor offsets = THPVariable_Unpack(args[2]);
  if (x.dim() != 2 || w.dim() != 3 || offsets.dim() != 1 || w.device() != x.device() ||
      offsets.device() != x.device()) {
    Py_RETURN_NONE;
  }
  const Signature signature = make_moe_signature(x, w, offsets);
  if (gated || moe_baseline.empty()) return run_launch(plans, signature, x, w, nullptr, &offsets);
  auto found = moe_baseline.find(signature);
  if (found == moe_baseline.end()) {
    if (plans.empty()) Py_RETURN_NONE;
    return run_launch(plans, signature, x, w, nullptr, &offsets);
  }
  // As the Python path's kept plan: no gradient wanted (the operator with its backward serves that call),
  // the dispatcher's answers unchanged since the plan was made, an eager call, data with addresses.
  if (at::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad())) Py_RETURN_NONE;
  const int64_t made_under = found->second;
  const int current = serve_if(dispatcher_reads(made_under));
  if (current != 1) {
    if (current < 0) return nullptr;
    found = moe_baseline.find(signature);  // Python ran, which may have changed the set
    if (found != moe_baseline.end() && found->second == made_under) moe_baseline.erase(found);
    Py_RETURN_NONE;
  }
  const int eager = serve_if(eager_now(x.device()));
  if (eager != 1) return eager < 0 ? nullptr : Py_NewRef(Py_None);
  if (!x.has_storage() || !w.has_storage() || !offsets.has_storage()) Py_RETURN_NONE;
  PyObject* served = run_released([&] { return at::_grouped_mm(x, w, offsets); });
  if (served != Py_None) ++moe_baseline_served;
  return served;
}

PyObject* try_moe(PyObject*, PyObject* const* args, Py_ssize_t nargs) { return try_moe_call(args, nargs, false); }

PyObject* try_moe_gated(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return try_moe_call(args, nargs, true);
}

PyMethodDef try_moe_def = {
    "try_moe", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(try_moe)), METH_FASTCALL,
    "kernels.moe_matmul(x, w, offsets) by its handed-over plan (a Triton launch or torch._grouped_mm), else None"};

PyMethodDef try_moe_gated_def = {
    "try_moe_gated", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(try_moe_gated)), METH_FASTCALL,
    "kernels.moe_gated_matmul(x, w, offsets) by its handed-over Triton launch, else None"};

PyMethodDef try_addmm_def = {
    "try_addmm", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(try_addmm)), METH_FASTCALL,
    "torch.addmm(bias, a, b) if (a, b) has a matmul_bias signature dispatch sends to addmm, else None"};

PyMethodDef try_gated_def = {
    "try_gated", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(try_gated)), METH_FASTCALL,
    "kernels.gated_matmul(a, b) by its handed-over Triton launch, if it has one, else None"};

PyMethodDef try_mm_def = {"try_mm", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(try_mm)),
                          METH_FASTCALL, "a @ b by at::mm if (a, b) has a cuBLAS signature, else None"};

}  // namespace

// The signature of a plan key's fields, as kernels/_plans.py passes them (b's dtype and device are a's:
// the signature's first call checked that).
Signature signature_of(const std::vector<int64_t>& dims, at::ScalarType dtype, at::Device device) {
  TORCH_CHECK(dims.size() == 8, "a signature has 8 sizes and strides, got ", dims.size());
  const auto type = static_cast<int16_t>(device.type());
  const auto index = static_cast<int16_t>(device.index());
  return Signature{{dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], dims[7], 0, 0, 0, 0},
                   {static_cast<int16_t>(dtype), static_cast<int16_t>(dtype), type, type, index, index, 0, 0}};
}

void add(std::vector<int64_t> dims, at::ScalarType dtype, at::Device device) {
  const Signature signature = signature_of(dims, dtype, device);
  eager_signatures.erase(signature);
  launch_plans.erase(signature);
  cublas_signatures.insert(signature);
}

void add_eager(std::vector<int64_t> dims, at::ScalarType dtype, at::Device device) {
  const Signature signature = signature_of(dims, dtype, device);
  cublas_signatures.erase(signature);
  launch_plans.erase(signature);
  eager_signatures.insert(signature);
}

void discard(std::vector<int64_t> dims, at::ScalarType dtype, at::Device device) {
  const Signature signature = signature_of(dims, dtype, device);
  cublas_signatures.erase(signature);
  eager_signatures.erase(signature);
  launch_plans.erase(signature);
}

// A signature whose eager plan (and graph plan too, with ``both_modes``) launches compiled Triton kernels
// that take no scratch memory and no launch attributes (kernels/_launch.py DirectLaunch.native_launch): each
// kernel is (CUfunction, grid, threads, shared bytes, slot codes, values), launched in order. Served by
// ``run_launch`` from now on. False where this process has no CUDA driver loaded or a kernel takes more
// parameters than a launch here passes; the Python path then keeps serving the signature.
using KernelFields =
    std::tuple<int64_t, std::vector<int64_t>, int64_t, int64_t, std::vector<int>, std::vector<int64_t>>;

// The launch plan of ``kernels`` (as add_launch takes them), or false where this process cannot launch them.
bool make_launch_plan(std::vector<KernelFields>& kernels, bool both_modes, const std::vector<int64_t>& out_shape,
                      std::vector<at::Tensor> keep, LaunchPlan& plan) {
  TORCH_CHECK(out_shape.size() == 2, "a launch plan has a 2-D output");
  if (!driver_found() || kernels.empty() || kernels.size() > kMaxKernels) return false;
  for (auto& [function, grid, threads, shared, codes, values] : kernels) {
    TORCH_CHECK(grid.size() == 3 && codes.size() == values.size(), "a kernel has a 3-D grid and a value per parameter");
    if (codes.size() > kMaxParams || function == 0) return false;
    KernelLaunch kernel;
    kernel.function = reinterpret_cast<void*>(static_cast<uintptr_t>(function));
    kernel.grid = {static_cast<unsigned>(grid[0]), static_cast<unsigned>(grid[1]), static_cast<unsigned>(grid[2])};
    kernel.threads = static_cast<unsigned>(threads);
    kernel.shared = static_cast<unsigned>(shared);
    kernel.codes = std::move(codes);
    kernel.values.assign(values.begin(), values.end());
    plan.kernels.push_back(std::move(kernel));
  }
  plan.both_modes = both_modes;
  plan.out_shape = {out_shape[0], out_shape[1]};
  plan.keep = std::move(keep);
  return true;
}

bool add_launch(std::vector<int64_t> dims, at::ScalarType dtype, at::Device device, bool both_modes,
                std::vector<int64_t> out_shape, std::vector<KernelFields> kernels, std::vector<at::Tensor> keep) {
  LaunchPlan plan;
  if (!make_launch_plan(kernels, both_modes, out_shape, std::move(keep), plan)) return false;
  const Signature signature = signature_of(dims, dtype, device);
  cublas_signatures.erase(signature);
  eager_signatures.erase(signature);
  launch_plans[signature] = std::move(plan);
  return true;
}

// A kernels.matmul_bias (``gated`` false) or kernels.gated_matmul signature whose Triton plan
// (kernels/epilogue.py) launches ``kernels``, made while the dispatcher's ``changes`` count read ``changes``;
// ``bias_dtype``: the dtype its kernel reads the bias in (matmul_bias alone). Served by try_addmm or try_gated
// while the count stands. False where this process cannot launch them (the Python path keeps serving).
bool add_epilogue_launch(std::vector<int64_t> dims, at::ScalarType dtype, at::Device device, bool gated,
                         bool both_modes, std::vector<int64_t> out_shape, std::vector<KernelFields> kernels,
                         int64_t changes, std::optional<at::ScalarType> bias_dtype) {
  TORCH_CHECK(gated != bias_dtype.has_value(), "a matmul_bias launch reads a bias, a gated one none");
  LaunchPlan plan;
  if (!make_launch_plan(kernels, both_modes, out_shape, {}, plan)) return false;
  plan.changes = changes;
  plan.bias_dtype = bias_dtype ? static_cast<int16_t>(*bias_dtype) : -1;
  LaunchPlans& plans = gated ? gated_plans : bias_plans;
  if (plans.size() >= kEpiloguePlanCapacity) plans.clear();  // ever-new shapes must not grow memory for ever
  const Signature signature = signature_of(dims, dtype, device);
  if (!gated) {  // addmm's answer for it is older than this one
    addmm_signatures.erase(signature);
    addmm_eager_signatures.erase(signature);
  }
  plans[signature] = std::move(plan);
  return true;
}

// The dims, dtype and device of a MoE signature as kernels/_native.py passes them (x's and w's sizes, x's
// and w's strides, offsets' size and stride; x's dtype, offsets' dtype, the device).
Signature moe_signature_of(const std::vector<int64_t>& dims, at::ScalarType dtype, at::ScalarType offsets_dtype,
                           at::Device device) {
  TORCH_CHECK(dims.size() == 12, "a MoE signature has 12 sizes and strides, got ", dims.size());
  const auto type = static_cast<int16_t>(device.type());
  const auto index = static_cast<int16_t>(device.index());
  Signature signature{{}, {static_cast<int16_t>(dtype), static_cast<int16_t>(dtype), type, type, index, index,
                           static_cast<int16_t>(static_cast<int16_t>(offsets_dtype) + 1), 0}};
  std::copy(dims.begin(), dims.end(), signature.dims.begin());
  return signature;
}

// A kernels.moe_matmul eager signature whose plan is torch._grouped_mm, as the dispatcher's ``changes`` count
// read ``changes``: served by try_moe while the count stands.
void add_moe_baseline(std::vector<int64_t> dims, at::ScalarType dtype, at::ScalarType offsets_dtype, at::Device device,
                      int64_t changes) {
  const Signature signature = moe_signature_of(dims, dtype, offsets_dtype, device);
  if (moe_baseline.size() >= kEpiloguePlanCapacity) moe_baseline.clear();
  moe_plans.erase(signature);
  moe_baseline[signature] = changes;
}

// A kernels.moe_matmul (or, ``gated``, moe_gated_matmul) eager signature whose ready plan launches ``kernels``
// (x, w, the output and offsets in slots A, B, C and D) into a fresh [T, width] output, made while the
// dispatcher's ``changes`` count read ``changes``. False where this process cannot launch them.
bool add_moe_launch(std::vector<int64_t> dims, at::ScalarType dtype, at::ScalarType offsets_dtype, at::Device device,
                    bool gated, int64_t width, std::vector<KernelFields> kernels, int64_t changes) {
  LaunchPlan plan;
  const Signature signature = moe_signature_of(dims, dtype, offsets_dtype, device);
  if (!make_launch_plan(kernels, false, {signature.dims[0], width}, {}, plan)) return false;
  plan.changes = changes;
  LaunchPlans& plans = gated ? moe_gated_plans : moe_plans;
  if (plans.size() >= kEpiloguePlanCapacity) plans.clear();
  if (!gated) moe_baseline.erase(signature);
  plans[signature] = std::move(plan);
  return true;
}

void clear_moe() {
  moe_plans.clear();
  moe_gated_plans.clear();
  moe_baseline.clear();
}

size_t moe_size() { return moe_plans.size() + moe_gated_plans.size() + moe_baseline.size(); }

int64_t moe_baseline_calls() { return moe_baseline_served; }

void clear_epilogue_launches() {
  bias_plans.clear();
  gated_plans.clear();
}

size_t epilogue_launch_size() { return bias_plans.size() + gated_plans.size(); }

int64_t launches() { return launched; }

int64_t lt_served() { return lt::served; }

// torch.version.cuda's major (0: a torch without CUDA): which libcublasLt the plans are made with.
void use_cuda_major(int64_t major) {
  lt::soname = major > 0 ? "libcublasLt.so." + std::to_string(major) : "";
  lt::state = 0;
}

size_t lt_plans() { return lt::plans.size(); }

size_t launch_size() { return launch_plans.size(); }

// A matmul_bias signature that dispatch sends to torch.addmm in every mode, as the dispatcher's ``changes``
// counter read ``changes``: a newer count drops the set's older signatures, an older one is ignored.
// ``eager_only``: dispatch sends the signature to torch.addmm in eager calls alone.
void add_addmm(std::vector<int64_t> dims, at::ScalarType dtype, at::Device device, int64_t changes, bool eager_only) {
  if (changes < addmm_changes) return;
  if (changes > addmm_changes || addmm_signatures.size() + addmm_eager_signatures.size() >= kAddmmCapacity) {
    addmm_signatures.clear();
    addmm_eager_signatures.clear();
    addmm_changes = changes;
  }
  const Signature signature = signature_of(dims, dtype, device);
  bias_plans.erase(signature);  // a Triton plan for it is older than this answer
  (eager_only ? addmm_signatures : addmm_eager_signatures).erase(signature);
  (eager_only ? addmm_eager_signatures : addmm_signatures).insert(signature);
}

void clear_addmm() {
  addmm_signatures.clear();
  addmm_eager_signatures.clear();
}

// kernels.dispatch.DISPATCHER, kept for the process: whose ``changes`` counter try_addmm reads.
void use_dispatcher(py::object object) {
  changes_name = PyUnicode_InternFromString("changes");
  dispatcher = object.release().ptr();
}

void clear() {
  cublas_signatures.clear();
  eager_signatures.clear();
  launch_plans.clear();
  clear_epilogue_launches();
  clear_moe();
}

size_t size() { return cublas_signatures.size() + eager_signatures.size() + launch_plans.size(); }

size_t addmm_size() { return addmm_signatures.size() + addmm_eager_signatures.size(); }

// kernels._launch.native_allowed, kept for the process: asked before every launch from here.
void use_launch_check(py::object check) { launch_allowed = check.release().ptr(); }

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
  m.def("add_launch", &add_launch);
  m.def("add_epilogue_launch", &add_epilogue_launch);
  m.def("clear_epilogue_launches", &clear_epilogue_launches);
  m.def("epilogue_launch_size", &epilogue_launch_size);
  m.def("use_launch_check", &use_launch_check);
  m.def("launches", &launches);
  m.def("launch_size", &launch_size);
  m.def("lt_served", &lt_served);
  m.def("use_cuda_major", &use_cuda_major);
  m.def("lt_plans", &lt_plans);
  m.def("add_moe_baseline", &add_moe_baseline);
  m.def("add_moe_launch", &add_moe_launch);
  m.def("clear_moe", &clear_moe);
  m.def("moe_size", &moe_size);
  m.def("moe_baseline_calls", &moe_baseline_calls);
  m.attr("try_moe") = py::reinterpret_steal<py::object>(PyCFunction_New(&try_moe_def, nullptr));
  m.attr("try_moe_gated") = py::reinterpret_steal<py::object>(PyCFunction_New(&try_moe_gated_def, nullptr));
  m.attr("try_mm") = py::reinterpret_steal<py::object>(PyCFunction_New(&try_mm_def, nullptr));
  m.attr("try_addmm") = py::reinterpret_steal<py::object>(PyCFunction_New(&try_addmm_def, nullptr));
  m.attr("try_gated") = py::reinterpret_steal<py::object>(PyCFunction_New(&try_gated_def, nullptr));
  py::object parameter = py::module_::import("torch.nn.parameter").attr("Parameter");
  parameter_type = reinterpret_cast<PyTypeObject*>(parameter.release().ptr());  // kept for the process
}
