"""Backend "triton": every kernel and launcher under one name, for the op registry (``__init__.py``), the compile
check and the tests. The kernels live by op family, as the C++ and CUDA sources do: ``sampling.py``, ``tree.py``,
``verify.py`` (with the node verifiers in ``node.py``), ``beam.py``, and what they share in ``common.py``."""

from __future__ import annotations

from .beam import (  # noqa: F401
    _expm1,
    _kseq_gamma_kernel,
    _log1p,
    _sbs_step_kernel,
    _spechub_sample_kernel,
    _truncated_gumbel,
    kseq_gamma,
    sbs_step,
    spechub_sample,
)
from .common import (  # noqa: F401
    ACCEPT,
    BLOCK,
    DRAFT,
    FINAL,
    SWOR_MASS_EPS,
    ZERO_MASS_TOL,
    ZERO_MASS_TOL_F64,
    _argmax_chunked,
    _argmax_plain,
    _block,
    _gumbel,
    _is_eos,
    _merge_chunk_best,
    _noise_at,
    _noise_block,
    _philox4x32_10,
    _philox_uniform,
    _sample_residual,
    _seed_args,
    _verify_noise,
)
from .node import (  # noqa: F401
    M_KSEQ,
    M_RRS,
    M_RRSW,
    M_SPECHUB,
    METHOD_CODE,
    _copy_row,
    _hub_terms,
    _kseq_gamma_row,
    _kseq_sums,
    _pow_int,
    _ratio_prob,
    _remove_and_renormalize,
    _residual_inplace,
    _verify_node_row,
)
from .paths import _verify_block_kernel, _verify_traversal_kernel  # noqa: F401
from .sampling import (  # noqa: F401
    _gumbel_topk_kernel,
    _order_key,
    _process_logits_kernel,
    _process_logits_logp,
    _rows,
    _sample_categorical_kernel,
    gumbel_topk,
    process_logits,
    sample_categorical,
)
from .tree import (  # noqa: F401
    _filter_kv_kernel,
    _tree_mask_kernel,
    _tree_positions_kernel,
    filter_kv,
    tree_mask,
    tree_positions,
)
from .verify import (  # noqa: F401
    _emission_law_kernel,
    _verify_chain_kernel,
    _verify_node_kernel,
    _verify_tree_kernel,
    emission_law,
    verify_chain,
    verify_node,
    verify_tree,
)
