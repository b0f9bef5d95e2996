"""One rank of the tensor-parallel tests (run by ``torchrun --nproc_per_node 2``): loads the target sharded with
tp_plan="auto" and the draft replicated, runs tp_cases.run_cases with the ranks' per-round check on, then the
refusals and the check's own power runs, and writes what it saw to ``<out>/rank<r>.json``."""

from __future__ import annotations

import datetime
import json
import os
import sys
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))


def _error(fn) -> str | None:
    try:
        fn()
    except Exception as err:  # the test asserts the class and the message
        return f"{type(err).__name__}: {err}"
    return None


class _PipelineMesh:
    """What transformers' root device mesh answers for a model with 2 pipeline stages beside tensor parallelism."""

    mesh_dim_names = ("pp", "tp")

    def __getitem__(self, name: str):
        return type("Dim", (), {"size": lambda self: 2})()


def main(target_dir: str, draft_dir: str, heads3_dir: str, out: str, families_dir: str) -> None:
    import specdec
    from specdec.distributed import check_round, init_from_env, tp_load_kwargs
    from specdec.errors import RankDivergenceError
    from tiny_models import left_pad
    from tp_cases import PROMPTS, run_cases, run_families
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    assert init_from_env(timeout=datetime.timedelta(seconds=120))  # a hang fails the test, not CI
    rank = dist.get_rank()
    report: dict = {"rank": rank}
    try:
        target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32, **tp_load_kwargs()).eval()
        draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
        report["sharded"] = type(target.model.layers[0].mlp.up_proj.weight).__name__
        report["runs"] = run_cases(target, draft)
        # the fast path takes the sharded linears (fastpath.sharded) and puts transformers' forwards back after
        routing = specdec.SpeculativeDecoder(target, None, method="ar").target.routing
        report["sharded_routed"] = len(routing.sharded)
        report["restored"] = all(m.__dict__["forward"].__code__.co_name == "tp_forward" for m, _, _ in routing.sharded)
        ids0, mask0 = left_pad(PROMPTS)
        plain = specdec.SpeculativeDecoder(target, draft, method="rsd_c", branching=(2, 2), fast_path=False)
        report["fast_path_off"] = plain.generate(ids0, mask0, max_new_tokens=12, seed=11).new_tokens
        families = {
            name: AutoModelForCausalLM.from_pretrained(os.path.join(families_dir, name), **tp_load_kwargs()).eval()
            for name in sorted(os.listdir(families_dir))
        }
        report["families"] = run_families(families)
        ids, mask = left_pad(PROMPTS)
        dec = specdec.SpeculativeDecoder(target, draft, method="sd", draft_length=2)
        # refusals, on every rank alike
        sharded_draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32, **tp_load_kwargs())
        report["sharded_draft"] = _error(lambda: specdec.SpeculativeDecoder(target, sharded_draft, method="sd"))
        heads3 = AutoModelForCausalLM.from_pretrained(heads3_dir, dtype=torch.float32, **tp_load_kwargs())
        report["heads"] = _error(lambda: specdec.SpeculativeDecoder(heads3, None, method="ar"))
        report["max_time"] = _error(lambda: dec.generate(ids, mask, max_new_tokens=4, max_time=5.0))
        target.hf_device_map = {"": "cpu"}  # as from_pretrained(device_map=...) leaves it
        report["device_map"] = _error(lambda: specdec.SpeculativeDecoder(target, draft, method="sd"))
        del target.hf_device_map
        mesh = target._device_mesh
        target._device_mesh = _PipelineMesh()  # a 2-stage pipeline dimension beside tp
        report["pipeline"] = _error(lambda: specdec.SpeculativeDecoder(target, draft, method="sd"))
        target._device_mesh = mesh
        # the checks' power: ranks that start another call, ranks that commit other tokens
        report["other_seed"] = _error(
            lambda: dec.generate(ids, mask, max_new_tokens=4, do_sample=True, temperature=0.8, seed=rank)
        )
        ranks = dec.target.ranks
        report["other_tokens"] = _error(lambda: check_round(ranks, 0, [[1, 2, rank]], [False]))
        report["same_tokens"] = _error(lambda: check_round(ranks, 0, [[1, 2, 3]], [False]))
        report["divergence_class"] = RankDivergenceError.__name__
    except Exception:
        report["crash"] = traceback.format_exc()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
        json.dump(report, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:6])
