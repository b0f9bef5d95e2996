"""Packaging: a wheel built from this tree installs in a fresh virtualenv and runs with its compiled kernels.

Slow (it compiles the extension once more). The virtualenv sees the system's torch and transformers
(``--system-site-packages``, no network), but the package itself comes only from the wheel: the test checks that the
imported module lives in the virtualenv, not in this checkout.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = textwrap.dedent(
    """
    import sys, torch, transformers
    import specdec, specdec_kernels
    assert specdec_kernels.__file__.startswith(sys.prefix), specdec_kernels.__file__
    assert "cpu" in specdec_kernels.available_backends(), specdec_kernels.available_backends()
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    target, draft = transformers.LlamaForCausalLM(cfg).eval(), transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.tensor([[1, 5, 9, 3]])
    out = specdec.generate(target, draft, ids, max_new_tokens=8, method="sd", temperature=0.0)
    ref = target.generate(ids, max_new_tokens=8, do_sample=False)
    assert out.sequences[0].tolist() == ref[0].tolist(), (out.sequences, ref)
    print("wheel ok", specdec_kernels.__version__)
    """
)


def run(cmd: list[str], cwd: str) -> str:
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, f"{' '.join(cmd)} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res.stdout


@pytest.mark.slow
def test_wheel_installs_and_runs_in_a_fresh_virtualenv(tmp_path):
    pytest.importorskip("build")
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), ROOT], cwd=ROOT)
    wheels = glob.glob(str(dist / "*.whl"))
    assert len(wheels) == 1, wheels
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], cwd=str(tmp_path))
    py = str(venv / "bin" / "python")
    run([py, "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall", wheels[0]], cwd=str(tmp_path))
    # run outside the checkout with no editable install visible, so only the wheel can provide the packages
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([py, "-I", "-c", SCRIPT], cwd=str(tmp_path), capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "wheel ok" in res.stdout


@pytest.mark.slow
def test_sdist_carries_the_kernel_sources(tmp_path):
    import tarfile

    pytest.importorskip("build")
    run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path), ROOT], cwd=ROOT)
    (sdist,) = glob.glob(str(tmp_path / "*.tar.gz"))
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"csrc/torch_bindings.cpp", "csrc/include/specdec/verify.h", "csrc/cuda/verify.cu", "LICENSE"} <= names
    assert {"specdec_kernels/py.typed", "python_api/specdec/py.typed"} <= names


#: What a run on a lent GPU machine receives is the tracked tree, capped at 64 MiB per call together with the carried
#: paths (wheels the machine lacks): the tracked files keep under 40 MiB to leave room for them.
TRACKED_LIMIT = 40 * 2**20


def test_tracked_files_fit_one_device_call():
    res = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, timeout=60)
    if res.returncode != 0:
        pytest.skip("not a git checkout")
    paths = [p for p in res.stdout.decode().split("\0") if p]
    sizes = {p: os.path.getsize(os.path.join(ROOT, p)) for p in paths if os.path.isfile(os.path.join(ROOT, p))}
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
    assert len(sizes) > 100, f"git ls-files listed only {len(sizes)} files"
    assert total <= TRACKED_LIMIT, (
        f"tracked files hold {total / 2**20:.1f} MiB, over {TRACKED_LIMIT / 2**20:.0f} MiB; largest: {largest}"
    )


def test_no_function_over_complexity_30() -> None:
    """Every Python function of the package, the benchmarks, the scripts and the tests has a cyclomatic complexity of
    at most 30 as lizard counts it (boolean operators and comprehension conditions included)."""
    lizard = pytest.importorskip("lizard", reason="lizard is in the test extras")
    roots = ["python_api", "specdec_kernels", "benchmarks", "scripts", "tests"]
    from pathlib import Path

    paths = [str(p) for r in roots for p in sorted((Path(ROOT) / r).rglob("*.py"))]
    over = [
        f"{info.filename}:{fn.start_line} {fn.name} has complexity {fn.cyclomatic_complexity}"
        for info in lizard.analyze_files(paths)
        for fn in info.function_list
        if fn.cyclomatic_complexity > 30
    ]
    assert not over, over
    # the count's power: a function of 31 branches is seen as over the limit
    branchy = "def f(x):\n" + "".join(f"    if x == {i}:\n        return {i}\n" for i in range(30)) + "    return -1\n"
    (fn,) = lizard.analyze_file.analyze_source_code("branchy.py", branchy).function_list
    assert fn.cyclomatic_complexity == 31
