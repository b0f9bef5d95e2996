"""Tensor-parallel targets: a model that transformers sharded with ``tp_plan`` inside an initialised
``torch.distributed`` process group (gloo on CPU, NCCL on GPU).

Every rank runs the same decoding loop on the same inputs. The target's forward is the only place ranks
communicate (transformers' all-reduces inside it), so its logits are the same on every rank; the draft is replicated
and every random draw comes from the same seed, so every rank drafts the same tree and accepts the same tokens with
no further messages. The few decisions that do not follow from tokens and seeds are made by rank 0 and broadcast:
the seed of an unseeded sampled run, the auto trees' shape (it follows the machine's timings) and the cost curve
they read. ``SPECDEC_CHECK_RANKS=1`` adds an all-gather of each round's accepted tokens that raises
:class:`~specdec.errors.RankDivergenceError` the round the ranks part (the tests run with it on).
"""

from __future__ import annotations

import datetime
import hashlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from .errors import RankDivergenceError, UnsupportedModelError

#: set to 1 to compare the ranks' accepted tokens after every round (one all-gather of a few integers per round)
CHECK_ENV = "SPECDEC_CHECK_RANKS"


def env_flag(name: str) -> bool:
    """Whether the on/off environment switch ``name`` is on (set, and not 0, false or no)."""
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def _dtensor_type() -> type | None:
    """torch's DTensor class where ``torch.distributed.tensor`` is loaded (no DTensor exists before it is; importing it
    costs most of a second, which a process without tensor parallelism never pays), else None."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


def is_dtensor(tensor: Any) -> bool:
    """Whether ``tensor`` is a DTensor (a shard or replica over a device mesh)."""
    dtensor = _dtensor_type()
    return dtensor is not None and isinstance(tensor, dtensor)


def sharded_parameters(model: torch.nn.Module) -> list[tuple[str, Any]]:
    """The parameters of ``model`` that are DTensors (sharded or replicated over a device mesh), with their names."""
    return [(n, p) for n, p in model.named_parameters() if is_dtensor(p)]


@dataclass
class Ranks:
    """The process group a tensor-parallel target is sharded over, and the few collectives the driver adds to the
    target's own (:mod:`specdec.distributed`)."""

    group: Any  # torch.distributed.ProcessGroup
    rank: int
    size: int
    #: compare every round's accepted tokens across ranks (``SPECDEC_CHECK_RANKS``)
    check: bool = False
    _leader: int = field(default=0, repr=False)  # global rank of the group's rank 0

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def from_leader(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (any picklable object; the others' ``value`` is ignored)."""
        box = [value if self.leader else None]
        torch.distributed.broadcast_object_list(box, src=self._leader, group=self.group)
        return box[0]

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order (picklable objects)."""
        out: list[Any] = [None] * self.size
        torch.distributed.all_gather_object(out, value, group=self.group)
        return out

    def require_equal(self, what: str, value: Any, hint: str, *, carry: Any = None) -> Any:
        """Raise :class:`RankDivergenceError` on every rank unless all ranks hold the same ``value``; returns rank
        0's ``carry`` (the same all-gather serves the check and a broadcast)."""
        values = self.gather((value, carry))
        first = values[0][0]
        for r, (v, _) in enumerate(values):
            if v != first:
                raise RankDivergenceError(
                    f"tensor-parallel ranks disagree on {what}: rank 0 has {_short(first)}, rank {r} has "
                    f"{_short(v)}; {hint}"
                )
        return values[0][1]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def tensor_parallel(model: torch.nn.Module, name: str = "target") -> Ranks | None:
    """The :class:`Ranks` of a model sharded by transformers' tensor parallelism (``tp_plan="auto"``), None for a
    model without DTensor parameters or sharded over a single rank. Raises UnsupportedModelError for layouts the
    driver does not run: more than one mesh dimension (pipeline or FSDP stages), ``device_map`` mixed with tensor
    parallelism, attention heads that do not divide among the ranks."""
    params = sharded_parameters(model)
    if not params:
        return None
    meshes: list[Any] = []  # distinct meshes (transformers may hand equal meshes as distinct objects)
    for _, p in params:
        if not any(p.device_mesh == m for m in meshes):
            meshes.append(p.device_mesh)
    root = getattr(model, "_device_mesh", None)
    extra = {}
    if root is not None and getattr(root, "mesh_dim_names", None):
        extra = {d: root[d].size() for d in root.mesh_dim_names if d != "tp" and root[d].size() > 1}
    if len(meshes) > 1 or any(m.ndim != 1 for m in meshes) or extra:
        raise UnsupportedModelError(
            f"{name} is sharded over more than one mesh dimension ({extra or 'several meshes'}): speculative decoding "
            "runs tensor parallelism only (a 1-D tp mesh); pipeline and FSDP stages are not supported"
        )
    if getattr(model, "hf_device_map", None):
        raise UnsupportedModelError(
            f"{name} was loaded with both device_map and tensor parallelism: load it with tp_plan alone (each rank "
            "holds its shard on its own device)"
        )
    mesh = meshes[0]
    group = mesh.get_group()
    size = torch.distributed.get_world_size(group)
    if size == 1:
        return None
    config = getattr(model, "config", None)
    for attr in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(config, attr, None)
        if isinstance(heads, int) and heads % size:
            raise UnsupportedModelError(
                f"{name}: {attr}={heads} does not divide among {size} tensor-parallel ranks (each rank must hold whole "
                f"heads); run a number of ranks that divides it"
            )
    return Ranks(
        group=group,
        rank=torch.distributed.get_rank(group),
        size=size,
        check=env_flag(CHECK_ENV),
        _leader=torch.distributed.get_global_rank(group, 0),
    )


def _modules(obj: Any, depth: int = 3) -> Iterator[torch.nn.Module]:
    """The torch modules ``obj`` is or holds: itself, or (for the package's drafters and adapters) the modules among
    its attributes and their lists, ``depth`` levels down."""
    if isinstance(obj, torch.nn.Module):
        yield obj
        return
    if depth == 0:
        return
    if isinstance(obj, (list, tuple)):
        items: Any = obj
    elif type(obj).__module__.startswith("specdec.") and hasattr(obj, "__dict__"):
        items = vars(obj).values()
    else:
        return
    for item in items:
        yield from _modules(item, depth - 1)


def check_replicated(draft: Any, name: str = "draft") -> None:
    """Refuse a sharded draft (a model, or a drafter running one): every rank runs the whole draft (it is small,
    and its tokens must be the same everywhere without messages)."""
    if any(sharded_parameters(m) for m in _modules(draft)):
        raise UnsupportedModelError(
            f"the {name} is sharded (DTensor parameters): load the draft without tp_plan, replicated on every rank; "
            "only the target is tensor-parallel"
        )


def _digest(tensor: torch.Tensor) -> str:
    """A short digest of a tensor's bytes: equal digests, equal contents."""
    return hashlib.sha256(bytes(tensor.detach().cpu().contiguous().numpy())).hexdigest()[:16]


def generator_fingerprint(generator: torch.Generator | None) -> str | None:
    """A short digest of a generator's state (None for no generator): equal digests, equal draws."""
    return None if generator is None else _digest(generator.get_state())


def agree_call(
    ranks: Ranks, input_ids: torch.Tensor, seed: int | None, generator: torch.Generator | None, greedy: bool
) -> int | None:
    """Check that every rank starts the same call (prompts, seed or generator state) and return the seed every rank
    uses: ``seed``, or for an unseeded sampled run without a generator one drawn on rank 0 from torch's global
    generator and broadcast (one all-gather for both)."""
    draw = None
    if not greedy and seed is None and generator is None and ranks.leader:
        draw = int(torch.randint(0, 2**63 - 1, ()))
    call = (tuple(input_ids.shape), _digest(input_ids.long()), seed, generator_fingerprint(generator))
    drawn = ranks.require_equal(
        "the call (input_ids shape, input_ids digest, seed, generator state)",
        call,
        "every rank must call generate with the same prompts and the same seed (or generators seeded alike)",
        carry=draw,
    )
    return seed if drawn is None else drawn


def check_round(ranks: Ranks, index: int, tokens: list[list[int]], finished: list[bool]) -> None:
    """The debug check (``SPECDEC_CHECK_RANKS``): every rank committed the same tokens in round ``index``."""
    ranks.require_equal(
        f"the tokens committed in round {index}",
        (tokens, finished),
        "the ranks' drafts or noise differ (run the same package build and CPU variant on every rank: "
        "SPECDEC_CPU_ISA; the same stopping criteria)",
    )


class CollectiveBytes(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the collectives run inside it and the bytes each rank sends into them (the input tensors of
    all-reduce, all-gather, broadcast and reduce-scatter ops, DTensor's functional ones included). Every op
    passes through Python while it is on: for counting, never for timing."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = func.name()
        if name.startswith(("c10d::", "_c10d_functional::")) and any(
            k in name for k in ("allreduce", "all_reduce", "allgather", "all_gather", "broadcast", "reduce_scatter")
        ):
            # what a rank sends: the input (c10d's gather and scatter ops take the output first, then the input)
            sent = args[1] if name.startswith("c10d::") and ("gather" in name or "scatter" in name) else args[0]
            self.calls += 1
            self.bytes += sum(
                t.numel() * t.element_size()
                for t in torch.utils._pytree.tree_leaves(sent)
                if isinstance(t, torch.Tensor)
            )
        return func(*args, **(kwargs or {}))


@contextmanager
def count_collectives() -> Iterator[CollectiveBytes]:
    """``with count_collectives() as c: ...`` then ``c.calls``, ``c.bytes`` (see :class:`CollectiveBytes`)."""
    with CollectiveBytes() as counter:
        yield counter


def init_from_env(timeout: datetime.timedelta | None = None) -> bool:
    """Under ``torchrun`` (``WORLD_SIZE`` > 1 in the environment) initialise the default process group if it is not
    yet: NCCL where CUDA is available, gloo otherwise (``timeout``: how long a collective waits for the other ranks,
    torch's default when None). Returns whether a process group of several ranks is up."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or not torch.distributed.is_available():
        return False
    if not torch.distributed.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.distributed.init_process_group(backend, timeout=timeout)
    return torch.distributed.get_world_size() > 1


def tp_load_kwargs() -> dict[str, Any]:
    """``from_pretrained`` keyword arguments that shard a model over the process group: ``distributed_config=
    DistributedConfig(tp_plan="auto")`` where transformers has it, else the older ``tp_plan="auto"``."""
    try:
        from transformers.distributed import DistributedConfig
    except ImportError:
        return {"tp_plan": "auto"}
    return {"distributed_config": DistributedConfig(tp_plan="auto")}
