"""Trees chosen for the machine (specdec.autotree, branching="auto"): the shape enumeration, the acceptance counts,
the cost curve and its cache, and the choice between shapes."""

from __future__ import annotations

import json

import pytest
import specdec
import specdec.methods.builders.auto as auto_module
import torch
from specdec import autotree
from specdec.autotree import AcceptanceModel, CostCurve, choose, round_cost, shapes
from tiny_models import tiny_llama

import specdec_kernels as sk

FLAT = CostCurve(target={1: 0.040, 2: 0.041, 4: 0.042, 8: 0.044, 16: 0.050, 32: 0.090}, draft={1: 0.002, 8: 0.003})
STEEP = CostCurve(target={1: 0.040, 2: 0.060, 4: 0.100, 8: 0.180, 16: 0.340, 32: 0.660}, draft={1: 0.002, 8: 0.003})


def test_shapes_are_non_increasing_and_within_the_node_budget() -> None:
    seen = list(shapes(8, 6))
    assert len(seen) == len(set(seen))
    for s in seen:
        assert all(a >= b for a, b in zip(s, s[1:], strict=False))
        nodes, size = 1, 1
        for b in s:
            size *= b
            nodes += size
        assert nodes <= 8 and len(s) <= 6
    assert (1,) in seen and (1, 1, 1, 1, 1, 1) in seen and (2, 2) in seen and (4,) in seen
    assert (2, 2, 1) not in seen  # 1 + 2 + 4 + 4 nodes
    assert (3, 3) not in seen  # 1 + 3 + 9 nodes


def test_acceptance_counts_ranks_by_depth() -> None:
    m = AcceptanceModel()
    prior = m.g(1, 0)
    for _ in range(100):  # depth 1 always accepted at rank 1 (the second sibling), depth 2 always rejected
        m.observe((2, 2), [1], 1, 2)
    assert m.g(1, 1) > 0.9 and m.g(1, 0) < 0.1
    assert m.g(2, 0) < 0.1 and m.g(2, 1) < 0.1
    assert m.g(3, 0) == pytest.approx(prior)  # never reached: the prior
    assert m.accept(1, 1) < 0.1 < 0.9 < m.accept(1, 2)


@pytest.mark.parametrize("width", [2, 3])
def test_level_acceptance_matches_the_rounds(width: int) -> None:
    """Rounds as recursive rejection runs them: rank 0 tried first, rank k only once ranks < k were rejected, each
    accepted with its own chance given that. A(width) must be the share of rounds whose level accepted a child (a sum
    of the per-rank chances would overstate it: 0.5 + 0.4 against 0.7 at width 2)."""
    chance = (0.5, 0.4, 0.3)
    gen = torch.Generator().manual_seed(0)
    m = AcceptanceModel()
    rounds, hits = 4000, 0
    for _ in range(rounds):
        u = torch.rand(width, generator=gen).tolist()
        rank = next((k for k in range(width) if u[k] < chance[k]), None)
        if rank is None:
            m.observe((width,), [], 0, 1)
        else:
            m.observe((width,), [rank], 1, 1)
            hits += 1
    share = hits / rounds
    assert m.accept(1, width) == pytest.approx(share, abs=0.03)  # 3 sd of a share over 4000 rounds: 0.022
    exact = 1.0
    for k in range(width):
        exact *= 1 - chance[k]
    assert share == pytest.approx(1 - exact, abs=0.03)


def test_optimism_adds_posterior_deviations_that_shrink_with_the_trials() -> None:
    plain, hopeful = AcceptanceModel(), AcceptanceModel(optimism=1.0)
    mean = autotree.PRIOR[0]
    sd = (mean * (1 - mean) / (autotree.PRIOR_WEIGHT + 1)) ** 0.5
    assert hopeful.g(3, 0) == pytest.approx(plain.g(3, 0) + sd)  # a cell never reached: the prior, plus one sd
    assert hopeful.h(1) > plain.h(1)
    for _ in range(2000):
        for m in (plain, hopeful):
            m.observe((1,), [0], 1, 1)
            m.observe((1,), [], 0, 1)
    assert hopeful.g(1, 0) - plain.g(1, 0) == pytest.approx((0.25 / 4005) ** 0.5, rel=0.01)
    with pytest.raises(ValueError, match="optimism"):
        AcceptanceModel(optimism=-1.0)
    for bad in (float("nan"), "1", True, None):
        with pytest.raises(ValueError, match="optimism"):
            AcceptanceModel(optimism=bad)


def test_optimism_tries_a_level_no_shape_reached_and_leaves_it_once_it_fails(tmp_path, monkeypatch) -> None:
    """Chains of two drafts, each accepted about half the time: without optimism the third level keeps its prior,
    which makes a chain of two the choice, and no round ever counts the third level. With it, the third level is
    tried; once it is seen to fail, the choice goes back to two."""
    curve = CostCurve(target={1: 0.040, 2: 0.041, 4: 0.042, 8: 0.044, 16: 0.050, 32: 0.090}, draft={1: 0.004})
    chosen = {}
    for optimism in (0.0, 1.0):
        m = AcceptanceModel(optimism=optimism)
        for i in range(1000):
            first = i % 2 == 0
            second = first and i % 4 == 0
            m.observe((1, 1), [0, 0][: first + second], first + second, 2)
        chosen[optimism] = choose(curve, m, batch=1, max_nodes=16, max_depth=6, max_width=1)[0]
        for _ in range(300):  # the third level tried and rejected
            m.observe((1, 1, 1), [0, 0], 2, 3)
        assert choose(curve, m, batch=1, max_nodes=16, max_depth=6, max_width=1)[0] == (1, 1)
    assert chosen == {0.0: (1, 1), 1.0: (1, 1, 1)}
    builder = drafting_auto_decoder(tmp_path, monkeypatch).builder  # the auto trees choose with optimism
    assert builder.acceptance.optimism == autotree.EXPLORE > 0


def test_expected_tokens_is_one_plus_the_reach_of_each_level() -> None:
    m = AcceptanceModel()
    a1, a2 = m.accept(1, 2), m.accept(2, 1)
    assert m.expected_tokens((2, 1)) == pytest.approx(1 + a1 + a1 * a2)


def test_choice_follows_the_cost_curve_and_the_acceptance() -> None:
    good = AcceptanceModel()
    for _ in range(300):  # every draft accepted at rank 0, to depth 6
        good.observe((1,) * 6, [0] * 6, 6, 6)
    deep, _, _ = choose(FLAT, good, batch=1, max_nodes=8, max_depth=6)
    assert deep == (1, 1, 1, 1, 1, 1)  # cheap passes and sure drafts: the deepest chain
    bad = AcceptanceModel()
    for _ in range(300):  # nothing is ever accepted
        bad.observe((4,), [], 0, 1)
    shallow, _, _ = choose(FLAT, bad, batch=1, max_nodes=8, max_depth=6)
    assert shallow == ()  # drafts that are never accepted: plain decoding
    wide, _, _ = choose(STEEP, good, batch=8, max_nodes=8, max_depth=6)
    assert round_cost(STEEP, wide, 8) <= round_cost(STEEP, deep, 8)
    rate = lambda s, c, b: good.expected_tokens(s) / round_cost(c, s, b)  # noqa: E731
    best, _, best_rate = choose(STEEP, good, batch=8, max_nodes=8, max_depth=6)
    assert best_rate == pytest.approx(max([1 / STEEP.target_cost(8), *(rate(s, STEEP, 8) for s in shapes(8, 6))]))


def test_a_rounds_first_draft_step_is_costed_apart() -> None:
    """The first step of a round (which also reads the committed tokens, its weights cold) is charged once per
    round, the later levels at the later steps' cost: a slow first step does not make deep trees look dear."""
    c = CostCurve(target={1: 0.04, 64: 0.04})
    assert c.first_cost(1) == c.draft_cost(1)  # nothing seen: one cost for every step
    for _ in range(3):
        c.observe_first(1, 0.002)
        c.observe_draft(3, 0.0008)
    assert c.first_cost(1) == pytest.approx(0.002) and c.draft_cost(3) == pytest.approx(0.0008)
    deep, shallow = (3, 1, 1), (3,)
    extra = round_cost(c, deep, 1) - round_cost(c, shallow, 1)
    assert extra == pytest.approx(2 * 0.0008 + c.target_cost(6) - c.target_cost(4))


def test_steps_are_timed_level_by_level(tmp_path, monkeypatch) -> None:
    """A drafting round reports its first step to observe_first at the batch's rows and each later level of the
    shape to observe_draft at that level's rows."""
    decoder = drafting_auto_decoder(tmp_path, monkeypatch)
    monkeypatch.setattr(auto_module, "choose", lambda *a, **k: ((2, 2), 0, 1.0))
    firsts: list[int] = []
    laters: list[int] = []
    monkeypatch.setattr(CostCurve, "observe_first", lambda self, r, s: firsts.append(r))
    monkeypatch.setattr(CostCurve, "observe_draft", lambda self, r, s: laters.append(r))
    decoder.generate(torch.tensor([[t % 32 for t in range(40)]] * 2), max_new_tokens=12, do_sample=False)
    assert firsts and set(firsts) == {2}  # two rows, one root each
    assert laters and set(laters) <= {4}  # the second level: two rows x two nodes


def test_draft_cost_follows_what_the_rounds_observe() -> None:
    """A mean per row count with recent steps weighing more (COST_DECAY per step): a machine that slows down moves
    it to the new cost within a few dozen steps."""
    c = CostCurve(target={1: 0.04, 2: 0.041})
    assert c.draft_cost(1) == pytest.approx(0.002)  # a twentieth of a one-row pass until a step is seen
    c.observe_draft(1, 0.005)
    c.observe_draft(1, 0.007)
    d = autotree.COST_DECAY
    assert c.draft_cost(1) == pytest.approx((d * 0.005 + 0.007) / (d + 1))
    for _ in range(200):
        c.observe_draft(1, 0.009)
    assert c.draft_cost(1) == pytest.approx(0.009, rel=1e-2)


def test_pass_cost_is_the_measured_curve_times_the_rounds_ratio_to_it() -> None:
    """Rounds whose verification side costs (a + b * nodes) times the measured pass: the fit finds a and b, and
    target_cost multiplies the curve by them; nothing changes before a few rounds, and rounds faster than the curve
    (a curve measured during a slow spell) bring it down, to half at most."""
    c = CostCurve(target={1: 0.02, 64: 0.02})
    c.observe_pass(3, 0.03)
    assert c.target_cost(3) == pytest.approx(0.02)  # one round: not used yet
    c = CostCurve(target={1: 0.02, 64: 0.02})
    for _ in range(20):  # sizes 1 and 33: variance 256, so the ridge shrinks the slope by under 2 %
        for rows in (1, 33):
            c.observe_pass(rows, 0.02 * (1.1 + 0.05 * rows))
    for rows in (1, 4, 8, 16, 33):
        # the fitted line passes through the rounds' mean (17 nodes) with the slope shrunk by under 2 %
        assert c.pass_ratio(rows) == pytest.approx(1.1 + 0.05 * rows, abs=0.02 * 0.05 * 16)
        assert c.target_cost(rows) == pytest.approx(0.02 * (1.1 + 0.05 * rows), abs=0.02 * 0.02 * 0.05 * 16)
    faster = CostCurve(target={1: 1.0, 64: 1.0})
    for _ in range(10):
        for rows in (1, 5):
            faster.observe_pass(rows, 0.8)
    assert faster.pass_ratio(5) == pytest.approx(0.8) and faster.target_cost(5) == pytest.approx(0.8)
    for _ in range(10):
        for rows in (1, 5):
            faster.observe_pass(rows, 0.01)
    assert faster.pass_ratio(5) == autotree.PASS_MIN_RATIO


def test_pass_cost_slope_needs_rounds_of_several_sizes() -> None:
    """Rounds of sizes 3 and 4 only (a shared machine slowing down while the larger trees ran): their ratio grows
    by a pass per node, but two sizes one node apart cannot tell a slope from a change of the machine's speed, so
    the fit stays near their mean ratio instead of pricing a 16-node tree at several passes."""
    c = CostCurve(target={1: 1.0, 64: 1.0})
    for _ in range(30):
        c.observe_pass(3, 1.0 + 0.5)
        c.observe_pass(4, 1.0 + 1.5)
    mean = c.pass_ratio(3.5)
    assert mean == pytest.approx(2.0, abs=0.05)
    assert c.pass_ratio(16) < mean + 0.1 * 12.5  # an unshrunk fit: mean + 1.0 * 12.5


def test_a_uniform_slowdown_leaves_the_choice_unchanged() -> None:
    """A slow spell of a shared machine scales every cost of a round. Once the spell's rounds dominate the decayed
    fits, the pass and the draft steps are priced 1.6 times as high and the shape chosen is the one chosen before
    the spell. (A fitted difference instead, with the steps' plain means, moves the choice here from one level of
    two siblings to two levels: it grows a one-node pass and a larger tree's alike, so the larger tree looks cheap.)"""
    good = AcceptanceModel()
    # first level: the first child accepted half the time, the second half of the rest, later ones almost never;
    # second level: the first child a third of the time, the second almost never; third level almost never
    for _ in range(300):
        for ranks, n in (([0, 0], 2), ([1], 1), ([], 0), ([0], 1)):
            good.observe((4, 2, 2), ranks, n, 3)
    measured = {1: 1.0, 2: 1.05, 4: 1.15, 8: 1.5, 16: 2.4, 64: 9.6}
    curve = CostCurve(target=measured)

    def rounds(speed: float) -> None:
        for _ in range(150):
            for rows in (1, 3, 5, 7, 9):
                # a round's verification side: the pass at a longer context and the commit, 10 % over the curve
                curve.observe_pass(rows, speed * 1.1 * curve.measured_pass(rows))
            curve.observe_first(1, speed * 0.06)
            for rows in (1, 2, 4, 8):
                curve.observe_draft(rows, speed * 0.03 * (1 + 0.1 * rows))

    rounds(1.0)
    before = choose(curve, good, batch=1, max_nodes=16, max_depth=6)
    cost_before = round_cost(curve, before[0], 1)
    rounds(1.6)
    after = choose(curve, good, batch=1, max_nodes=16, max_depth=6)
    assert before[0] == (2,)
    assert after[0] == before[0] and after[1] == before[1], (before, after)
    assert after[2] == pytest.approx(before[2] / 1.6, rel=1e-3)
    assert round_cost(curve, before[0], 1) == pytest.approx(1.6 * cost_before, rel=1e-3)


def test_observed_pass_costs_steer_the_choice_to_smaller_trees() -> None:
    """A flat measured curve makes a wide tree look free; rounds that show each node costing a tenth of a pass
    more move the choice to fewer nodes."""
    good = AcceptanceModel()
    for _ in range(300):  # the first child accepted half the time, the second a fifth, at every depth
        for ranks, n in (([0, 0], 2), ([1], 1), ([], 0), ([0], 1)):
            good.observe((2, 2), ranks, n, 2)
    flat = CostCurve(target={1: 1.0, 64: 1.0}, draft={1: 0.01, 64: 0.01})
    wide, _, _ = choose(flat, good, batch=1, max_nodes=16, max_depth=6)
    for _ in range(20):
        for rows in (1, 3, 7):
            flat.observe_pass(rows, 1.0 + 0.1 * rows)
    small, _, _ = choose(flat, good, batch=1, max_nodes=16, max_depth=6)
    assert 1 + sum(_level_sizes(small)) < 1 + sum(_level_sizes(wide)), (small, wide)


def _level_sizes(shape: tuple[int, ...]) -> list[int]:
    sizes, size = [], 1
    for b in shape:
        size *= b
        sizes.append(size)
    return sizes


def test_curve_is_measured_once_then_read_from_the_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    calls = []
    curve = autotree.load_or_measure("k1", lambda n: calls.append(n))
    assert set(curve.target) == set(autotree.CURVE_ROWS) and calls
    n_calls = len(calls)
    again = autotree.load_or_measure("k1", lambda n: calls.append(n))
    assert len(calls) == n_calls and again.target == curve.target
    path = tmp_path / "costs" / "k1.json"
    assert set(json.loads(path.read_text())["target"]) == {str(n) for n in autotree.CURVE_ROWS}
    path.write_text("{not json")
    autotree.load_or_measure("k1", lambda n: calls.append(n))  # a damaged file is measured again
    assert len(calls) > n_calls


def test_measuring_says_so_and_shows_progress(tmp_path, monkeypatch, caplog, capsys) -> None:
    import logging

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    with caplog.at_level(logging.INFO, logger="specdec"):
        autotree.load_or_measure("k2", lambda n: None)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("specdec")]
    assert any("measuring this machine's target pass cost" in m and str(tmp_path) in m for m in lines), lines
    assert "measuring the pass cost for auto trees" in capsys.readouterr().err  # the tqdm bar
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="specdec"):
        autotree.load_or_measure("k2", lambda n: pytest.fail("measured again"))
    assert not caplog.records  # read from the cache: nothing to say


def test_an_unwritable_cache_names_the_directory_and_the_variable(tmp_path, monkeypatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("SPECDEC_CACHE", str(blocker))
    with pytest.raises(specdec.errors.CacheDirError, match="SPECDEC_CACHE") as exc:
        autotree.load_or_measure("k3", lambda n: pytest.fail("measured before the cache was checked"))
    assert str(blocker) in str(exc.value) and isinstance(exc.value, OSError)
    target = tiny_llama(0, vocab=32, hidden=32)
    with pytest.raises(specdec.errors.CacheDirError, match="branching="):
        specdec.SpeculativeDecoder(target, tiny_llama(1, vocab=32, hidden=32), method="rsd_c", branching="auto")


def test_calibrate_ahead_then_the_first_call_measures_nothing(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    threads = torch.get_num_threads()
    try:
        _calibrate_then_decode(tmp_path, monkeypatch, capsys)
    finally:
        torch.set_num_threads(threads)


def _calibrate_then_decode(tmp_path, monkeypatch, capsys) -> None:
    from specdec import cli
    from test_cli import tiny_model_dir

    folder = tiny_model_dir(tmp_path / "model")
    assert cli.main(["calibrate", "--model", folder, "--dtype", "fp32", "--threads", "1"]) == 0
    files = list((tmp_path / "cache" / "costs").glob("*.json"))
    assert len(files) == 1 and str(files[0]) in capsys.readouterr().out
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa").eval()
    monkeypatch.setattr(autotree, "measure_target", lambda *a, **k: pytest.fail("measured again"))
    dec = specdec.SpeculativeDecoder(model, "ngram", method="rsd_c", branching="auto")
    assert dec.builder.curve is not None
    assert specdec.calibrate(model) == files[0]
    with pytest.raises(SystemExit) as exc:
        cli.main(["calibrate", "--model", str(tmp_path / "nothing-here")])
    assert exc.value.code == 2


def test_curve_key_names_the_processor_model(monkeypatch) -> None:
    """Two machines of one instruction set (a cache directory shared across a cluster's nodes) get two curves."""
    model = tiny_llama(0, vocab=32, hidden=32)
    keys = set()
    for name in ("CPU model A", "CPU model B", "CPU model A"):
        monkeypatch.setattr(sk, "cpu_model", lambda name=name: name)
        keys.add(autotree.curve_key(model, 1))
    assert len(keys) == 2
    assert autotree.curve_key(model, 1) != autotree.curve_key(model, 2)
    monkeypatch.undo()
    assert isinstance(sk.cpu_model(), str) and sk.cpu_model() == sk.native.cpu_model()


def test_measured_curve_never_falls_with_more_rows(monkeypatch) -> None:
    cost = {1: 1.0, 2: 3.0, 3: 1.5, 4: 2.0, 6: 2.5, 8: 2.4, 12: 4.0, 16: 5.0, 24: 8.0, 32: 9.0}
    cost |= {48: 12.0, 64: 15.0, 96: 20.0, 128: 26.0}
    now = [0.0]

    def forward(n: int) -> None:  # a pass over n rows takes cost[n] seconds of the fake clock
        now[0] += cost[n]

    monkeypatch.setattr(autotree.time, "perf_counter", lambda: now[0])
    curve = autotree.measure_target(forward, reps=1)
    assert list(curve) == list(autotree.CURVE_ROWS)
    assert [curve[n] for n in (1, 2, 6, 32)] == pytest.approx([1.0, 1.5, 2.4, 9.0])
    assert all(curve[a] <= curve[b] for a, b in zip(autotree.CURVE_ROWS, autotree.CURVE_ROWS[1:], strict=False))


def test_target_cost_beyond_the_curve_grows_with_the_rows() -> None:
    """A flat last stretch (memory-bound passes) must not make a pass far beyond the measured rows look free."""
    curve = CostCurve(target={1: 1.0, 64: 2.0, 128: 2.0})
    assert curve.target_cost(256) == pytest.approx(4.0)
    assert curve.target_cost(96) == pytest.approx(2.0)


def drafting_auto_decoder(tmp_path, monkeypatch) -> specdec.SpeculativeDecoder:
    """rsd_c with auto trees on a tiny pair, its cost curve flat so that every round drafts."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    target = tiny_llama(0, vocab=32, hidden=32)
    draft = tiny_llama(1, vocab=32, hidden=32)
    decoder = specdec.SpeculativeDecoder(target, draft, method="rsd_c", branching="auto")
    decoder.builder.curve = CostCurve(target={1: 1.0, 32: 1.0}, draft={1: 0.01})
    return decoder


def test_first_round_of_a_call_does_not_set_the_pass_cost(tmp_path, monkeypatch) -> None:
    """A call's first round runs cold: every round of a call but its first feeds the fit of the pass cost."""
    decoder = drafting_auto_decoder(tmp_path, monkeypatch)
    seen: list[int] = []
    observe = CostCurve.observe_pass
    monkeypatch.setattr(CostCurve, "observe_pass", lambda self, r, s: (seen.append(r), observe(self, r, s)))
    for _ in range(2):
        before = len(seen)
        out = decoder.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=12, do_sample=False)
        rounds = out.stats.target_calls
        assert rounds >= 3 and len(seen) - before == rounds - 1, (rounds, seen)


def test_first_round_of_a_call_does_not_set_the_draft_cost(tmp_path, monkeypatch) -> None:
    """The first round's draft step also reads the prompt into the draft: it is left out of the draft-cost means,
    every later drafting round is counted (its first step apart from the later ones)."""
    decoder = drafting_auto_decoder(tmp_path, monkeypatch)
    seen: list[int] = []
    observe = CostCurve.observe_first
    monkeypatch.setattr(CostCurve, "observe_first", lambda self, r, s: (seen.append(r), observe(self, r, s)))
    roots = []
    propose_root = decoder.drafter.propose_root
    monkeypatch.setattr(decoder.drafter, "propose_root", lambda c: (roots.append(1), propose_root(c))[1])
    for _ in range(2):
        decoder.generate(torch.tensor([[t % 32 for t in range(40)]]), max_new_tokens=12, do_sample=False)
    assert len(roots) >= 6  # rounds that drafted: all but each call's first are counted
    assert len(seen) == len(roots) - 2


def test_track_chain_acceptance_and_its_choice() -> None:
    """A hybrid draft's chain under the first-child path: counted only when that path was accepted, its gain
    weighted by reaching it, and chosen where its rows cost little."""
    model = AcceptanceModel()
    before = model.h(1)
    model.observe_track([1, 0], 2, 2, 3)  # the path went through rank 1: the chain was out of reach
    assert model.h(1) == before
    for _ in range(40):
        model.observe_track([0, 0, 0, 0, 0], 5, 2, 3)  # whole chain accepted
        model.observe_track([0, 0], 2, 2, 3)  # chain top not drafted or rejected
    assert model.h(1) == pytest.approx(
        (40 + autotree.TRACK_PRIOR * autotree.PRIOR_WEIGHT) / (80 + autotree.PRIOR_WEIGHT)
    )
    assert model.h(2) > 0.9
    first_path = model.g(1, 0) * model.g(2, 0)
    gain = model.expected_tokens((2, 1), 2) - model.expected_tokens((2, 1))
    assert gain == pytest.approx(first_path * model.h(1) * (1 + model.h(2)))
    _, track, _ = choose(FLAT, model, batch=1, max_nodes=16, max_depth=6, track=4)
    assert track > 0
    _, track, _ = choose(STEEP, model, batch=8, max_nodes=16, max_depth=6, track=4)
    assert track == 0


@pytest.mark.parametrize("width", [2, 4])
@pytest.mark.parametrize("curve", [FLAT, STEEP], ids=["flat", "steep"])
@pytest.mark.parametrize("batch", [1, 4])
def test_choice_is_the_best_of_every_shape_and_track(curve: CostCurve, batch: int, width: int) -> None:
    """choose grows the shapes with their expected tokens and costs carried along; its pick must be the best rate
    over every shape of shapes() no wider than ``width`` (2: SpecHub's binary trees) and every track length, each
    scored by expected_tokens / round_cost."""
    model = AcceptanceModel()
    gen = torch.Generator().manual_seed(batch)
    for _ in range(60):  # mixed acceptance by depth and rank, and a chain accepted about half the time
        n = int(torch.randint(0, 4, (), generator=gen))
        ranks = torch.randint(0, 3, (n,), generator=gen).tolist()
        model.observe((3, 2, 2), ranks, n, 3)
        model.observe_track([0, 0, 0], 3 + int(torch.randint(0, 3, (), generator=gen)), 3, 2)
    best, track, rate = choose(curve, model, batch=batch, max_nodes=16, max_depth=6, track=3, max_width=width)
    assert max(best, default=0) <= width
    scored = [(1 / curve.target_cost(batch), (), 0)]
    for t in range(4):
        for s in shapes(16 - t, 6, width):
            scored.append((model.expected_tokens(s, t) / round_cost(curve, s, batch, t), s, t))
    top = max(r for r, _, _ in scored)
    assert rate == pytest.approx(top)
    assert model.expected_tokens(best, track) / round_cost(curve, best, batch, track) == pytest.approx(top)


def test_shape_is_chosen_in_the_first_rounds_then_every_few_and_on_a_new_batch(tmp_path, monkeypatch) -> None:
    """A choice weighs every shape: the builder makes one in each of its first AUTO_REFRESH rounds, then every
    AUTO_REFRESH-th round and whenever the batch size changes; the rounds between draft the last choice."""
    from specdec.methods.builders import auto

    decoder = drafting_auto_decoder(tmp_path, monkeypatch)
    made: list[int] = []
    real = auto.choose
    monkeypatch.setattr(
        auto, "choose", lambda curve, model, batch, *a: (made.append(batch), real(curve, model, batch, *a))[1]
    )
    batches: list[int] = []  # the batch size of every round
    for batch in (1, 1, 2):  # identical rows: a batch's rows finish together
        prompts = torch.tensor([[t % 32 for t in range(20)]] * batch)
        out = decoder.generate(prompts, max_new_tokens=30, do_sample=False)
        batches += [batch] * out.stats.target_calls
    assert decoder.builder._rounds == len(batches) > 3 * auto.AUTO_REFRESH
    expected = [
        b for r, b in enumerate(batches) if r < auto.AUTO_REFRESH or r % auto.AUTO_REFRESH == 0 or b != batches[r - 1]
    ]
    assert made == expected and made[-1] == 2


def test_curve_measurement_sweeps_the_row_counts_in_turn(monkeypatch) -> None:
    """A machine that slows down during the measurement: timed sweep by sweep, every row count sees the slow
    period alike, so the curve keeps its shape (measured one row count after the other, the last counts would
    look several times dearer)."""
    calls: list[int] = []
    now = [0.0]

    def forward(n: int) -> None:  # each pass costs n seconds times the slowdown so far (1x, then up to 3x)
        calls.append(n)
        now[0] += n * (1.0 + 2.0 * min(len(calls) / 40, 1.0))

    monkeypatch.setattr(autotree.time, "perf_counter", lambda: now[0])
    rows = (1, 2, 4, 8)
    curve = autotree.measure_target(forward, rows=rows, reps=5)
    assert calls[:4] == list(rows)  # warm-ups, then five sweeps over every count
    assert calls[4:] == list(rows) * 5
    ratios = [curve[n] / (n * curve[1]) for n in rows]
    assert max(ratios) / min(ratios) < 1.3, curve
