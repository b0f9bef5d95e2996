"""The end-to-end blocks: the benchmark (end_to_end.csv) and the demo's recorded runs (demo.csv), with the bar plot."""

from __future__ import annotations

from pathlib import Path

from .common import _variant_cell, implausible, newest_run, num, provenance, read_csv, table


def block_end_to_end(results: Path) -> str:
    rows = read_csv(results, "end_to_end")
    bad = [r for r in rows if implausible(r, "ratio_vs_ar", "block_eff")]
    drafts = list(dict.fromkeys(r["draft"] for r in rows))  # the newest run of each draft, in recording order
    out = []
    for draft in drafts:
        run = [r for r in newest_run([r for r in rows if r["draft"] == draft], ("time",)) if r not in bad]
        if not run:
            continue
        lines = [
            [
                r["method"],
                r["batch"],
                num(r["tok_s"]),
                f"{num(r['ratio_vs_ar'])}x",
                num(r["block_eff"]),
            ]
            for r in run
        ]
        r0 = run[0]
        extra = (
            f"draft {r0['draft']}, T = {r0['temperature']}, {r0['prompts']} prompts x {r0['tokens']} tokens, "
            f"{r0['threads']} thread(s)"
        )
        head = ["method", "batch", "tok/s", "vs AR", "block eff."]
        prov = provenance(run, machine="machine", torch="torch", extra=extra)
        out.append(f"Draft `{draft}`:\n\n" + table(head, lines) + "\n\n" + prov + "\n")
    if not out:
        return "No run recorded in `benchmarks/results/end_to_end.csv`.\n"
    return "\n".join(out)


#: the demo's default draft as the demo loads it (int8 weights), whose end-to-end run the README shows
HEADLINE_DRAFT = "smollm2-eagle+ngram (int8)"


def block_end_to_end_headline(results: Path) -> str:
    """Batch-1 speed of the newest run with the demo's default draft, against our AR."""
    rows = [r for r in read_csv(results, "end_to_end") if r["draft"] == HEADLINE_DRAFT]
    run = [
        r
        for r in newest_run(rows, ("time",))
        if r["batch"] == "1" and not r["method"].startswith("sweep:") and not implausible(r, "ratio_vs_ar", "block_eff")
    ]
    if not run:
        return f"No run with the draft `{HEADLINE_DRAFT}` recorded in `benchmarks/results/end_to_end.csv`.\n"
    lines = []
    for r in run:
        name = r["method"].replace("specdec:", "").replace("hf:", "transformers ")
        lines.append([name, num(r["tok_s"]), f"{num(r['ratio_vs_ar'])}x", num(r["block_eff"])])
    r0 = run[0]
    t = float(r0["temperature"])
    mode = "greedy" if t == 0 else f"T = {r0['temperature']}"
    extra = f"{mode}, {r0['prompts']} HumanEval prompts x {r0['tokens']} tokens, {r0['threads']} thread(s)"
    prov = provenance(run, machine="machine", torch="torch", extra=extra)
    return table(["method", "tok/s", "vs our AR", "block eff."], lines) + "\n\n" + prov + "\n"


def block_demo_runs(results: Path) -> str:
    """One line per recorded demo run (the newest of each prompt set, temperature, thread count, CPU variant, draft
    and machine): our AR, the fastest method against it and against transformers' generate, the slowest method, and
    the machine's load average before the run where it was recorded. Where runs of several machines are shown, the
    variant's cell names the machine."""
    rows = read_csv(results, "demo")
    newest: dict[tuple[str, str, str, str, str, str], str] = {}
    for r in rows:
        key = (r["prompt_set"], r["temperature"], r["threads"], r["draft"], r.get("cpu_isa") or "-", r["machine"])
        newest[key] = max(newest.get(key, ""), r["timestamp"])
    several = len({key[5] for key in newest}) > 1
    lines, runs = [], []
    for key, stamp in sorted(newest.items()):
        run = [r for r in rows if r["timestamp"] == stamp]
        ar = next((r for r in run if r["label"] == "ar"), None)
        hf = next((r for r in run if r["label"] == "hf generate"), None)
        ours = [r for r in run if r["label"] != "ar" and not r["label"].startswith("hf ")]
        ours = [r for r in ours if not implausible(r, "speed_ratio", "block_efficiency")]
        if ar is None or not ours:
            continue
        best = max(ours, key=lambda r: float(r["speed_ratio"]))
        worst = min(ours, key=lambda r: float(r["speed_ratio"]))
        vs_hf = f"{float(best['tokens_per_second']) / float(hf['tokens_per_second']):.2f}x" if hf else "-"
        mode = "greedy" if float(key[1]) == 0 else f"T = {key[1]}"
        lines.append(
            [
                key[0].removesuffix(".jsonl"),
                mode,
                key[2],
                _variant_cell(key[4], key[5], several),
                f"`{key[3]}`",
                num(ar["tokens_per_second"]),
                f"{best['label']} {float(best['speed_ratio']):.2f}x",
                vs_hf,
                f"{worst['label']} {float(worst['speed_ratio']):.2f}x",
                ar.get("load_before") or "-",
            ]
        )
        runs += run
    if not lines:
        return "No demo run recorded in `benchmarks/results/demo.csv`.\n"
    head = ["prompts", "sampling", "threads", "CPU variant", "draft", "our AR, tok/s", "fastest (vs AR)"]
    head += ["fastest vs generate", "slowest", "load before (1 min)"]
    r0 = runs[0]
    extra = f"{r0['num_prompts']} prompts x {r0['max_new_tokens']} tokens, batch {r0['batch_size']}, {r0['dtype']}"
    extra += ", wall clock"
    return table(head, lines) + "\n\n" + provenance(runs, machine="machine", torch="torch", extra=extra) + "\n"


def plot_end_to_end(results: Path) -> str | None:
    """Bar plot of the newest end-to-end run (batch 1): tokens/s of each method relative to AR."""
    run = [r for r in newest_run(read_csv(results, "end_to_end"), ("time",)) if r["batch"] == "1"]
    run = [r for r in run if not r["method"].startswith("sweep") and not implausible(r, "ratio_vs_ar", "block_eff")]
    if not run:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ratios = [float(r["ratio_vs_ar"]) for r in run]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.bar([r["method"] for r in run], ratios, color=["tab:green" if x >= 1 else "tab:red" for x in ratios])
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_ylabel("tokens/s vs specdec AR")
    r0 = run[0]
    ax.set_title(
        f"SmolLM2-135M, draft {r0['draft']}, T={r0['temperature']}: {r0['machine']}, torch {r0['torch']}",
        fontsize=9,
    )
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    fig.tight_layout()
    path = results / "end_to_end.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)
