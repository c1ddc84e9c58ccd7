"""The course server's pages: server-rendered HTML (Jinja2, autoescaped), one inline
stylesheet, plots as inline SVG (matplotlib): no external assets, nothing fetched."""
from __future__ import annotations

import io

from jinja2 import Environment, PackageLoader, select_autoescape

from ..manifest import Course, Lab
from .service import utc

ENV = Environment(loader=PackageLoader("harness.server", "templates"), autoescape=select_autoescape(["html"]))
ENV.filters["utc"] = utc
ENV.filters["num"] = lambda v, nd=4: "" if v is None else f"{v:.{nd}g}"


def _page(name: str, course: Course, **kw) -> str:
    return ENV.get_template(name).render(course=course, **kw)


def message(course: Course, text: str) -> str:
    return _page("message.html", course, text=text)


def login(course: Course) -> str:
    return _page("login.html", course)


def student(course: Course, who, submissions: list[dict]) -> str:
    return _page("student.html", course, who=who, submissions=submissions)


def submission(course: Course, view: dict) -> str:
    return _page("submission.html", course, sub=view)


def staff(course: Course, labs: list[dict], runners: list[dict]) -> str:
    return _page("staff.html", course, labs=labs, runners=runners)


def leaderboard(course: Course, lab: Lab, rows: list[dict], *, staff: bool) -> str:
    return _page("leaderboard.html", course, lab=lab, rows=rows, staff=staff, plot=_plot(rows))


def _plot(rows: list[dict]) -> str:
    """The ranked runs' perf ratios as an inline SVG bar chart (one colour per GPU model)."""
    ranked = [r for r in rows if r["rank"] is not None]
    if not ranked:
        return ""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.35 * len(ranked) + 1.2))
    models = sorted({r["gpu_model"] for r in ranked})
    colours = {m: f"C{i}" for i, m in enumerate(models)}
    ax.barh([f"{r['name']} ({r['gpu_model']})" for r in ranked], [r["perf_ratio"] for r in ranked],
            color=[colours[r["gpu_model"]] for r in ranked])
    ax.invert_yaxis()
    ax.set_xlabel("median perf ratio, yours / baseline (lower is faster)")
    fig.tight_layout()
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]
