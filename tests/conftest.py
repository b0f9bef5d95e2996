import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for sub in ("", "python_api"):
    path = os.path.join(ROOT, sub)
    if path not in sys.path:
        sys.path.insert(0, path)

torch.set_num_threads(min(2, torch.get_num_threads()))

# Without a GPU, Triton kernels run on CPU tensors only under the interpreter; it must be on before the kernel
# module is imported (specdec_kernels.triton imports it lazily, at the first Triton call).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
