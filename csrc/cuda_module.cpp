// Python entry of the CUDA extension: `from specdec_kernels import _C_cuda` loads this shared object, which runs
// the TORCH_LIBRARY_IMPL(specdec, CUDA) initialisers of csrc/cuda/cuda_bindings.cpp (schemas come from _C).
#include <Python.h>

extern "C" PyObject* PyInit__C_cuda(void) {
  static PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C_cuda", "specdec CUDA ops (see torch.ops.specdec)", -1,
                                   nullptr};
  return PyModule_Create(&module_def);
}
