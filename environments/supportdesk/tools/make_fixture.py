"""Writes fixtures/supportdesk.sql, tasks.jsonl and oracle/*.json, deterministically.

    python3 tools/make_fixture.py      (run from environments/supportdesk)

Every task's checks are SQL queries with their expected results, computed here from the
fixture, so the fixture and the tasks cannot drift apart. Not part of the bundle.
"""

import datetime as dt
import json
import random
import sqlite3
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
NOW = dt.datetime(2026, 1, 15, 12, 0, 0)
rng = random.Random(20260115)


def ts(days_ago: float) -> str:
    return (NOW - dt.timedelta(days=days_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL UNIQUE, phone TEXT NOT NULL,
  tier TEXT NOT NULL CHECK (tier IN ('bronze', 'silver', 'gold')), created_at TEXT NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
  status TEXT NOT NULL CHECK (status IN ('pending', 'shipped', 'delivered', 'cancelled')), total_cents INTEGER NOT NULL,
  tracking TEXT, created_at TEXT NOT NULL, delivered_at TEXT, updated_at TEXT NOT NULL);
CREATE TABLE order_items (order_id INTEGER NOT NULL REFERENCES orders(id), sku TEXT NOT NULL, name TEXT NOT NULL,
  qty INTEGER NOT NULL, unit_cents INTEGER NOT NULL, PRIMARY KEY (order_id, sku));
CREATE TABLE refunds (id INTEGER PRIMARY KEY AUTOINCREMENT, order_id INTEGER NOT NULL REFERENCES orders(id),
  amount_cents INTEGER NOT NULL, reason TEXT NOT NULL,
  status TEXT NOT NULL CHECK (status IN ('requested', 'approved', 'denied', 'escalated')), note TEXT NOT NULL, \
created_at TEXT NOT NULL);
CREATE TABLE policies (key TEXT PRIMARY KEY, value TEXT NOT NULL, description TEXT NOT NULL);
CREATE TABLE agents (name TEXT PRIMARY KEY, team TEXT NOT NULL);
CREATE TABLE tickets (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id), \
order_id INTEGER REFERENCES orders(id),
  subject TEXT NOT NULL, status TEXT NOT NULL CHECK (status IN ('open', 'pending', 'closed')), \
assignee TEXT REFERENCES agents(name),
  tag TEXT NOT NULL, created_at TEXT NOT NULL);
CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, ticket_id INTEGER NOT NULL REFERENCES tickets(id),
  author TEXT NOT NULL, body TEXT NOT NULL, created_at TEXT NOT NULL);
"""

FIRST = ["Ana", "Ben", "Chloe", "Dana", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jade", "Kofi", "Lena", "Mateo", "Nina",
         "Omar", "Priya", "Quinn", "Ravi", "Sara", "Tomas", "Uma", "Victor"]
LAST = ["Silva", "Okafor", "Martin", "Kim", "Novak", "Haddad", "Berg", "Sato", "Petrov", "Lopez", "Mensah", "Fischer",
        "Garcia", "Rossi", "Aziz", "Shah", "Walsh", "Patel", "Cohen", "Ruiz", "Iyer", "Dubois"]
PRODUCTS = [("KB-101", "Mechanical keyboard", 8900), ("MS-220", "Wireless mouse", 2900), ("HD-330", "Headset", 5900),
            ("MN-440", "27in monitor", 27900), ("CB-550", "USB-C cable", 1200), ("DK-660", "Docking station", 14900),
            ("WC-770", "Webcam", 6900), ("LP-880", "Laptop stand", 3900)]
AGENTS = [("alice", "tier1"), ("bruno", "tier1"), ("chen", "tier2"), ("dara", "tier2")]


def build() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:")
    db.executescript(SCHEMA)
    db.execute("INSERT INTO meta VALUES ('now', ?)", (ts(0),))
    tiers = ["bronze", "silver", "gold"]
    for i in range(22):
        name = f"{FIRST[i]} {LAST[i]}"
        email = f"{FIRST[i].lower()}.{LAST[i].lower()}@example.com"
        tier = "gold" if name in ("Dana Kim", "Mateo Garcia") else ("silver" if name == "Ravi Patel"
                                                                    else tiers[rng.randrange(3)])
        db.execute("INSERT INTO customers VALUES (?, ?, ?, ?, ?, ?)",
                   (i + 1, name, email, f"+1-555-{1000 + i * 37:04d}", tier, ts(400 - i * 9)))
    db.executemany("INSERT INTO agents VALUES (?, ?)", AGENTS)
    db.executemany("INSERT INTO policies VALUES (?, ?, ?)", [
        ("refund_window_days_bronze", "14", "Bronze customers: refunds within 14 days of delivery."),
        ("refund_window_days_silver", "30", "Silver customers: refunds within 30 days of delivery."),
        ("refund_window_days_gold", "60", "Gold customers: refunds within 60 days of delivery."),
        ("refund_auto_approve_max_cents", "10000",
         "Refunds within the window up to this amount may be approved by support; larger ones must be escalated."),
        ("refund_outside_window", "deny", "Requests outside the customer's window are denied."),
    ])
    # Orders: 1001.. ; explicit ones first (the tasks depend on them), then filler.
    explicit = [
        # id, customer, status, delivered days ago, items
        (1001, 4, "delivered", 20, [("KB-101", 1), ("MS-220", 1)]),     # Dana Kim (gold)
        (1002, 4, "delivered", 45, [("MN-440", 1)]),                    # Dana Kim: gold window
        (1003, 4, "shipped", None, [("CB-550", 3)]),
        (1004, 18, "pending", None, [("HD-330", 1)]),                   # Ravi Patel: cancel
        (1005, 18, "delivered", 10, [("LP-880", 1)]),
        (1006, 13, "delivered", 5, [("DK-660", 1), ("CB-550", 2)]),     # Mateo (gold): high value
        (1007, 2, "delivered", 50, [("WC-770", 1)]),                    # outside window
        (1008, 7, "delivered", 3, [("MS-220", 2)]),                     # in window, small
        (1009, 9, "delivered", 2, [("HD-330", 1), ("KB-101", 1)]),      # damaged (ticket 9)
        (1010, 11, "shipped", None, [("WC-770", 1)]),                   # ticket 5 tracking
        (1030, 15, "shipped", None, [("LP-880", 2)]),                   # mark delivered
    ]
    ids = {e[0] for e in explicit}
    statuses = ["pending", "shipped", "delivered", "delivered", "delivered", "cancelled"]
    filler = []
    for oid in range(1011, 1041):
        if oid in ids:
            continue
        items = [(PRODUCTS[rng.randrange(len(PRODUCTS))][0], rng.randint(1, 2)) for _ in range(rng.randint(1, 3))]
        status = statuses[rng.randrange(len(statuses))]
        days = rng.randint(1, 120) if status == "delivered" else None
        filler.append((oid, rng.randint(1, 22), status, days, items))
    prices = {sku: (name, cents) for sku, name, cents in PRODUCTS}
    for oid, cust, status, days, items in sorted(explicit + filler):
        merged: dict[str, int] = {}
        for sku, qty in items:
            merged[sku] = merged.get(sku, 0) + qty
        total = sum(prices[s][1] * q for s, q in merged.items())
        created = (days or 0) + 4
        tracking = f"TRK{oid * 7919 % 1000003:07d}" if status in ("shipped", "delivered") else None
        db.execute("INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                   (oid, cust, status, total, tracking, ts(created), ts(days) if days is not None else None,
                    ts(days or 1)))
        for sku, qty in sorted(merged.items()):
            db.execute("INSERT INTO order_items VALUES (?, ?, ?, ?, ?)",
                       (oid, sku, prices[sku][0], qty, prices[sku][1]))
    total = lambda oid: db.execute("SELECT total_cents FROM orders WHERE id = ?", (oid,)).fetchone()[0]  # noqa: E731
    refunds = [
        (1001, 2900, "mouse double-clicks", "approved"), (1005, 3900, "changed mind", "denied"),
        (1016, 1200, "cable missing", "approved"), (1022, 2900, "late delivery", "approved"),
        (1007, total(1007), "webcam stopped working", "requested"),      # R5: outside window -> deny
        (1008, 2900, "one mouse broken", "requested"),                   # R6: in window, small -> approve
        (1006, total(1006), "wrong dock model", "requested"),            # R7: over max -> escalate
        (1002, total(1002), "dead pixels", "requested"),                 # R8: gold, 45 days -> approve
    ]
    for oid, cents, reason, status in refunds:
        db.execute("INSERT INTO refunds (order_id, amount_cents, reason, status, note, created_at) "
                   "VALUES (?, ?, ?, ?, '', ?)",
                   (oid, cents, reason, status, ts(1)))
    tickets = [
        (1, 4, 1001, "Mouse double-clicks", "closed", "alice", "hardware"),
        (2, 7, None, "Change of address", "open", None, "account"),
        (3, 2, 1007, "Webcam refund", "open", "bruno", "refund"),
        (4, 3, None, "Invoice copy", "open", "alice", "billing"),
        (5, 11, 1010, "Where is my order?", "open", None, "shipping"),
        (6, 12, None, "Invoice copy (again)", "open", None, "duplicate"),
        (7, 5, None, "Password reset", "pending", "chen", "account"),
        (8, 6, None, "Where is my order??", "open", "dara", "duplicate"),
        (9, 9, 1009, "Order arrived broken", "open", None, "damage"),
        (10, 10, None, "Discount code", "closed", "bruno", "billing"),
        (11, 14, None, "Double charge", "open", "chen", "billing"),
        (12, 16, None, "Warranty question", "open", None, "hardware"),
        (13, 17, None, "Same as ticket 11", "open", "alice", "duplicate"),
        (14, 19, None, "Gift wrapping", "closed", "dara", "account"),
        (15, 20, None, "Bulk order quote", "open", "alice", "sales"),
    ]
    for t in tickets:
        db.execute("INSERT INTO tickets VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (*t, ts(30 - t[0])))
        db.execute("INSERT INTO messages (ticket_id, author, body, created_at) VALUES (?, 'customer', ?, ?)",
                   (t[0], f"{t[3]}. Please help.", ts(30 - t[0])))
    db.commit()
    return db


def q(db, sql, *args):
    return [list(r) for r in db.execute(sql, args).fetchall()]


def main() -> None:
    db = build()
    sql = "\n".join(db.iterdump()) + "\n"
    (HERE / "fixtures").mkdir(exist_ok=True)
    (HERE / "fixtures" / "supportdesk.sql").write_text(sql)

    order_snapshot = ("SELECT group_concat(id || ':' || status, ',') "
                      "FROM (SELECT id, status FROM orders WHERE id != ? ORDER BY id)")
    ticket_snapshot = ("SELECT group_concat(id || ':' || status || ':' || COALESCE(assignee, '-'), ',') "
                       "FROM (SELECT * FROM tickets WHERE id NOT IN ({}) ORDER BY id)")
    refund_snapshot = ("SELECT group_concat(id || ':' || status, ',') "
                       "FROM (SELECT id, status FROM refunds WHERE id != ? ORDER BY id)")

    def guard_orders(oid):
        return {"sql": order_snapshot.replace("?", str(oid)), "expect": q(db, order_snapshot, oid)}

    def guard_refunds(rid):
        return {"sql": refund_snapshot.replace("?", str(rid)), "expect": q(db, refund_snapshot, rid)}

    def guard_tickets(*tids):
        s = ticket_snapshot.format(",".join(str(t) for t in tids))
        return {"sql": s, "expect": q(db, s)}

    emails_other = ("SELECT group_concat(id || ':' || email, ',') "
                    "FROM (SELECT id, email FROM customers WHERE id != 3 ORDER BY id)")
    dana_spend = q(db, "SELECT SUM(total_cents) FROM orders WHERE customer_id = 4 AND status = 'delivered'")[0][0]
    open_tickets = q(db, "SELECT COUNT(*) FROM tickets WHERE status = 'open'")[0][0]
    biggest = q(db, "SELECT order_id FROM refunds WHERE status = 'approved' ORDER BY amount_cents DESC, id "
                    "LIMIT 1")[0][0]
    loads = q(db, "SELECT a.name, (SELECT COUNT(*) FROM tickets t WHERE t.assignee = a.name AND t.status = 'open') n "
                  "FROM agents a ORDER BY n, a.name")
    least = loads[0][0]
    tracking_1010 = q(db, "SELECT tracking FROM orders WHERE id = 1010")[0][0]
    total_1009 = q(db, "SELECT total_cents FROM orders WHERE id = 1009")[0][0]
    next_refund = q(db, "SELECT MAX(id) + 1 FROM refunds")[0][0]
    ravi_pending = q(db, "SELECT id FROM orders WHERE customer_id = 18 AND status = 'pending'")[0][0]

    H = lambda method, path, body=None: {"tool": "http", "method": method, "path": path,  # noqa: E731
                                         **({"body": body} if body else {})}
    A = lambda text: {"tool": "answer", "text": text}  # noqa: E731
    tasks = [
        ("lookup-tier", "easy",
         "What loyalty tier does the customer with email dana.kim@example.com have? Answer with the tier name.",
         {"answer": {"expect": "gold"}}, [H("GET", "/customers?email=dana.kim@example.com"), A("gold")]),
        ("count-open-tickets", "easy", "How many support tickets are open right now? Answer with a number.",
         {"answer": {"expect": str(open_tickets), "type": "number"}},
         [H("GET", "/tickets?status=open"), A(str(open_tickets))]),
        ("policy-window-silver", "easy",
         "How many days after delivery may a silver-tier customer get a refund? Answer with a number.",
         {"answer": {"expect": "30", "type": "number"}}, [H("GET", "/policies"), A("30")]),
        ("customer-spend", "medium",
         "What is the total, in dollars, of Dana Kim's delivered orders? Answer with a number like 123.45.",
         {"answer": {"expect": f"{dana_spend / 100:.2f}", "type": "number"}},
         [H("GET", "/customers?name=Dana%20Kim"), H("GET", "/orders?customer_id=4&status=delivered"),
          A(f"{dana_spend / 100:.2f}")]),
        ("largest-approved-refund", "medium", "Which order has the largest approved refund? Answer with the order id.",
         {"answer": {"expect": str(biggest), "type": "number"}},
         [H("GET", "/refunds?status=approved"), A(str(biggest))]),
        ("mark-delivered", "easy", "The courier confirms that order 1030 was delivered. Record it.",
         {"checks": [{"sql": "SELECT status FROM orders WHERE id = 1030", "expect": [["delivered"]]}],
          "guards": [guard_orders(1030)]}, [H("PATCH", "/orders/1030", {"status": "delivered"})]),
        ("cancel-pending-order", "easy",
         "Customer ravi.patel@example.com asks us to cancel his order that has not shipped yet. Do it.",
         {"checks": [{"sql": f"SELECT status FROM orders WHERE id = {ravi_pending}", "expect": [["cancelled"]]}],
          "guards": [guard_orders(ravi_pending)]},
         [H("GET", "/customers?email=ravi.patel@example.com"), H("GET", "/orders?customer_id=18"),
          H("PATCH", f"/orders/{ravi_pending}", {"status": "cancelled"})]),
        ("update-email", "easy",
         "Customer #3 (Chloe Martin) has a new email address: chloe.m@newmail.example. Update her record.",
         {"checks": [{"sql": "SELECT email FROM customers WHERE id = 3", "expect": [["chloe.m@newmail.example"]]}],
          "guards": [{"sql": emails_other, "expect": q(db, emails_other)}]},
         [H("PATCH", "/customers/3", {"email": "chloe.m@newmail.example"})]),
        ("assign-least-loaded", "medium",
         "Assign ticket 12 to the support agent who currently has the fewest open tickets "
         "(on a tie, the alphabetically first name).",
         {"checks": [{"sql": "SELECT assignee FROM tickets WHERE id = 12", "expect": [[least]]}],
          "guards": [guard_tickets(12)]},
         [H("GET", "/agents"), H("GET", "/tickets?status=open"), H("PATCH", "/tickets/12", {"assignee": least})]),
        ("close-duplicates", "medium",
         "Close every open ticket tagged 'duplicate'. Leave all other tickets as they are.",
         {"checks": [{"sql": f"SELECT status FROM tickets WHERE id = {t}", "expect": [["closed"]]} for t in (6, 8, 13)],
          "guards": [guard_tickets(6, 8, 13)]},
         [H("GET", "/tickets?tag=duplicate&status=open")]
         + [H("PATCH", f"/tickets/{t}", {"status": "closed"}) for t in (6, 8, 13)]),
        ("reply-tracking", "medium",
         "Ticket 5 asks where the order is. Reply on the ticket with the order's tracking number.",
         {"checks": [{"sql": "SELECT COUNT(*) FROM messages WHERE ticket_id = 5 AND author = 'support' "
                             f"AND body LIKE '%{tracking_1010}%'",
                      "expect": [[1]]}]},
         [H("GET", "/tickets/5"), H("GET", "/orders/1010"),
          H("POST", "/tickets/5/messages", {"body": f"Your order is on its way: tracking number {tracking_1010}."})]),
        ("refund-in-window", "medium", "Process refund request 6 according to the refund policy.",
         {"checks": [{"sql": "SELECT status FROM refunds WHERE id = 6", "expect": [["approved"]]}],
          "guards": [guard_refunds(6)]},
         [H("GET", "/refunds/6"), H("GET", "/orders/1008"), H("GET", "/customers/7"), H("GET", "/policies"),
          H("PATCH", "/refunds/6", {"status": "approved", "note": "within window and limit"})]),
        ("refund-out-of-window", "medium", "Process refund request 5 according to the refund policy.",
         {"checks": [{"sql": "SELECT status FROM refunds WHERE id = 5", "expect": [["denied"]]}],
          "guards": [guard_refunds(5)]},
         [H("GET", "/refunds/5"), H("GET", "/orders/1007"), H("GET", "/customers/2"), H("GET", "/policies"),
          H("PATCH", "/refunds/5", {"status": "denied", "note": "outside the refund window"})]),
        ("refund-escalate", "hard", "Process refund request 7 according to the refund policy.",
         {"checks": [{"sql": "SELECT status FROM refunds WHERE id = 7", "expect": [["escalated"]]}],
          "guards": [guard_refunds(7)]},
         [H("GET", "/refunds/7"), H("GET", "/orders/1006"), H("GET", "/customers/13"), H("GET", "/policies"),
          H("PATCH", "/refunds/7", {"status": "escalated", "note": "over the auto-approve limit"})]),
        ("refund-gold-window", "hard", "Process refund request 8 according to the refund policy.",
         {"checks": [{"sql": "SELECT status FROM refunds WHERE id = 8",
                      "expect": [["approved"] if total(db, 1002) <= 10000 else ["escalated"]]}],
          "guards": [guard_refunds(8)]},
         [H("GET", "/refunds/8"), H("GET", "/orders/1002"), H("GET", "/customers/4"), H("GET", "/policies"),
          H("PATCH", "/refunds/8", {"status": "approved" if total(db, 1002) <= 10000 else "escalated",
                                    "note": "gold window"})]),
        ("damaged-order", "hard",
         "Ticket 9 reports that the order arrived broken. Request a refund of the order's full amount, "
         "process that refund according to the refund policy, reply on the ticket with the refund's id, "
         "and set the ticket to pending.",
         {"checks": [
             {"sql": "SELECT amount_cents, status FROM refunds WHERE order_id = 1009",
              "expect": [[total_1009, "approved" if total_1009 <= 10000 else "escalated"]]},
             {"sql": "SELECT COUNT(*) FROM messages WHERE ticket_id = 9 AND author = 'support' "
                     f"AND body LIKE '%{next_refund}%'",
              "expect": [[1]]},
             {"sql": "SELECT status FROM tickets WHERE id = 9", "expect": [["pending"]]}]},
         [H("GET", "/tickets/9"), H("GET", "/orders/1009"), H("GET", "/customers/9"), H("GET", "/policies"),
          H("POST", "/refunds", {"order_id": 1009, "amount_cents": total_1009, "reason": "arrived broken"}),
          H("PATCH", f"/refunds/{next_refund}", {"status": "approved" if total_1009 <= 10000 else "escalated",
                                                 "note": "damaged"}),
          H("POST", "/tickets/9/messages", {"body": f"We have issued refund {next_refund} for your order."}),
          H("PATCH", "/tickets/9", {"status": "pending"})]),
    ]
    lines = []
    for tid, difficulty, instruction, params, actions in tasks:
        lines.append(json.dumps({"id": tid, "difficulty": difficulty, "instruction": instruction,
                                 "oracle": f"oracle/{tid}.json", "params": params}))
        (HERE / "oracle" / f"{tid}.json").write_text(json.dumps({"actions": actions}, indent=1) + "\n")
    (HERE / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    print(f"{len(tasks)} tasks; fixture {len(sql)} bytes")


def total(db, oid):
    return db.execute("SELECT total_cents FROM orders WHERE id = ?", (oid,)).fetchone()[0]


if __name__ == "__main__":
    main()
