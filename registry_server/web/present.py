"""What an environment page shows of a version, read from its bundle and its health reports:
the README (Markdown rendered without raw HTML, scripts or remote resources), the tasks
(id, difficulty, instruction: never params or oracles), the public files with sizes, what the
verifier is, and the health chart (an inline SVG, no script)."""

from __future__ import annotations

import html
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from markdown_it import MarkdownIt

from envkit.bundle import read_bundle
from registry_server.storage import BlobStore

__all__ = ["BundleView", "bundle_view", "health_chart", "render_markdown", "verifier_kind"]

README_LIMIT = 256 * 1024
PREVIEW_LIMIT = 64 * 1024 * 1024  # bundles past this are not opened for a page
_README_NAMES = ("README.md", "readme.md", "Readme.md", "README.markdown", "README")


@dataclass
class BundleView:
    readme_html: str = ""
    readme_notice: str = ""  # why no README is shown, when one exists but cannot be
    tasks: list[dict[str, str]] = field(default_factory=list)
    files: list[tuple[str, int]] = field(default_factory=list)  # public files: path, size
    hidden_files: int = 0  # verifier and oracle material, and the task file (it holds params and oracles)
    notice: str = ""  # why the bundle could not be opened at all


def _md() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False}).enable("table")

    # never a request for a remote resource
    def image(renderer: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
        token = tokens[idx]
        alt = html.escape(token.content or "image")
        return f'<span class="img-alt" title="images are not loaded on this page">[{alt}]</span>'

    def link_open(renderer: Any, tokens: Any, idx: int, options: Any, env: Any) -> str:
        tokens[idx].attrSet("rel", "nofollow noopener noreferrer")
        return str(renderer.renderToken(tokens, idx, options, env))

    md.add_render_rule("image", image)
    md.add_render_rule("link_open", link_open)
    return md


_MD = _md()


def render_markdown(raw: bytes) -> tuple[str, str]:
    """(html, notice): the README as safe HTML, or a notice saying why it is not shown."""
    if len(raw) > README_LIMIT:
        return "", f"The README is {len(raw) / 1024:.0f} KiB, more than this page shows ({README_LIMIT // 1024} KiB)."
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return "", f"The README is not UTF-8 text (byte {e.start}), so it is not shown."
    tokens = _MD.parse(text)
    for t in tokens:  # the page has its own h1 and h2: the README's headings start at h3
        if t.type in ("heading_open", "heading_close"):
            t.tag = f"h{min(6, int(t.tag[1]) + 2)}"
    return str(_MD.renderer.render(tokens, _MD.options, {})), ""


def verifier_kind(spec: dict[str, Any]) -> tuple[str, str]:
    """(kind, what it guarantees), from the version's spec (docs/spec.md's table)."""
    command = str((spec.get("verifier") or {}).get("command") or "")
    if (spec.get("environment") or {}).get("kind") == "container":
        return "Harbor tests", "run in the agent's own container; the agent's processes can reach the reward file"
    if "pytest_verifier.py" in command:
        return ("pytest + envkit_check",
                "the agent's code runs only in worker processes; values are checked in the verifier")
    if "state_verifier.py" in command:
        return "state (database rows)", "reads the service's database and the answer; the agent cannot reach it"
    return "custom command", "the environment's own verifier command"


def _view(data: bytes, spec: dict[str, Any]) -> BundleView:
    bundle = read_bundle(data)
    files = {e.path: e for e in bundle.entries if e.kind == "file"}
    view = BundleView()
    readme = next((files[n] for n in _README_NAMES if n in files), None)
    if readme is not None:
        view.readme_html, view.readme_notice = render_markdown(readme.data)
    task_file = str((spec.get("tasks") or {}).get("file") or "tasks.jsonl")
    oracles: set[str] = set()
    if task_file in files:
        for line in files[task_file].data.decode("utf-8", "replace").splitlines():
            try:
                t = json.loads(line)
            except ValueError:
                continue
            if isinstance(t, dict) and "id" in t:
                view.tasks.append({"id": str(t["id"]), "difficulty": str(t.get("difficulty") or ""),
                                   "instruction": str(t.get("instruction") or "")})
                if t.get("oracle"):
                    oracles.add(str(t["oracle"]))
    private = tuple(f"{d.rstrip('/')}/" for d in ((spec.get("image") or {}).get("files") or []))
    for path, entry in sorted(files.items()):
        if path == task_file or path in oracles or path.startswith(("oracle/", *private)):
            view.hidden_files += 1
        else:
            view.files.append((path, len(entry.data)))
    return view


_CACHE: OrderedDict[str, BundleView] = OrderedDict()
_CACHE_LOCK = threading.Lock()


def bundle_view(store: BlobStore, digest: str, size: int, spec: dict[str, Any]) -> BundleView:
    """A version's page content from its bundle (cached by digest: versions are immutable)."""
    with _CACHE_LOCK:
        if digest in _CACHE:
            _CACHE.move_to_end(digest)
            return _CACHE[digest]
    if size > PREVIEW_LIMIT:
        return BundleView(notice=f"The bundle is {size / 2**20:.0f} MiB; this page opens bundles up to "
                                 f"{PREVIEW_LIMIT // 2**20} MiB. Pull it to look inside.")
    try:
        view = _view(b"".join(store.open(digest)), spec)
    except Exception as e:  # noqa: BLE001 - the page still shows the rest, and says what went wrong
        return BundleView(notice=f"The bundle could not be opened ({type(e).__name__}).")
    with _CACHE_LOCK:
        _CACHE[digest] = view
        while len(_CACHE) > 64:
            _CACHE.popitem(last=False)
    return view


_SERIES = (("infra_failure_rate", "first-attempt infra failures", "#dc2626"),
           ("verifier_failure_rate", "verifier failures", "#d97706"),
           ("oracle_pass_rate", "oracle pass rate", "#16a34a"))


def health_chart(points: list[dict[str, Any]], width: int = 720, height: int = 220) -> str:
    """The reports of one version over time as an inline SVG: one line per rate (0-100%),
    a mark per report (filled: the namespace's own token; hollow: someone else's) and the hack
    probes' result where a report carries one (a red cross: some probe beat a task)."""
    if not points:
        return ""
    left, right, top, bottom = 44, 16, 12, 46
    w, h = width - left - right, height - top - bottom
    n = len(points)

    def x(i: int) -> float:
        return left + (w * i / (n - 1) if n > 1 else w / 2)

    def y(v: float) -> float:
        return top + h * (1 - max(0.0, min(1.0, v)))

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="health-chart" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="health over time">']
    for v in (0, 0.25, 0.5, 0.75, 1):
        parts.append(f'<line x1="{left}" x2="{left + w}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#e5e7eb"/>'
                     f'<text x="{left - 6}" y="{y(v) + 4:.1f}" font-size="10" text-anchor="end" '
                     f'fill="#6b7384">{v:.0%}</text>')
    for key, label, colour in _SERIES:
        pts = [(x(i), y(p[key])) for i, p in enumerate(points) if p.get(key) is not None]
        if len(pts) > 1:
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" '
                         f'points="{" ".join(f"{a:.1f},{b:.1f}" for a, b in pts)}"/>')
        for i, p in enumerate(points):
            if p.get(key) is None:
                continue
            who = f"{p['reporter']} ({'the namespace' if p['own'] else 'another user'})"
            tip = html.escape(f"{label}: {p[key]:.1%} · {p['episodes']} episodes · {p['at']:%Y-%m-%d %H:%M} UTC · {who}"
                              + (f" · run {p['run']}" if p["run"] else ""))
            fill = colour if p["own"] else "#fff"
            parts.append(f'<circle cx="{x(i):.1f}" cy="{y(p[key]):.1f}" r="3.5" fill="{fill}" stroke="{colour}" '
                         f'stroke-width="1.5"><title>{tip}</title></circle>')
    for i, p in enumerate(points):
        if p.get("probes_beaten") is None:
            continue
        beaten = p["probes_beaten"]
        mark = (f'<text x="{x(i):.1f}" y="{top + h + 16}" font-size="12" text-anchor="middle" '
                'fill="#9b1c1c">✗</text>' if beaten
                else f'<text x="{x(i):.1f}" y="{top + h + 16}" font-size="12" text-anchor="middle" '
                     'fill="#15803d">✓</text>')
        parts.append(f'<g><title>hack probes: {beaten} beat a task' if beaten
                     else '<g><title>hack probes: none beat a task')
        parts.append(f"</title>{mark}</g>")
    ly = height - 10
    lx = left
    for _key, label, colour in _SERIES:
        parts.append(f'<rect x="{lx}" y="{ly - 8}" width="10" height="3" fill="{colour}"/>'
                     f'<text x="{lx + 14}" y="{ly - 4}" font-size="11" fill="#374151">{html.escape(label)}</text>')
        lx += 14 + 7 * len(label) + 16
    parts.append(f'<text x="{lx}" y="{ly - 4}" font-size="11" fill="#374151">● own token ○ others · ✓/✗ probes</text>')
    parts.append("</svg>")
    return "".join(parts)
