"""The few private names of torch and transformers the driver reads, each because no public one gives the same; this
file fails loudly (rather than the driver silently changing behaviour) when a release renames or drops one.

* ``torch.nn.modules.module._global_forward_hooks`` / ``_global_forward_pre_hooks``: a process-wide module hook must
  see every submodule called, so the fast path steps aside while one is registered (models/fastpath/layers.py).
* ``torch.cpu._is_amx_tile_supported``: whether PyTorch's own bf16 linear has AMX, which sets how many rows go to
  skinny_linear (models/fastpath/linear.py).
* ``Tensor._version``: the in-place edit counter that tells a weight changed after ``int8_weights``
  (models/fastpath/int8.py) or a rotary table is stale (models/fastpath/layers.py).
* ``PretrainedConfig._attn_implementation``: the attention a model runs; the routing switches it for the adapter's
  own forwards and back (models/fastpath/routing.py).
* ``GenerationConfig._get_default_generation_params``: transformers' global defaults, against which a setting the
  decoders do not implement is told from one left at its default (decoder.py, generation.py).
* the frame of transformers' ``generate`` holding ``assistant_model`` and ``streamer`` (edge.generate_call; tested in
  test_hf_generate.py).
"""

import torch
import transformers
from torch.nn.modules import module as torch_module


def test_torch_private_names_exist():
    assert isinstance(torch_module._global_forward_hooks, dict)
    assert isinstance(torch_module._global_forward_pre_hooks, dict)
    assert isinstance(bool(torch.cpu._is_amx_tile_supported()), bool)
    t = torch.zeros(3)
    before = t._version
    t.add_(1)
    assert t._version > before


def test_a_global_hook_is_seen():
    from specdec.models.fastpath.layers import global_hooks

    assert not global_hooks()
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *args: None)
    try:
        assert global_hooks()
    finally:
        handle.remove()
    assert not global_hooks()


def test_transformers_private_names_exist():
    config = transformers.LlamaConfig(
        vocab_size=16,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        attn_implementation="sdpa",
    )
    model = transformers.LlamaForCausalLM(config)
    assert model.config._attn_implementation == "sdpa"
    defaults = transformers.GenerationConfig()._get_default_generation_params()
    assert isinstance(defaults, dict) and "temperature" in defaults
