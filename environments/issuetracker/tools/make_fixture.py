"""Writes fixtures/issuetracker.sql, tasks.jsonl and oracle/*.json, deterministically.

    python3 tools/make_fixture.py      (run from environments/issuetracker)

Expected values are computed here from the fixture, so tasks cannot drift from the data.
Oracles act through the browser tool, as an agent would. Not part of the bundle.
"""

import datetime as dt
import json
import random
import sqlite3
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
NOW = dt.datetime(2026, 2, 1, 9, 0, 0)
rng = random.Random(4242)
USERS = ["alice", "bob", "carol", "dave", "erin"]
LABELS = ["bug", "docs", "feature", "ux", "wontfix"]
TOPICS = ["Login page", "Export", "Search", "Dashboard", "Settings", "Notifications", "API tokens", "Billing",
          "Reports", "Profile", "Upload", "Sidebar", "Dark mode", "Email digest", "Permissions"]
PROBLEMS = ["is slow", "crashes on save", "shows the wrong date", "ignores the filter", "needs a tooltip",
            "breaks on mobile", "loses unsaved changes", "has a typo", "times out", "renders twice"]

SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE users (name TEXT PRIMARY KEY);
CREATE TABLE labels (name TEXT PRIMARY KEY);
CREATE TABLE issues (id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL, body TEXT NOT NULL,
  status TEXT NOT NULL, priority TEXT NOT NULL, assignee TEXT REFERENCES users(name), author TEXT NOT NULL, \
created_at TEXT NOT NULL);
CREATE TABLE issue_labels (issue_id INTEGER NOT NULL REFERENCES issues(id), label TEXT NOT NULL REFERENCES labels(name),
  PRIMARY KEY (issue_id, label));
CREATE TABLE comments (id INTEGER PRIMARY KEY AUTOINCREMENT, issue_id INTEGER NOT NULL REFERENCES issues(id),
  author TEXT NOT NULL, body TEXT NOT NULL, created_at TEXT NOT NULL);
"""


def build():
    db = sqlite3.connect(":memory:")
    db.executescript(SCHEMA)
    db.execute("INSERT INTO meta VALUES ('now', ?)", (NOW.strftime("%Y-%m-%dT%H:%M:%SZ"),))
    db.executemany("INSERT INTO users VALUES (?)", [(u,) for u in USERS])
    db.executemany("INSERT INTO labels VALUES (?)", [(x,) for x in LABELS])
    special = {  # id: (status, priority, assignee, labels)
        3: ("open", "medium", "bob", ["bug"]), 7: ("closed", "low", "alice", ["bug"]), 9: ("open", "high", "carol", []),
        12: ("open", "medium", "alice", ["bug"]), 15: ("open", "low", None, ["feature"]),
        18: ("open", "high", None, ["bug"]), 20: ("open", "medium", "dave", []),
        22: ("open", "low", "dave", ["wontfix"]), 27: ("open", "medium", None, ["wontfix"]),
        30: ("open", "high", "erin", ["bug"]), 31: ("open", "high", None, ["bug"]), 36: ("open", "low", "dave", ["ux"]),
        38: ("open", "medium", "bob", ["wontfix"]), 41: ("open", "medium", "dave", ["docs"]),
    }
    for i in range(1, 46):
        title = f"{TOPICS[i % len(TOPICS)]} {PROBLEMS[(i * 7) % len(PROBLEMS)]}"
        if i == 31:
            title = TOPICS[30 % len(TOPICS)] + " " + PROBLEMS[(30 * 7) % len(PROBLEMS)] + " (again)"
        if i in special:
            status, prio, who, labels = special[i]
        else:
            status = "closed" if rng.random() < 0.3 else "open"
            prio = ["low", "medium", "medium"][rng.randrange(3)]  # high only where a task says so
            who = [None, "alice", "bob", "carol", "erin"][rng.randrange(5)]  # dave only where a task says so
            labels = [x for x in ["bug", "docs", "feature", "ux"] if rng.random() < 0.2]
        created = (NOW - dt.timedelta(days=200 - i * 4, hours=i)).strftime("%Y-%m-%dT%H:%M:%SZ")
        db.execute("INSERT INTO issues VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                   (i, title, f"Steps to reproduce for: {title.lower()}.", status, prio, who, USERS[i % 5], created))
        for label in labels:
            db.execute("INSERT INTO issue_labels VALUES (?, ?)", (i, label))
        n_comments = {17: 6}.get(i, rng.randrange(0, 4))
        for c in range(n_comments):
            db.execute("INSERT INTO comments (issue_id, author, body, created_at) VALUES (?, ?, ?, ?)",
                       (i, USERS[(i + c) % 5], f"Comment {c + 1} on #{i}.", created))
    db.commit()
    return db


def q(db, sql, *args):
    return [list(r) for r in db.execute(sql, args).fetchall()]


def main():
    db = build()
    (HERE / "fixtures").mkdir(exist_ok=True)
    (HERE / "fixtures" / "issuetracker.sql").write_text("\n".join(db.iterdump()) + "\n")

    snap = ("SELECT group_concat(id || ':' || status || ':' || priority || ':' || COALESCE(assignee, '-'), ',') "
            "FROM (SELECT * FROM issues WHERE id NOT IN ({}) ORDER BY id)")

    def guard(*ids):
        s = snap.format(",".join(str(i) for i in ids) or "0")
        return {"sql": s, "expect": q(db, s)}

    B = lambda action, **kw: {"tool": "browser", "action": action, **kw}  # noqa: E731
    A = lambda text: {"tool": "answer", "text": text}  # noqa: E731

    def set_select(issue, field, value, button):
        return [B("goto", path=f"/issues/{issue}"), B("select", field=field, value=value), B("click", text=button)]

    bob_open = q(db, "SELECT COUNT(*) FROM issues WHERE status = 'open' AND assignee = 'bob'")[0][0]
    oldest_open = q(db, "SELECT title FROM issues WHERE status = 'open' ORDER BY created_at, id LIMIT 1")[0][0]
    page3_first = q(db, "SELECT title FROM issues WHERE status = 'open' ORDER BY id LIMIT 1 OFFSET 20")[0][0]
    unassigned_high = q(db, "SELECT id FROM issues WHERE status = 'open' AND priority = 'high' AND assignee IS NULL "
                            "ORDER BY id")
    most_comments = q(db, "SELECT issue_id FROM comments GROUP BY issue_id ORDER BY COUNT(*) DESC, issue_id "
                          "LIMIT 1")[0][0]
    wontfix_open = [r[0] for r in q(db, "SELECT i.id FROM issues i JOIN issue_labels l ON l.issue_id = i.id "
                                        "WHERE l.label = 'wontfix' AND i.status = 'open' ORDER BY i.id")]
    dave_open = [r[0] for r in q(db, "SELECT id FROM issues WHERE status = 'open' AND assignee = 'dave' ORDER BY id")]
    next_id = q(db, "SELECT MAX(id) + 1 FROM issues")[0][0]
    assert len(unassigned_high) == 2, unassigned_high  # #18 and #31; the task names the bug-free one

    tasks = [
        ("close-issue", "easy", "Close issue #12.",
         {"checks": [{"sql": "SELECT status FROM issues WHERE id = 12", "expect": [["closed"]]}],
          "guards": [guard(12)]},
         set_select(12, "status", "closed", "Update status")),
        ("reopen-issue", "easy", "Issue #7 came back: reopen it.",
         {"checks": [{"sql": "SELECT status FROM issues WHERE id = 7", "expect": [["open"]]}], "guards": [guard(7)]},
         set_select(7, "status", "open", "Update status")),
        ("assign-issue", "easy", "Assign issue #15 to carol.",
         {"checks": [{"sql": "SELECT assignee FROM issues WHERE id = 15", "expect": [["carol"]]}],
          "guards": [guard(15)]},
         set_select(15, "assignee", "carol", "Assign")),
        ("lower-priority", "easy", "Set the priority of issue #9 to low.",
         {"checks": [{"sql": "SELECT priority FROM issues WHERE id = 9", "expect": [["low"]]}], "guards": [guard(9)]},
         set_select(9, "priority", "low", "Set priority")),
        ("comment-issue", "easy", "On issue #3, add a comment saying: A fix is being tested.",
         {"checks": [{"sql": "SELECT COUNT(*) FROM comments WHERE issue_id = 3 AND author = 'you' "
                             "AND lower(body) LIKE '%fix is being tested%'",
                      "expect": [[1]]}], "guards": [guard()]},
         [B("goto", path="/issues/3"), B("type", field="body", text="A fix is being tested."),
          B("click", text="Add comment")]),
        ("label-issue", "medium", "Label issue #20 as a bug.",
         {"checks": [{"sql": "SELECT COUNT(*) FROM issue_labels WHERE issue_id = 20 AND label = 'bug'",
                      "expect": [[1]]}],
          "guards": [guard()]},
         set_select(20, "label", "bug", "Add label")),
        ("create-issue", "medium", "File a new issue titled 'Export to CSV fails on empty reports' with high priority.",
         {"checks": [{"sql": "SELECT COUNT(*) FROM issues WHERE title = 'Export to CSV fails on empty reports' "
                             "AND priority = 'high' AND status = 'open'",
                      "expect": [[1]]}], "guards": [guard(next_id)]},
         [B("click", text="New issue"), B("type", field="title", text="Export to CSV fails on empty reports"),
          B("select", field="priority", value="high"), B("click", text="Create issue")]),
        ("count-bob-open", "medium", "How many open issues are assigned to bob? Answer with a number.",
         {"answer": {"expect": str(bob_open), "type": "number"}},
         [B("click", text="People"), A(str(bob_open))]),
        ("oldest-open", "medium", "What is the title of the oldest open issue? Answer with the title.",
         {"answer": {"expect": oldest_open}}, [B("goto", path="/issues"), A(oldest_open)]),
        ("third-page", "medium",
         "In the list of open issues, what is the title of the first issue on page 3? Answer with the title.",
         {"answer": {"expect": page3_first}},
         [B("goto", path="/issues"), B("click", text="Next page"), B("click", text="Next page"), A(page3_first)]),
        ("most-comments", "hard", "Which issue has the most comments? Answer with its number.",
         {"answer": {"expect": str(most_comments), "type": "number"}},
         [B("goto", path=f"/issues/{most_comments}"), A(str(most_comments))]),
        ("unassigned-high", "hard",
         "Which open high-priority issues have nobody assigned? Answer with their numbers, comma-separated.",
         {"answer": {"expect": ",".join(str(r[0]) for r in unassigned_high), "type": "set"}},
         [B("goto", path="/issues?status=open"), A(", ".join(str(r[0]) for r in unassigned_high))]),
        ("close-wontfix", "hard", "Close every open issue labelled wontfix. Change nothing else.",
         {"checks": [{"sql": f"SELECT status FROM issues WHERE id = {i}", "expect": [["closed"]]}
                     for i in wontfix_open],
          "guards": [guard(*wontfix_open)]},
         [B("goto", path="/issues?status=open&label=wontfix")]
         + [a for i in wontfix_open for a in set_select(i, "status", "closed", "Update status")]),
        ("reassign-dave", "hard", "Dave is leaving: reassign all of his open issues to erin. Change nothing else.",
         {"checks": [{"sql": f"SELECT assignee FROM issues WHERE id = {i}", "expect": [["erin"]]} for i in dave_open],
          "guards": [guard(*dave_open)]},
         [B("goto", path="/issues?status=open&assignee=dave")]
         + [a for i in dave_open for a in set_select(i, "assignee", "erin", "Assign")]),
        ("close-duplicate", "hard", "Issue #31 duplicates #30. Comment 'Duplicate of #30' on #31, then close #31.",
         {"checks": [{"sql": "SELECT status FROM issues WHERE id = 31", "expect": [["closed"]]},
                     {"sql": "SELECT COUNT(*) FROM comments WHERE issue_id = 31 AND author = 'you' "
                             "AND body LIKE '%Duplicate of #30%'",
                      "expect": [[1]]}], "guards": [guard(31)]},
         [B("goto", path="/issues/31"), B("type", field="body", text="Duplicate of #30"),
          B("click", text="Add comment"), B("select", field="status", value="closed"),
          B("click", text="Update status")]),
    ]
    lines = []
    for tid, difficulty, instruction, params, actions in tasks:
        lines.append(json.dumps({"id": tid, "difficulty": difficulty, "instruction": instruction,
                                 "oracle": f"oracle/{tid}.json", "params": params}))
        (HERE / "oracle" / f"{tid}.json").write_text(json.dumps({"actions": actions}, indent=1) + "\n")
    (HERE / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    print(f"{len(tasks)} tasks; wontfix {wontfix_open}; dave {dave_open}; unassigned high {unassigned_high}")


if __name__ == "__main__":
    main()
