"""issuetracker: a small server-rendered issue tracker (forms, links, pagination) over SQLite.

Runs inside the sandbox: python3 server.py ($ENVKIT_DB, $ENVKIT_PORT, 127.0.0.1 only). All
state is in the database, opened per request; every POST redirects (POST/redirect/GET).
"""

import html
import os
import re
import sqlite3
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlparse

DB = os.environ.get("ENVKIT_DB", "issuetracker.sqlite")
PORT = int(os.environ.get("ENVKIT_PORT", "8080"))
PAGE = 10
STATUSES = ("open", "closed")
PRIORITIES = ("low", "medium", "high")
e = html.escape


def connect():
    conn = sqlite3.connect(DB, timeout=10)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=DELETE")
    return conn


def now(conn):
    return conn.execute("SELECT value FROM meta WHERE key = 'now'").fetchone()[0]


def layout(title, body):
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{e(title)} · Tracker</title>
<style>body{{font:15px system-ui,sans-serif;max-width:900px;margin:auto;padding:1rem}} \
table{{border-collapse:collapse;width:100%}}
td,th{{border-bottom:1px solid #ddd;padding:.3rem;text-align:left}} \
.badge{{padding:0 .4rem;border-radius:8px;background:#eef}}</style>
</head><body><nav><a href="/issues">Issues</a> · <a href="/issues/new">New issue</a> · <a href="/users">People</a></nav>
<h1>{e(title)}</h1>{body}</body></html>"""


def options(values, selected, blank=None):
    out = [f'<option value="">{e(blank)}</option>'] if blank is not None else []
    out += [f'<option value="{e(v)}"{" selected" if v == selected else ""}>{e(v)}</option>' for v in values]
    return "".join(out)


def issues_page(conn, q):
    status = q.get("status", "open")
    assignee = q.get("assignee", "")
    label = q.get("label", "")
    page = max(1, int(q.get("page", "1") or 1)) if str(q.get("page", "1")).isdigit() else 1
    where, args = [], []
    if status in STATUSES:
        where.append("i.status = ?")
        args.append(status)
    if assignee:
        where.append("i.assignee = ?")
        args.append(assignee)
    if label:
        where.append("EXISTS (SELECT 1 FROM issue_labels l WHERE l.issue_id = i.id AND l.label = ?)")
        args.append(label)
    sql_where = (" WHERE " + " AND ".join(where)) if where else ""
    total = conn.execute(f"SELECT COUNT(*) FROM issues i{sql_where}", args).fetchone()[0]
    rows = conn.execute(f"SELECT * FROM issues i{sql_where} ORDER BY i.id LIMIT ? OFFSET ?",
                        args + [PAGE, (page - 1) * PAGE]).fetchall()
    users = [r[0] for r in conn.execute("SELECT name FROM users ORDER BY name")]
    labels = [r[0] for r in conn.execute("SELECT name FROM labels ORDER BY name")]
    form = f"""<form method="get" action="/issues" aria-label="Filter issues">
<label>Status <select name="status">{options(STATUSES + ("all",), status)}</select></label>
<label>Assignee <select name="assignee">{options(users, assignee, "anyone")}</select></label>
<label>Label <select name="label">{options(labels, label, "any")}</select></label>
<button type="submit">Filter</button></form>"""
    body = [form, f"<p>{total} issue{'s' if total != 1 else ''}</p>"
                  "<table><tr><th>#</th><th>Title</th><th>Status</th><th>Priority</th><th>Assignee</th></tr>"]
    for r in rows:
        body.append(f'<tr><td>{r["id"]}</td><td><a href="/issues/{r["id"]}">{e(r["title"])}</a></td>'
                    f'<td>{r["status"]}</td><td>{r["priority"]}</td><td>{e(r["assignee"] or "—")}</td></tr>')
    body.append("</table>")
    pages = max(1, -(-total // PAGE))
    base = {"status": status, "assignee": assignee, "label": label}
    nav = []
    if page > 1:
        nav.append(f'<a href="/issues?{urlencode({**base, "page": page - 1})}">Previous page</a>')
    nav.append(f"<span>Page {page} of {pages}</span>")
    if page < pages:
        nav.append(f'<a href="/issues?{urlencode({**base, "page": page + 1})}">Next page</a>')
    body.append('<nav aria-label="Pagination">' + " ".join(nav) + "</nav>")
    return layout("Issues", "".join(body))


def issue_page(conn, issue_id):
    r = conn.execute("SELECT * FROM issues WHERE id = ?", (issue_id,)).fetchone()
    if r is None:
        return None
    labels = [x[0] for x in conn.execute("SELECT label FROM issue_labels WHERE issue_id = ? ORDER BY label",
                                         (issue_id,))]
    comments = conn.execute("SELECT * FROM comments WHERE issue_id = ? ORDER BY id", (issue_id,)).fetchall()
    users = [x[0] for x in conn.execute("SELECT name FROM users ORDER BY name")]
    all_labels = [x[0] for x in conn.execute("SELECT name FROM labels ORDER BY name")]
    parts = [f'<p>Status: <strong>{r["status"]}</strong> · Priority: <strong>{r["priority"]}</strong> · '
             f'Assignee: <strong>{e(r["assignee"] or "nobody")}</strong> · '
             f'Opened {r["created_at"][:10]} by {e(r["author"])}</p>',
             f'<p>Labels: {" ".join(f"<span class=badge>{e(x)}</span>" for x in labels) or "none"}</p>',
             f'<div class="body">{e(r["body"])}</div><h2>Comments ({len(comments)})</h2>']
    for c in comments:
        parts.append(f'<div class="comment"><strong>{e(c["author"])}</strong>: {e(c["body"])}</div>')
    parts.append(f"""<form method="post" action="/issues/{issue_id}/comments" aria-label="Add a comment">
<label>Comment <textarea name="body"></textarea></label><button type="submit">Add comment</button></form>
<form method="post" action="/issues/{issue_id}/status" aria-label="Change status">
<label>Status <select name="status">{options(STATUSES, r["status"])}</select></label>\
<button type="submit">Update status</button></form>
<form method="post" action="/issues/{issue_id}/assign" aria-label="Assign">
<label>Assignee <select name="assignee">{options(users, r["assignee"] or "", "nobody")}</select></label>\
<button type="submit">Assign</button></form>
<form method="post" action="/issues/{issue_id}/priority" aria-label="Change priority">
<label>Priority <select name="priority">{options(PRIORITIES, r["priority"])}</select></label>\
<button type="submit">Set priority</button></form>
<form method="post" action="/issues/{issue_id}/labels" aria-label="Add a label">
<label>Label <select name="label">{options(all_labels, "")}</select></label>\
<button type="submit">Add label</button></form>""")
    return layout(f"#{issue_id} {r['title']}", "".join(parts))


def new_issue_page():
    return layout("New issue", f"""<form method="post" action="/issues" aria-label="New issue">
<label>Title <input name="title" type="text"></label>
<label>Description <textarea name="body"></textarea></label>
<label>Priority <select name="priority">{options(PRIORITIES, "medium")}</select></label>
<button type="submit">Create issue</button></form>""")


def users_page(conn):
    rows = conn.execute("SELECT u.name, "
                        "(SELECT COUNT(*) FROM issues i WHERE i.assignee = u.name AND i.status = 'open') "
                        "FROM users u ORDER BY u.name").fetchall()
    items = "".join(f'<li><a href="/issues?{urlencode({"status": "open", "assignee": n})}">{e(n)}</a>: {c} open</li>'
                    for n, c in rows)
    return layout("People", f"<ul>{items}</ul>")


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def send(self, status, text, location=None):
        data = text.encode()
        self.send_response(status)
        if location:
            self.send_header("Location", location)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        url = urlparse(self.path)
        q = {k: v[-1] for k, v in parse_qs(url.query).items()}
        if url.path == "/health":
            return self.send(200, "ok")
        if url.path == "/":
            return self.send(302, "", "/issues")
        conn = connect()
        try:
            if url.path == "/issues":
                return self.send(200, issues_page(conn, q))
            if url.path == "/issues/new":
                return self.send(200, new_issue_page())
            if url.path == "/users":
                return self.send(200, users_page(conn))
            m = re.fullmatch(r"/issues/(\d+)", url.path)
            page = issue_page(conn, int(m[1])) if m else None
            return self.send(200, page) if page else self.send(404, layout("Not found", "<p>No such page.</p>"))
        finally:
            conn.close()

    def do_POST(self):
        url = urlparse(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        form = {k: v[-1] for k, v in parse_qs(self.rfile.read(length).decode(errors="replace")).items()}
        conn = connect()
        try:
            if url.path == "/issues":
                title = form.get("title", "").strip()
                if not title:
                    return self.send(400, layout("New issue", "<p>A title is required.</p>"))
                prio = form.get("priority") if form.get("priority") in PRIORITIES else "medium"
                cur = conn.execute("INSERT INTO issues (title, body, status, priority, assignee, author, created_at) "
                                   "VALUES (?, ?, 'open', ?, NULL, 'you', ?)",
                                   (title, form.get("body", ""), prio, now(conn)))
                conn.commit()
                return self.send(303, "", f"/issues/{cur.lastrowid}")
            m = re.fullmatch(r"/issues/(\d+)/(comments|status|assign|priority|labels)", url.path)
            if not m or conn.execute("SELECT 1 FROM issues WHERE id = ?", (int(m[1]),)).fetchone() is None:
                return self.send(404, layout("Not found", "<p>No such issue.</p>"))
            issue_id, what = int(m[1]), m[2]
            if what == "comments" and form.get("body", "").strip():
                conn.execute("INSERT INTO comments (issue_id, author, body, created_at) VALUES (?, 'you', ?, ?)",
                             (issue_id, form["body"].strip(), now(conn)))
            elif what == "status" and form.get("status") in STATUSES:
                conn.execute("UPDATE issues SET status = ? WHERE id = ?", (form["status"], issue_id))
            elif what == "assign":
                who = form.get("assignee") or None
                if who is None or conn.execute("SELECT 1 FROM users WHERE name = ?", (who,)).fetchone():
                    conn.execute("UPDATE issues SET assignee = ? WHERE id = ?", (who, issue_id))
            elif what == "priority" and form.get("priority") in PRIORITIES:
                conn.execute("UPDATE issues SET priority = ? WHERE id = ?", (form["priority"], issue_id))
            elif what == "labels" and conn.execute("SELECT 1 FROM labels WHERE name = ?",
                                                   (form.get("label"),)).fetchone():
                conn.execute("INSERT OR IGNORE INTO issue_labels VALUES (?, ?)", (issue_id, form["label"]))
            conn.commit()
            return self.send(303, "", f"/issues/{issue_id}")
        finally:
            conn.close()


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
