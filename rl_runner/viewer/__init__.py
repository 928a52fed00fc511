"""`envkit view RUN_DIR | FILE.jsonl`: a local page to browse trajectories.

The files are indexed once at start, one small :class:`Entry` per line (where the line starts
and ends, and the fields the list filters on); a trajectory is read from its file only when
its page is opened, so a run of 10,000 trajectories costs the index, not the tokens. A line
that is not a trajectory (cut off, or another program's) is an entry marked unreadable, shown
as such, and the rest goes on.

Token text needs the run's tokenizer: ``--tokenizer``, else the run's ``recipe.json`` model,
else its newest published weights; without one, the page shows token ids. Tool calls are
parsed as the run's chat format parses them (:mod:`rl_runner.rollout.chat`).
"""

from __future__ import annotations

import html
import json
import math
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Query, Request  # the `server` extra (envkit view requires it)
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from envkit.errors import UserError

__all__ = ["Entry", "TrajectoryIndex", "find_tokenizer", "make_app", "segments"]

_TEMPLATES = Path(__file__).parent / "templates"


@dataclass(frozen=True)
class Entry:
    """One line of one trajectory file: where it is, and what the list shows and filters on."""

    n: int  # its number in the index (the page's address)
    file: int
    line: int  # 1-based, in its file
    offset: int
    length: int
    error: str = ""  # set when the line is not a trajectory
    env: str = ""
    task: str = ""
    outcome: str = ""
    reward: float | None = None
    attempts: int = 0
    turns: int = 0
    seconds: float | None = None
    excluded: bool = False
    generated: int = 0


@dataclass
class TrajectoryIndex:
    files: list[Path]
    entries: list[Entry] = field(default_factory=list)
    choices: dict[str, list[str]] = field(default_factory=dict)  # the filters' values (set by scan)
    unreadable: int = 0  # lines that are not trajectories (set by scan)

    @classmethod
    def scan(cls, target: Path) -> TrajectoryIndex:
        """Index ``target``: a run folder (its ``trajectories/*.jsonl``, else any ``*.jsonl`` in
        it) or one JSONL file. Raises :class:`UserError` when there is nothing to show."""
        if target.is_file():
            files = [target]
        elif target.is_dir():
            files = sorted((target / "trajectories").glob("*.jsonl")) or sorted(target.glob("*.jsonl"))
        else:
            raise UserError(f"`{target}` does not exist", "give a run folder (envkit train's run_dir) or a .jsonl file")
        if not files:
            raise UserError(f"`{target}` holds no trajectories (no trajectories/*.jsonl, no *.jsonl)",
                            "give a run folder written by `envkit train` or `envkit rollout`, or a .jsonl file")
        index = cls(files)
        for i, path in enumerate(files):
            index._scan_file(i, path)
        if not index.entries:
            raise UserError(f"the trajectory files of `{target}` are empty",
                            "give a run that has collected at least one step")
        index._summarise()
        return index

    def _scan_file(self, file: int, path: Path) -> None:
        offset = 0
        with path.open("rb") as f:
            for number, raw in enumerate(f, start=1):
                length = len(raw)
                if raw.strip():
                    self.entries.append(_entry(len(self.entries), file, number, offset, length, raw))
                offset += length

    def read(self, entry: Entry) -> dict[str, Any]:
        with self.files[entry.file].open("rb") as f:
            f.seek(entry.offset)
            return dict(json.loads(f.read(entry.length)))

    def _summarise(self) -> None:
        """What the list shows on every page whatever its filters, computed once: the values the
        filters offer, and how many lines are not trajectories."""
        def ranked(key: str) -> list[str]:
            return [v for v, _ in Counter(getattr(e, key) for e in self.entries if not e.error).most_common()]
        self.choices = {"env": sorted(ranked("env")), "task": sorted(ranked("task")), "outcome": ranked("outcome")}
        self.unreadable = sum(1 for e in self.entries if e.error)


def _entry(n: int, file: int, line: int, offset: int, length: int, raw: bytes) -> Entry:
    def at(**fields: Any) -> Entry:
        return Entry(n, file, line, offset, length, **fields)

    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as e:
        cut = "" if raw.endswith(b"\n") else " (the line is cut off: the file ends inside it)"
        return at(error=f"not JSON{cut}: {str(e)[:120]}")
    if not isinstance(data, dict) or not {"env_ref", "task_id", "outcome"} <= set(data):
        return at(error="JSON, but not a trajectory record (no env_ref, task_id, outcome)")
    reward = data.get("reward")
    timings: dict[str, Any] = data["timings"] if isinstance(data.get("timings"), dict) else {}
    seconds = timings.get("episode_s")
    try:
        return at(env=str(data["env_ref"]), task=str(data["task_id"]), outcome=str(data["outcome"]),
                  reward=float(reward) if isinstance(reward, (int, float)) else None,
                  attempts=1 + len(data.get("attempts") or []), turns=int(data.get("turns") or 0),
                  seconds=float(seconds) if isinstance(seconds, (int, float)) else None,
                  excluded=bool(data.get("excluded")), generated=sum(1 for m in data.get("loss_mask") or [] if m))
    except (TypeError, ValueError) as e:
        return at(error=f"a trajectory record with a field of the wrong type: {str(e)[:120]}")


def find_tokenizer(target: Path, given: Path | None) -> Path | None:
    """The folder whose tokenizer renders this run's tokens (see the module docstring)."""
    if given is not None:
        return given
    run = target if target.is_dir() else target.parent.parent if target.parent.name == "trajectories" else target.parent
    recipe = run / "recipe.json"
    candidates: list[Path] = []
    if recipe.is_file():
        try:
            model = json.loads(recipe.read_text()).get("model")
            if model:
                candidates.append(Path(model))
        except ValueError:
            pass
    candidates += sorted((run / "weights").glob("v*"), reverse=True)
    return next((c for c in candidates if (c / "tokenizer_config.json").is_file()), None)


class _Tokens:
    """Token ids to text, with the run's tokenizer when there is one (loaded on first use)."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        self._lock = threading.Lock()
        self._tok: Any = None
        self._fmt: Any = None
        self.note = "" if folder else "no tokenizer found (give --tokenizer MODEL_FOLDER): tokens are shown as ids"

    def _load(self) -> None:
        with self._lock:
            if self._tok is not None or self.folder is None:
                return
            try:
                from transformers import AutoTokenizer

                self._tok = AutoTokenizer.from_pretrained(self.folder)
            except Exception as e:  # noqa: BLE001 - shown on the page, the ids still are
                self.note = (f"the tokenizer of {self.folder} did not load ({type(e).__name__}: {str(e)[:200]}): "
                             "ids shown")
                self.folder = None
                return
            try:
                from rl_runner.rollout.chat import ChatFormat

                self._fmt = ChatFormat(self._tok)
            except Exception:  # noqa: BLE001 - no chat format: the text is shown, calls are not parsed
                self._fmt = None

    def piece(self, token: int) -> str:
        self._load()
        return str(self._tok.decode([token])) if self._tok is not None else f"[{token}]"

    def text(self, tokens: list[int]) -> str:
        self._load()
        return str(self._tok.decode(tokens)) if self._tok is not None else " ".join(f"[{t}]" for t in tokens)

    def call(self, tokens: list[int]) -> str:
        """The tool call a reply makes, as the run's chat format parses it."""
        self._load()
        if self._fmt is None:
            return ""
        from envkit.tools import TOOL_SCHEMAS

        try:
            found = self._fmt.parse(self._fmt.reply_text(list(tokens)), list(TOOL_SCHEMAS))
        except Exception as e:  # noqa: BLE001 - an unparseable call is what the model wrote: say so
            return f"unparseable: {getattr(e, 'message', str(e))[:200]}"
        if found is None:
            return "no tool call"
        return f"{found.name}({json.dumps(found.arguments, ensure_ascii=False)[:400]})"


def segments(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The completion as alternating spans: the model's tokens (mask 1: log-prob and weight
    version per token) and what the runner appended (mask 0: observations, turn ends)."""
    ids = record.get("completion_token_ids") or []
    mask = record.get("loss_mask") or [1] * len(ids)
    lps = record.get("logprobs") or [0.0] * len(ids)
    versions = record.get("weight_versions") or [""] * len(ids)
    out: list[dict[str, Any]] = []
    for i, token in enumerate(ids):
        model = bool(mask[i]) if i < len(mask) else True
        if not out or out[-1]["model"] != model:
            out.append({"model": model, "tokens": [], "logprobs": [], "versions": []})
        out[-1]["tokens"].append(int(token))
        out[-1]["logprobs"].append(float(lps[i]) if i < len(lps) else 0.0)
        out[-1]["versions"].append(str(versions[i]) if i < len(versions) else "")
    return out


def _shade(logprob: float) -> str:
    """A token's background: white at probability 1, deep red toward 0 (log scale)."""
    p = math.exp(max(logprob, -20.0))
    strength = min(1.0, -math.log10(max(p, 1e-6)) / 4)  # 1 at p <= 1e-4
    return f"rgba(220, 38, 38, {0.08 + 0.6 * strength:.2f})" if p < 0.98 else "transparent"


def _token_html(tokens: _Tokens, seg: dict[str, Any]) -> str:
    parts = []
    last = None
    for token, lp, version in zip(seg["tokens"], seg["logprobs"], seg["versions"], strict=True):
        if version != last:
            parts.append(f'<span class="version" title="weight version">{html.escape(version or "?")}</span>')
            last = version
        title = f"id {token} · log-prob {lp:.3f} · p {math.exp(max(lp, -50)):.3f} · version {version}"
        parts.append(f'<span class="tok" style="background:{_shade(lp)}" title="{html.escape(title)}">'
                     f'{html.escape(tokens.piece(token))}</span>')
    return "".join(parts)


def make_app(index: TrajectoryIndex, tokenizer: Path | None, title: str) -> Any:
    """The viewer's FastAPI app (pages only; nothing is written)."""
    templates = Jinja2Templates(directory=str(_TEMPLATES))
    tokens = _Tokens(tokenizer)
    app = FastAPI(title="envkit view", docs_url=None, redoc_url=None, openapi_url=None)
    page_size = 50

    @app.get("/", response_class=HTMLResponse)
    def listing(request: Request, env: str = Query("", max_length=300), task: str = Query("", max_length=300),
                outcome: str = Query("", max_length=300), min_reward: str = Query("", max_length=40),
                max_reward: str = Query("", max_length=40), retried: bool = Query(False),
                unreadable: bool = Query(False), sort: str = Query("order"),
                page: int = Query(1, ge=1, le=1_000_000)) -> HTMLResponse:
        notices: list[str] = []

        def number(text: str, what: str) -> float | None:
            try:
                return float(text) if text.strip() else None
            except ValueError:
                notices.append(f"{what} `{text}` is not a number: not applied")
                return None

        low, high = number(min_reward, "reward ≥"), number(max_reward, "reward ≤")
        if sort not in ("order", "reward", "-reward", "seconds", "-seconds", "attempts"):
            notices.append(f"unknown sort `{sort}`: shown as written")
            sort = "order"
        def keep(e: Entry) -> bool:
            if unreadable:
                return bool(e.error)
            if e.error:
                return not (env or task or outcome or low is not None or high is not None or retried)
            return ((not env or e.env == env) and (not task or task in e.task)
                    and (not outcome or e.outcome == outcome
                         or (outcome.endswith(":") and e.outcome.startswith(outcome)))
                    and (low is None or (e.reward is not None and e.reward >= low))
                    and (high is None or (e.reward is not None and e.reward <= high))
                    and (not retried or e.attempts > 1))
        rows = [e for e in index.entries if keep(e)]
        keys = {"reward": lambda e: (e.reward is None, e.reward or 0.0),
                "-reward": lambda e: (e.reward is None, -(e.reward or 0.0)),
                "seconds": lambda e: e.seconds or 0.0, "-seconds": lambda e: -(e.seconds or 0.0),
                "attempts": lambda e: -e.attempts}
        if sort in keys:
            rows.sort(key=keys[sort])
        pages = max(1, math.ceil(len(rows) / page_size))
        shown = rows[(page - 1) * page_size: page * page_size]
        rewards = [e.reward for e in rows if e.reward is not None]
        summary = {"shown": sum(1 for e in rows if not e.error), "total": len(index.entries) - index.unreadable,
                   "unreadable": index.unreadable,
                   "mean_reward": sum(rewards) / len(rewards) if rewards else None,
                   "outcomes": Counter(e.outcome for e in rows if not e.error).most_common(6)}
        query = {k: v for k, v in {"env": env, "task": task, "outcome": outcome, "min_reward": low,
                                   "max_reward": high, "retried": retried or "", "unreadable": unreadable or "",
                                   "sort": sort if sort != "order" else ""}.items() if v not in ("", None)}
        return templates.TemplateResponse(request, "list.html", {
            "title": title, "rows": shown, "files": index.files, "summary": summary, "choices": index.choices,
            "f": {"env": env, "task": task, "outcome": outcome, "min_reward": low, "max_reward": high,
                  "retried": retried, "unreadable": unreadable, "sort": sort}, "notices": notices,
            "page": page, "pages": pages, "query": query})

    @app.get("/t/{n}", response_class=HTMLResponse)
    def trajectory(request: Request, n: int) -> HTMLResponse:
        if not 0 <= n < len(index.entries):
            return templates.TemplateResponse(request, "missing.html", {"title": title, "message": f"no trajectory {n}",
                                                                        "hint": f"this run has {len(index.entries)}"},
                                              status_code=404)
        entry = index.entries[n]
        where = f"{index.files[entry.file].name}, line {entry.line}"
        if entry.error:
            return templates.TemplateResponse(request, "trajectory.html", {"title": title, "e": entry, "where": where,
                                                                           "record": None, "turns": []})
        record = index.read(entry)
        turns = []
        for seg in segments(record):
            if seg["model"]:
                turns.append({"kind": "model", "html": _token_html(tokens, seg), "call": tokens.call(seg["tokens"]),
                              "n": len(seg["tokens"]), "versions": sorted(set(seg["versions"])),
                              "mean_logprob": sum(seg["logprobs"]) / len(seg["logprobs"])})
            else:
                turns.append({"kind": "runner", "text": tokens.text(seg["tokens"]), "n": len(seg["tokens"])})
        attempts = [{"outcome": str(a), "evidence": ev} for a, ev in
                    zip(record.get("attempts") or [], (record.get("attempt_evidence") or []) + [None] * 64,
                        strict=False)]
        prompt = tokens.text(record.get("prompt_token_ids") or [])
        neighbours = {"prev": n - 1 if n > 0 else None, "next": n + 1 if n + 1 < len(index.entries) else None}
        return templates.TemplateResponse(request, "trajectory.html", {
            "title": title, "e": entry, "where": where, "record": record, "turns": turns, "prompt": prompt,
            "attempts": attempts, "note": tokens.note, "nav": neighbours,
            "evidence": json.dumps(record.get("evidence") or {}, indent=2, ensure_ascii=False, default=str),
            "verifier": json.dumps(record.get("verifier") or {}, indent=2, ensure_ascii=False, default=str),
            "timings": record.get("timings") or {}})

    return app
