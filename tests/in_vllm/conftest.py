"""The tests inside vLLM run in the virtualenv of scripts/install_vllm.sh (vLLM's CPU build pins another transformers
than the package's main environment): ``bash scripts/test_vllm.sh``. Elsewhere this folder is not collected."""

import importlib.util

_spec = importlib.util.find_spec("vllm")
# a real installed package (a folder named vllm on sys.path would be found as a namespace package without an origin)
collect_ignore_glob = [] if _spec is not None and _spec.origin is not None else ["*.py"]
