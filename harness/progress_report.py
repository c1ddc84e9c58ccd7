"""What ``labs progress`` shows: the local progress store (``harness.progress``) summed up
per lab and part, as a table or a self-contained HTML report with plots.

``summarize`` reads the store: for each lab and part, the visible tests passed at
the last run, the last and best local grade, the best perf ratio per metric (lower is
better), the attempts and their history; ``table_rows`` lays it out for the terminal
and ``render_html`` as a page that fetches nothing.
"""
from __future__ import annotations

import html
import io
import re
from datetime import datetime
from pathlib import Path

from .progress import checkout, db_path, load_runs


# --- the summary ---------------------------------------------------------------

def _best_perf(rows: list[dict]) -> dict:
    best: dict[str, float] = {}
    for p in rows:
        best[p["metric"]] = min(best.get(p["metric"], float("inf")), p["ratio"])
    return best


def _status(runs: list[dict], part: str | None, max_points: float) -> dict:
    """Status of one lab (part None) or one part across ``runs`` (oldest first)."""
    def tests(r):
        return [t for t in r["tests"] if part is None or t["part"] == part]

    mine = [r for r in runs if tests(r)]
    visible = [r for r in mine if r["kind"] == "visible"]
    grades = [r for r in mine if r["kind"] == "grade"]
    out = {"visible": None, "last_grade": None, "best_grade": None, "best_perf": {},
           "attempts": {"visible": len(visible), "grade": len(grades)},
           "first": mine[0]["started"] if mine else None, "last": mine[-1]["started"] if mine else None}
    if visible:
        ts = tests(visible[-1])
        out["visible"] = {"passed": sum(t["outcome"] == "passed" for t in ts), "total": len(ts),
                          "at": visible[-1]["started"]}
        not_run = sum(t["outcome"] == "not_run" for t in ts)  # this hardware could not run them: not failures
        if not_run:
            out["visible"]["not_run"] = not_run

    def grade_score(r):
        if part is None:
            return {"score": r["score"], "max_score": r["max_score"], "at": r["started"]}
        return {"score": round(sum(t["score"] or 0 for t in tests(r)), 4), "max_score": max_points,
                "at": r["started"]}

    if grades:
        scored = [grade_score(r) for r in grades]
        out["last_grade"] = scored[-1]
        out["best_grade"] = max(scored, key=lambda s: s["score"])
    out["best_perf"] = _best_perf([p for r in mine for p in r["perf"] if part is None or p["part"] == part])
    # the tests this hardware could not run, with why, at the last visible run and the last grade
    out["not_run"] = [{"run": r["kind"], "test": t["name"], "part": t["part"],
                       "reason": t.get("reason") or "not verified here"}
                      for r in (visible[-1:] + grades[-1:]) for t in tests(r) if t["outcome"] == "not_run"]
    return out


def summarize(course, path: Path | None = None, lab: str | None = None) -> dict:
    """Per lab and part: visible tests passed/total at the last run, last and best
    local grade, best perf ratio per metric (lower is better), attempts, first and
    last attempt (unix seconds). Also each lab's ``history`` for the plots."""
    path = Path(path) if path is not None else db_path()
    runs = load_runs(checkout(course), lab, path)
    labs = []
    for num, spec in sorted(course.labs.items()):
        if lab is not None and num != lab:
            continue
        lab_runs = [r for r in runs if r["lab"] == num]
        entry = {"lab": num, "title": spec.title, "points": spec.points, **_status(lab_runs, None, spec.points),
                 "parts": [{"part": p, "title": ps.title, "points": ps.points, **_status(lab_runs, p, ps.points)}
                           for p, ps in spec.parts.items()],
                 "history": [{"kind": r["kind"], "at": r["started"], "passed": r["passed"], "total": r["total"],
                              # the tests that ran (not -k-deselected, skipped or never reached): what it measured
                              "ran": sum(t["outcome"] in ("passed", "failed", "error") for t in r["tests"]),
                              "score": r["score"], "max_score": r["max_score"],
                              "perf": _best_perf(r["perf"])} for r in lab_runs]}
        labs.append(entry)
    return {"course": course.name, "checkout": checkout(course), "db": str(path), "labs": labs}


def _cells(s: dict, short: bool = False) -> list[str]:
    v = s["visible"]
    vis = f"{v['passed']}/{v['total']}" if v else "-"
    if v and v.get("not_run"):
        vis += f" ({v['not_run']} not_run)"

    def g(x):
        return f"{x['score']:.4g}/{x['max_score']:.4g}" if x else "-"

    perf = ", ".join(f"{k} {r:.3g}x" for k, r in sorted(s["best_perf"].items())) or "-"
    a = s["attempts"]
    fmt = "%m-%d %H:%M" if short else "%Y-%m-%d %H:%M"
    when = [datetime.fromtimestamp(t).strftime(fmt) if t else "-" for t in (s["first"], s["last"])]
    return [vis, g(s["last_grade"]), g(s["best_grade"]), perf, str(a["visible"]), str(a["grade"]), *when]


COLUMNS = ["Lab", "Part", "Visible (last run)", "Last grade", "Best grade", "Best perf ratio",
           "Runs", "Grades", "First", "Last"]
SHORT_COLUMNS = ["Lab", "Part", "Visible", "Last grade", "Best grade", "Best perf", "Runs", "Grades", "First", "Last"]


def not_run_lines(summary: dict) -> list[str]:
    """One line per test this hardware could not run (at each lab's last visible run and
    last grade), with its reason: not verified here, neither passed nor failed."""
    where = {"visible": "last visible run", "grade": "last grade"}
    return [f"lab {lab['lab']} part {n['part'] or '-'} {n['test']} ({where[n['run']]}): {n['reason']}"
            for lab in summary["labs"] for n in lab["not_run"]]


def table_rows(summary: dict, short: bool = False) -> list[tuple[bool, list[str]]]:
    """(is_lab_row, cells) for the table shown by the CLI and the HTML page: one
    row per lab (all its tests) followed by one row per part."""
    rows = []
    for lab in summary["labs"]:
        rows.append((True, [lab["lab"], "all" if short else f"all: {lab['title']}", *_cells(lab, short)]))
        for p in lab["parts"]:
            label = p["part"] if short else f"{p['part']}: {p['title']} ({p['points']:g} pts)"
            rows.append((False, ["", label, *_cells(p, short)]))
    return rows


# --- the HTML report -------------------------------------------------------------

def score_series(hist: list[dict]) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(attempt, % of points) of the visible runs and of the grades in ``hist``. A visible
    run's % is of the tests it ran (a ``-k`` run measured only those; skipped and
    never-reached tests measured nothing): a run that ran none is left out, not a 0."""
    x = range(1, len(hist) + 1)
    vis = [(i, 100 * h["passed"] / h["ran"]) for i, h in zip(x, hist) if h["kind"] == "visible" and h.get("ran")]
    grd = [(i, 100 * h["score"] / h["max_score"]) for i, h in zip(x, hist)
           if h["kind"] == "grade" and h["max_score"]]
    return vis, grd


def _plot_svg(lab: dict, perf_specs: dict) -> str:
    """Score (% of points) and perf ratio over attempts for one lab, as inline SVG."""
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    hist = lab["history"]
    x = list(range(1, len(hist) + 1))
    metrics = sorted({m for h in hist for m in h["perf"]})
    # the perf panel only where some run timed something: an empty chart says nothing
    fig, axes = plt.subplots(1, 2 if metrics else 1, figsize=(10 if metrics else 5.5, 3.2), sharex=True,
                             squeeze=False)
    ax1 = axes[0][0]
    vis, grd = score_series(hist)
    if vis:
        ax1.plot(*zip(*vis), "o-", color="#4c78a8", label="visible tests passed (of those run)")
    if grd:
        ax1.plot(*zip(*grd), "s-", color="#e45756", label="hidden-grade score")
    ax1.set(title=f"Lab {lab['lab']}: score over attempts", xlabel="attempt", ylabel="% of points", ylim=(-5, 105))
    ax1.grid(alpha=0.3)
    if vis or grd:
        ax1.legend(loc="lower right", fontsize=8)
    if metrics:
        ax2 = axes[0][1]
        for m in metrics:
            pts = [(i, h["perf"][m]) for i, h in zip(x, hist) if m in h["perf"]]
            ax2.plot(*zip(*pts), "o-", label=m)
            spec = perf_specs.get(m)
            if spec is not None:
                ax2.axhline(spec.full_credit, color="green", ls="--", lw=1, label=f"full credit ≤ {spec.full_credit:g}")
                ax2.axhline(spec.zero_credit, color="red", ls=":", lw=1, label=f"no credit ≥ {spec.zero_credit:g}")
        ax2.set(title="perf ratio over attempts (lower is better)", xlabel="attempt", ylabel="your time / baseline")
        ax2.grid(alpha=0.3)
        ax2.legend(loc="upper right", fontsize=8)
    for ax in axes[0]:
        ax.xaxis.get_major_locator().set_params(integer=True)
    fig.tight_layout()
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "path"}):  # text as paths: no font needed by the viewer
        fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]  # drop the XML prolog and DOCTYPE (its DTD is a remote URL)
    return re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.S)


_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 2em; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; }
th { background: #f0f0f0; } tr.lab td { background: #fafafa; font-weight: bold; border-top: 2px solid #888; }
.note { color: #666; font-size: 0.85em; } svg { max-width: 100%; height: auto; }
"""


def render_html(summary: dict, course) -> str:
    """A self-contained page: the progress table and, per attempted lab, the plots
    (inline SVG). No scripts, no external stylesheets, fonts or images."""
    esc = html.escape
    head = "".join(f"<th>{esc(c)}</th>" for c in COLUMNS)
    body = "\n".join(f"<tr class='{'lab' if is_lab else 'part'}'>" + "".join(f"<td>{esc(c)}</td>" for c in cells)
                     + "</tr>" for is_lab, cells in table_rows(summary))
    plots = []
    for lab in summary["labs"]:
        if lab["history"]:
            plots.append(f"<h2>Lab {esc(lab['lab'])} — {esc(lab['title'])}</h2>\n"
                         f"<figure>{_plot_svg(lab, course.labs[lab['lab']].perf)}</figure>")
    if not plots:
        plots.append("<p class='note'>No attempts recorded yet: run <code>pytest labs/NN</code> or "
                     "<code>labs grade . --lab NN</code>.</p>")
    missing = not_run_lines(summary)
    if missing:
        plots.insert(0, "<h2>Not run on this hardware (neither passed nor failed)</h2>\n<ul>"
                     + "".join(f"<li>{esc(line)}</li>" for line in missing) + "</ul>")
    generated = datetime.now().strftime("%Y-%m-%d %H:%M")
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>Progress — {esc(summary['course'])}</title><style>{_CSS}</style></head><body>\n"
            f"<h1>Progress — {esc(summary['course'])}</h1>\n"
            f"<p class='note'>Generated {generated} from {esc(summary['db'])}. Recorded locally; nothing is sent "
            f"anywhere. Perf ratios are your time / the baseline's (lower is better).</p>\n"
            f"<table><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table>\n"
            + "\n".join(plots) + "\n</body></html>\n")
