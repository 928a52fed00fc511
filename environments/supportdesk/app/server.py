"""supportdesk: a customer-support back office as a JSON HTTP API over SQLite.

Runs inside the sandbox: python3 server.py (the database is at $ENVKIT_DB, the port is
$ENVKIT_PORT; it listens on 127.0.0.1 only). Every request opens its own connection, so the
database can be restored underneath the running server. "Now" is the fixture's clock
(meta.now), so the same actions always give the same rows.
"""

import json
import os
import re
import sqlite3
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

DB = os.environ.get("ENVKIT_DB", "supportdesk.sqlite")
PORT = int(os.environ.get("ENVKIT_PORT", "8080"))

ORDER_TRANSITIONS = {"pending": {"cancelled"}, "shipped": {"delivered"}}
REFUND_STATUSES = {"approved", "denied", "escalated"}
TICKET_STATUSES = {"open", "pending", "closed"}


class ApiError(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


def connect():
    conn = sqlite3.connect(DB, timeout=10)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


def rows(cur):
    return [dict(r) for r in cur.fetchall()]


def one(conn, sql, args, what):
    row = conn.execute(sql, args).fetchone()
    if row is None:
        raise ApiError(404, f"{what} not found")
    return dict(row)


def now(conn):
    return conn.execute("SELECT value FROM meta WHERE key = 'now'").fetchone()[0]


def filters(query, allowed):
    where, args = [], []
    for key in allowed:
        if key in query:
            where.append(f"{key} = ?")
            args.append(query[key])
    return (" WHERE " + " AND ".join(where)) if where else "", args


def require(body, *fields):
    missing = [f for f in fields if f not in body]
    if missing:
        raise ApiError(400, f"missing field(s): {', '.join(missing)}")


# -- handlers: (method, pattern) -> function(conn, match, query, body) -------------------
def list_customers(conn, m, q, b):
    where, args = filters(q, ["email", "tier", "name"])
    return rows(conn.execute(f"SELECT * FROM customers{where} ORDER BY id", args))


def get_customer(conn, m, q, b):
    return one(conn, "SELECT * FROM customers WHERE id = ?", (int(m[1]),), "customer")


def patch_customer(conn, m, q, b):
    cust = get_customer(conn, m, q, b)
    for field in ("email", "phone"):
        if field in b:
            if not isinstance(b[field], str) or not b[field]:
                raise ApiError(400, f"{field} must be a non-empty string")
            cust[field] = b[field]
    conn.execute("UPDATE customers SET email = ?, phone = ? WHERE id = ?", (cust["email"], cust["phone"], cust["id"]))
    return cust


def list_orders(conn, m, q, b):
    where, args = filters(q, ["customer_id", "status"])
    return rows(conn.execute(f"SELECT * FROM orders{where} ORDER BY id", args))


def get_order(conn, m, q, b):
    order = one(conn, "SELECT * FROM orders WHERE id = ?", (int(m[1]),), "order")
    order["items"] = rows(conn.execute("SELECT sku, name, qty, unit_cents FROM order_items WHERE order_id = ? "
                                       "ORDER BY sku", (order["id"],)))
    return order


def patch_order(conn, m, q, b):
    order = get_order(conn, m, q, b)
    require(b, "status")
    allowed = ORDER_TRANSITIONS.get(order["status"], set())
    if b["status"] not in allowed:
        raise ApiError(409, f"an order that is {order['status']} cannot become {b['status']}")
    conn.execute("UPDATE orders SET status = ?, updated_at = ? WHERE id = ?", (b["status"], now(conn), order["id"]))
    return get_order(conn, m, q, b)


def list_refunds(conn, m, q, b):
    where, args = filters(q, ["order_id", "status"])
    return rows(conn.execute(f"SELECT * FROM refunds{where} ORDER BY id", args))


def get_refund(conn, m, q, b):
    return one(conn, "SELECT * FROM refunds WHERE id = ?", (int(m[1]),), "refund")


def create_refund(conn, m, q, b):
    require(b, "order_id", "amount_cents", "reason")
    order = one(conn, "SELECT * FROM orders WHERE id = ?", (int(b["order_id"]),), "order")
    amount = b["amount_cents"]
    if not isinstance(amount, int) or amount <= 0:
        raise ApiError(400, "amount_cents must be a positive integer")
    taken = conn.execute("SELECT COALESCE(SUM(amount_cents), 0) FROM refunds WHERE order_id = ? AND status != 'denied'",
                         (order["id"],)).fetchone()[0]
    if taken + amount > order["total_cents"]:
        raise ApiError(409, f"refunds would exceed the order total ({order['total_cents']} cents, "
                            f"{taken} already refunded)")
    cur = conn.execute("INSERT INTO refunds (order_id, amount_cents, reason, status, note, created_at) "
                       "VALUES (?, ?, ?, 'requested', '', ?)",
                       (order["id"], amount, str(b["reason"]), now(conn)))
    return get_refund(conn, [None, cur.lastrowid], q, b)


def patch_refund(conn, m, q, b):
    refund = get_refund(conn, m, q, b)
    require(b, "status")
    if refund["status"] != "requested":
        raise ApiError(409, f"refund {refund['id']} is already {refund['status']}")
    if b["status"] not in REFUND_STATUSES:
        raise ApiError(400, f"status must be one of {sorted(REFUND_STATUSES)}")
    conn.execute("UPDATE refunds SET status = ?, note = ? WHERE id = ?",
                 (b["status"], str(b.get("note", "")), refund["id"]))
    return get_refund(conn, m, q, b)


def list_policies(conn, m, q, b):
    return rows(conn.execute("SELECT * FROM policies ORDER BY key"))


def get_policy(conn, m, q, b):
    return one(conn, "SELECT * FROM policies WHERE key = ?", (m[1],), "policy")


def list_tickets(conn, m, q, b):
    where, args = filters(q, ["status", "customer_id", "assignee", "tag"])
    return rows(conn.execute(f"SELECT * FROM tickets{where} ORDER BY id", args))


def get_ticket(conn, m, q, b):
    ticket = one(conn, "SELECT * FROM tickets WHERE id = ?", (int(m[1]),), "ticket")
    ticket["messages"] = rows(conn.execute("SELECT id, author, body, created_at FROM messages WHERE ticket_id = ? "
                                           "ORDER BY id", (ticket["id"],)))
    return ticket


def patch_ticket(conn, m, q, b):
    ticket = get_ticket(conn, m, q, b)
    if "status" in b and b["status"] not in TICKET_STATUSES:
        raise ApiError(400, f"status must be one of {sorted(TICKET_STATUSES)}")
    if "assignee" in b and conn.execute("SELECT 1 FROM agents WHERE name = ?", (b["assignee"],)).fetchone() is None:
        raise ApiError(400, f"no agent named {b['assignee']!r}")
    conn.execute("UPDATE tickets SET status = ?, assignee = ? WHERE id = ?",
                 (b.get("status", ticket["status"]), b.get("assignee", ticket["assignee"]), ticket["id"]))
    return get_ticket(conn, m, q, b)


def post_message(conn, m, q, b):
    ticket = get_ticket(conn, m, q, b)
    require(b, "body")
    if not isinstance(b["body"], str) or not b["body"].strip():
        raise ApiError(400, "body must be a non-empty string")
    conn.execute("INSERT INTO messages (ticket_id, author, body, created_at) VALUES (?, 'support', ?, ?)",
                 (ticket["id"], b["body"], now(conn)))
    return get_ticket(conn, m, q, b)


def list_agents(conn, m, q, b):
    return rows(conn.execute("SELECT * FROM agents ORDER BY name"))


ROUTES = [
    ("GET", r"/customers", list_customers), ("GET", r"/customers/(\d+)", get_customer),
    ("PATCH", r"/customers/(\d+)", patch_customer),
    ("GET", r"/orders", list_orders), ("GET", r"/orders/(\d+)", get_order), ("PATCH", r"/orders/(\d+)", patch_order),
    ("GET", r"/refunds", list_refunds), ("GET", r"/refunds/(\d+)", get_refund), ("POST", r"/refunds", create_refund),
    ("PATCH", r"/refunds/(\d+)", patch_refund),
    ("GET", r"/policies", list_policies), ("GET", r"/policies/([a-z_]+)", get_policy),
    ("GET", r"/tickets", list_tickets), ("GET", r"/tickets/(\d+)", get_ticket),
    ("PATCH", r"/tickets/(\d+)", patch_ticket),
    ("POST", r"/tickets/(\d+)/messages", post_message),
    ("GET", r"/agents", list_agents),
]


class Handler(BaseHTTPRequestHandler):
    server_version = "supportdesk/1.0"

    def log_message(self, fmt, *args):
        pass

    def _send(self, status, payload):
        data = json.dumps(payload, sort_keys=True).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, method):
        url = urlparse(self.path)
        if method == "GET" and url.path == "/health":
            return self._send(200, {"status": "ok"})
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        body = {}
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            try:
                body = json.loads(self.rfile.read(length))
                if not isinstance(body, dict):
                    raise ValueError
            except ValueError:
                return self._send(400, {"error": "the body must be a JSON object"})
        known_path = False
        for verb, pattern, fn in ROUTES:
            m = re.fullmatch(pattern, url.path)
            if m is None:
                continue
            known_path = True
            if verb != method:
                continue
            conn = connect()
            try:
                result = fn(conn, m, query, body)
                conn.commit()
                return self._send(201 if method == "POST" else 200, result)
            except ApiError as e:
                conn.rollback()
                return self._send(e.status, {"error": e.message})
            finally:
                conn.close()
        return self._send(405 if known_path else 404, {"error": f"no route {method} {url.path}"})

    def do_GET(self):
        self._handle("GET")

    def do_POST(self):
        self._handle("POST")

    def do_PATCH(self):
        self._handle("PATCH")


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
