"""The course server's pages: server-rendered HTML (Jinja2, autoescaped), one inline
stylesheet, plots as inline SVG (matplotlib): no external assets, nothing fetched."""
from __future__ import annotations

import io
import threading

from jinja2 import Environment, PackageLoader, select_autoescape

from ..manifest import Course, Lab
from .service import utc
from .similarity import views as similarity_views

ENV = Environment(loader=PackageLoader("harness.server", "templates"), autoescape=select_autoescape(["html"]))
ENV.filters["utc"] = utc
ENV.filters["num"] = lambda v, nd=4: "" if v is None else f"{v:.{nd}g}"
PLOT_LIMIT = 25  # bars per GPU model in the leaderboard's plot (the table lists every run)
_PLOT_LOCK = threading.Lock()  # matplotlib's rcParams are global; pages render in a thread pool


def duration(seconds: float | None) -> str:
    """An estimate in words: ``40 s``, ``12 min``, ``2.5 h``."""
    if seconds is None:
        return ""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


ENV.filters["duration"] = duration


def _page(name: str, course: Course, *, staff_link: bool = True, **kw) -> str:
    """``staff_link``: whether the navigation offers the staff overview (not to students)."""
    return ENV.get_template(name).render(course=course, staff_link=staff_link, **kw)


def message(course: Course, text: str) -> str:
    return _page("message.html", course, text=text)


def login(course: Course, error: str = "") -> str:
    return _page("login.html", course, staff_link=False, error=error)


def student(course: Course, who, submissions: list[dict], late: dict | None = None, trials: list | None = None) -> str:
    """``late``: the student's late-day standing (``latedays.Standing.as_dict``), None
    without a budget; ``trials``: their trial runs (``trials.view``), newest first."""
    return _page("student.html", course, who=who, submissions=submissions, late=late, trials=trials or [],
                 staff_link=who.role == "staff")


def submission(course: Course, view: dict, *, staff: bool = True, own: bool = True) -> str:
    """``staff``: whether the viewer is staff (the navigation's staff link); ``own``:
    whether it is the viewer's own submission (the regrade request form)."""
    return _page("submission.html", course, sub=view, lab=course.lab(view["lab"]), staff_link=staff, own=own)


def staff_regrades(course: Course, requests: list[dict]) -> str:
    """The regrade requests (``regrades.queue``), open ones with an answer form."""
    return _page("staff_regrades.html", course, requests=sorted(requests, key=lambda r: (r["state"] != "open",
                                                                                         r["created_at"])))


def lti_launch(course: Course, who, lab: Lab | None, platform: str, graded_back: bool) -> str:
    """The page an LTI launch lands on: who signed in from which platform, the lab the
    link names, where its grade goes."""
    return _page("lti_launch.html", course, who=who, lab=lab, platform=platform, graded_back=graded_back,
                 staff_link=who.role == "staff")


def lti_deep_link(course: Course, return_url: str, choices: list[dict]) -> str:
    """Staff pick the lab a new course link opens: one form per lab, each posting its
    signed deep-linking response (``choices``: lab, title, points, jwt) to the platform."""
    return _page("lti_deep_link.html", course, return_url=return_url, choices=choices, staff_link=True)


def lti_refused(course: Course, reason: str) -> str:
    """A launch that failed its checks: why, and what to do."""
    return _page("lti_refused.html", course, reason=reason, staff_link=False)


def staff(course: Course, labs: list[dict], runners: list[dict]) -> str:
    return _page("staff.html", course, labs=labs, runners=runners)


def staff_lab(course: Course, lab: Lab, submissions: list[dict]) -> str:
    return _page("staff_lab.html", course, lab=lab, submissions=submissions)


def similarity(course: Course, report, *, standalone: bool = False) -> str:
    """A ``similarity.Report`` as a staff page, or (``standalone``) as the self-contained
    report file ``labs similarity`` writes."""
    kw = dict(lab=report.lab, pairs=similarity_views(report), count=len(report.sources), skipped=report.skipped,
              threshold=report.threshold, flagged=len(report.flagged))
    if standalone:
        return ENV.get_template("similarity_report.html").render(course=course, **kw)
    return _page("similarity.html", course, **kw)


def leaderboard(course: Course, lab: Lab, rows: list[dict], *, staff: bool) -> str:
    per_model: dict[str, int] = {}
    for r in rows:
        if r["rank"] is not None:
            per_model[r["gpu_model"]] = per_model.get(r["gpu_model"], 0) + 1
    return _page("leaderboard.html", course, lab=lab, rows=rows, staff=staff, plot=_plot(rows),
                 plot_cut=max(per_model.values(), default=0) > PLOT_LIMIT, plot_limit=PLOT_LIMIT, staff_link=staff)


def _plot(rows: list[dict]) -> str:
    """The ranked runs' median perf ratios as an inline SVG bar chart: one colour per GPU
    model, the fastest ``PLOT_LIMIT`` of each, a line at the baseline (1.0), text as
    text (a student finds their pseudonym with the browser's search)."""
    ranked = [r for r in rows if r["rank"] is not None]
    if not ranked:
        return ""
    from matplotlib import rc_context
    from matplotlib.figure import Figure  # no pyplot: no global figure state shared by request threads
    from matplotlib.patches import Patch

    models = list(dict.fromkeys(r["gpu_model"] for r in ranked))  # the table's order
    shown = [r for m in models for r in [x for x in ranked if x["gpu_model"] == m][:PLOT_LIMIT]]
    fig = Figure(figsize=(9.5, 0.3 * len(shown) + 1.5), layout="constrained")
    ax = fig.subplots()
    colours = {m: f"C{i % 10}" for i, m in enumerate(models)}
    y = list(range(len(shown)))
    bars = ax.barh(y, [r["perf_ratio"] for r in shown], color=[colours[r["gpu_model"]] for r in shown],
                   height=0.7)
    ax.bar_label(bars, labels=[f"{r['perf_ratio']:.3g}" for r in shown], padding=3, fontsize=9)
    ax.set_yticks(y, [r["name"] for r in shown], fontsize=9)
    ax.invert_yaxis()
    ax.axvline(1.0, color="#555", linestyle="--", linewidth=1)
    ax.set_xlim(0, max(r["perf_ratio"] for r in shown) * 1.15)
    ax.set_xlabel("median perf ratio, yours / baseline (lower is faster; dashed: the baseline)")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.legend(handles=[Patch(color=colours[m], label=m) for m in models], loc="outside upper right",
               ncols=min(len(models), 4), fontsize=9, frameon=False)
    buf = io.StringIO()
    with _PLOT_LOCK, rc_context({"svg.fonttype": "none", "svg.hashsalt": "labs"}):
        # no metadata: its RDF namespaces and the creator's url are links a page need not carry
        fig.savefig(buf, format="svg", metadata={"Date": None, "Format": None, "Type": None, "Creator": None})
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]  # without the XML prolog and DOCTYPE (its DTD is a remote url)
