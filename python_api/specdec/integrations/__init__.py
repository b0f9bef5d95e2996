"""Engines the package plugs into, each optional and opt-in: :mod:`specdec.integrations.vllm` (vLLM's rejection
sampler replaced by specdec's verifier)."""
