"""The tests inside vLLM run in the virtualenv of scripts/install_vllm.sh (vLLM's CPU build pins another transformers
than the package's main environment): ``bash scripts/test_vllm.sh``. Elsewhere this folder is not collected."""

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("vllm") is not None else ["*.py"]
