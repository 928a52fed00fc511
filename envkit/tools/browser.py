"""The `browser` tool: Playwright driving Debian's Chromium on the host against the
sandbox's service, reached through a loopback-only port forward (the sandbox keeps no
network). Every request the page makes to any other origin is aborted.

Actions (one dict each): ``goto {path}``, ``click {id|text}``, ``type {id|field, text}``,
``select {id|field, value}``, ``submit {id|field}``, ``read``, ``back``. Each returns a text
snapshot of the page: its title and path, the interactive elements numbered ``[id]`` (ids
are renewed after every action), and the visible text, capped in size.

Attribution: an element that does not exist, a path that does not start with ``/``, a
timeout waiting on the page: observations for the model (its mistake). A browser that
crashes or cannot start on the host: the infra failure ``browser_crash``.
"""

from __future__ import annotations

import shutil
from typing import Any

from envkit.errors import InfraFailure
from envkit.extras import require
from envkit.sandbox.docker_backend import DockerSandbox
from envkit.sandbox.forward import PortForward

__all__ = ["BrowserSession", "SNAPSHOT_CAP"]

SNAPSHOT_CAP = 12_000
TEXT_CAP = 4_000
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]

# The adjacent raw strings below are one script, split only to keep source lines short.
_SNAPSHOT_JS = (r"""() => {
  const labelText = (el) => {
    if (el.getAttribute('aria-label')) return el.getAttribute('aria-label');
    const lab = el.labels && el.labels.length ? el.labels[0] : null;
    if (!lab) return '';
    let t = '';
    for (const node of lab.childNodes) if (node.nodeType === 3) t += node.textContent;
    return t;
  };
  const out = [];
  let n = 0;
  for (const el of document.querySelectorAll('a[href], button, input, select, textarea')) {
    if (el.type === 'hidden') continue;
    n += 1;
    el.setAttribute('data-envkit-id', String(n));
    const tag = el.tagName.toLowerCase();
    const role = tag === 'a' ? 'link' : tag === 'button' || el.type === 'submit' ? 'button'
               : tag === 'select' ? 'select' : 'textbox';
    const own = role === 'link' || role === 'button' ? (el.innerText || el.value || '') : labelText(el);
    const name = (own || el.placeholder || el.name || '').trim().replace(/\s+/g, ' ');
    const item = {id: n, role, name, field: el.name || '', """
                r"""value: role === 'select' || role === 'textbox' ? el.value : ''};
    if (role === 'link') item.href = el.getAttribute('href');
    if (role === 'select') item.options = Array.from(el.options).map(o => o.value || o.text);
    out.push(item);
  }
  return {title: document.title, url: location.pathname + location.search, """
                r"""text: document.body ? document.body.innerText : '',
          elements: out};
}""")


class BrowserSession:
    """One headless Chromium page pointed at one sandbox's service."""

    def __init__(self, sandbox: DockerSandbox, *, executable: str | None = None) -> None:
        require("browser", "the browser tool (website environments)")
        from playwright.sync_api import Error as PlaywrightError
        from playwright.sync_api import sync_playwright

        self._error = PlaywrightError
        self.forward = PortForward(sandbox)
        self.base = self.forward.url
        self.elements: list[dict[str, Any]] = []
        self._pw: Any = None
        try:
            self._pw = sync_playwright().start()
            exe = executable or shutil.which("chromium") or "/usr/bin/chromium"
            self._browser = self._pw.chromium.launch(executable_path=exe, args=ARGS, headless=True)
            self.page = self._browser.new_page()
            self.page.set_default_timeout(10_000)
            self.page.route("**/*", self._only_the_service)
            self.page.goto(self.base + "/")
        except Exception as e:  # noqa: BLE001 - nothing the model did: the browser would not start
            self.close()
            raise InfraFailure("browser_crash", "the browser could not start on the host",
                               error=f"{type(e).__name__}: {e}"[:500]) from None

    def _only_the_service(self, route: Any) -> None:
        if route.request.url.startswith(self.base + "/") or route.request.url == self.base:
            route.continue_()
        else:
            route.abort()

    # -- actions ---------------------------------------------------------------------
    def act(self, action: dict[str, Any]) -> str:
        kind = action.get("action")
        try:
            if kind == "goto":
                path = str(action.get("path", ""))
                if not path.startswith("/"):
                    return self._note(f"error: goto needs a path that starts with '/', got {path!r}")
                self.page.goto(self.base + path)
            elif kind == "back":
                self.page.go_back()
            elif kind == "read":
                pass
            elif kind in ("click", "type", "select", "submit"):
                target = self._find(action)
                if target is None:
                    return self._note(f"error: no element matches {self._describe(action)} on this page")
                loc = self.page.locator(f'[data-envkit-id="{target["id"]}"]')
                if kind == "click":
                    loc.click()
                elif kind == "type":
                    loc.fill(str(action.get("text", "")))
                elif kind == "select":
                    loc.select_option(str(action.get("value", "")))
                else:
                    loc.evaluate("el => el.form ? el.form.requestSubmit() : el.click()")
            else:
                return self._note(f"error: unknown action {kind!r}; "
                                  "use goto, click, type, select, submit, read or back")
            self.page.wait_for_load_state()
        except self._error as e:
            if not self._browser.is_connected() or "closed" in str(e).lower() and "target" in str(e).lower():
                raise InfraFailure("browser_crash", "the browser crashed", error=str(e)[:500]) from None
            return self._note(f"error: {str(e).splitlines()[0][:300]}")
        return self.snapshot()

    def _describe(self, action: dict[str, Any]) -> str:
        for key in ("id", "text", "field"):
            if key in action:
                return f"{key}={action[key]!r}"
        return "(no id, text or field given)"

    def _find(self, action: dict[str, Any]) -> dict[str, Any] | None:
        if not self.elements:
            self.snapshot()
        if "id" in action:
            return next((el for el in self.elements if str(el["id"]) == str(action["id"])), None)
        if "field" in action:
            return next((el for el in self.elements if el["field"] == action["field"]), None)
        if "text" in action:
            want = str(action["text"]).strip().lower()
            return next((el for el in self.elements if el["name"].lower() == want), None)
        return None

    def _note(self, message: str) -> str:
        return f"{message}\n\n{self.snapshot()}"

    def snapshot(self) -> str:
        data = self.page.evaluate(_SNAPSHOT_JS)
        self.elements = data["elements"]
        lines = [f"page: {data['title']}  ({data['url']})", "elements:"]
        for el in self.elements:
            line = f"[{el['id']}] {el['role']} \"{el['name']}\""
            if el["role"] == "link":
                line += f" -> {el.get('href', '')}"
            if el["role"] in ("select", "textbox"):
                line += f" (field {el['field']}) = {el['value']!r}"
            if el["role"] == "select":
                line += f"; options: {', '.join(el.get('options', []))}"
            lines.append(line)
        text = data["text"][:TEXT_CAP] + (" [...]" if len(data["text"]) > TEXT_CAP else "")
        out = "\n".join(lines) + "\ntext:\n" + text
        return out[:SNAPSHOT_CAP]

    def close(self) -> None:
        for closer in (lambda: self._browser.close(), lambda: self._pw.stop() if self._pw else None,
                       self.forward.close):
            try:
                closer()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
