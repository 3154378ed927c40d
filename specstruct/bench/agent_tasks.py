"""The agent scenario's world: a customer-support agent's system prompt, its six tools, a small shop's records the
tools answer from, and the customers' requests that start each episode.

Every turn of every episode sends the same system prompt and tools; later turns repeat the earlier ones and add the
tool results, as an agent loop does. The tools answer deterministically from the records below (an unknown id gets an
error result, as a real backend would answer), so a run is reproducible and both sides of the benchmark see the same
turns. `tool_choice(episode, turn)` is each turn's tool_choice: "required" on the turns the playbook must act on
(agent.py says why), "auto" after them.

    result = call_tool("lookup_order", {"order_id": "A-10442"})
"""

from __future__ import annotations

from typing import Any, Callable

JSON = dict[str, Any]  # a JSON object: a tool's schema, a call's arguments, a tool's result

SYSTEM = (
    "You are Bean & Kettle's customer-support agent. Bean & Kettle is an online shop for coffee, tea and brewing "
    "equipment that ships from warehouses in Denver and Columbus. You help customers by looking up their orders, "
    "tracking shipments, checking stock, explaining store policy and issuing refunds.\n\n"
    "Rules:\n"
    "1. Always look up an order with lookup_order before you talk about it, track it or refund it; never guess an "
    "order's contents, status or tracking number.\n"
    "2. To say where a parcel is, call track_shipment with the carrier and tracking number from the order.\n"
    "3. Check store policy with search_policy before you refuse or allow a return, a cancellation or a refund.\n"
    "4. You may refund up to 200.00 USD per order without approval, and only for items on the order. For a damaged "
    "or wrong item, refund that item's price; for a late delivery, refund the shipping charge.\n"
    "5. After issuing a refund, send the customer a short confirmation with send_email to the order's email address.\n"
    "6. Call tools only when you need their answer. When you have what you need, reply to the customer in two to four "
    "friendly sentences, without mentioning tools or internal rules."
)


def _tool(name: str, description: str, properties: JSON, required: list[str]) -> JSON:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required, "additionalProperties": False}}}


TOOLS: list[JSON] = [
    _tool("lookup_order", "Look up an order by its id: status, items, charges, carrier, tracking number and the "
          "customer's email.", {"order_id": {"type": "string", "description": "the order id, e.g. A-10442"}},
          ["order_id"]),
    _tool("track_shipment", "Tracking events of a parcel.",
          {"carrier": {"type": "string", "enum": ["UPS", "FedEx", "USPS", "DHL"]},
           "tracking_number": {"type": "string"}}, ["carrier", "tracking_number"]),
    _tool("check_inventory", "Units in stock of a product at one warehouse, and the next restock date.",
          {"sku": {"type": "string", "description": "the product's SKU, e.g. FP-1200"},
           "warehouse": {"type": "string", "enum": ["Denver", "Columbus"]}}, ["sku", "warehouse"]),
    _tool("search_policy", "Search the store's policies (returns, refunds, cancellations, shipping) for a question.",
          {"query": {"type": "string"}}, ["query"]),
    _tool("issue_refund", "Refund an amount on an order to the customer's original payment method.",
          {"order_id": {"type": "string"}, "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 200},
           "reason": {"type": "string", "enum": ["damaged", "wrong_item", "late_delivery", "duplicate_charge",
                                                 "other"]}}, ["order_id", "amount", "reason"]),
    _tool("send_email", "Send an email to a customer.",
          {"to": {"type": "string"}, "subject": {"type": "string"}, "body": {"type": "string"}},
          ["to", "subject", "body"]),
]

ORDERS: dict[str, JSON] = {
    "A-10442": {"order_id": "A-10442", "status": "shipped", "placed": "2025-03-02", "email": "jordan.lee@example.com",
                "items": [{"sku": "CB-ETH-500", "name": "Ethiopia Guji whole beans, 500 g", "quantity": 2,
                           "price": 18.50}],
                "shipping": 6.95, "total": 43.95, "carrier": "UPS", "tracking_number": "1Z84X2E70391552046",
                "promised_delivery": "2025-03-07", "charges": [{"date": "2025-03-02", "amount": 43.95}]},
    "A-10518": {"order_id": "A-10518", "status": "delivered", "placed": "2025-03-04", "email": "m.santos@example.org",
                "items": [{"sku": "FP-1200", "name": "French press, 12 cup", "quantity": 1, "price": 39.00},
                          {"sku": "MUG-ST-2", "name": "Stoneware mug, set of 2", "quantity": 1, "price": 24.00}],
                "shipping": 0.0, "total": 63.00, "carrier": "FedEx", "tracking_number": "7749 1182 0032",
                "delivered": "2025-03-08", "charges": [{"date": "2025-03-04", "amount": 63.00}]},
    "A-10601": {"order_id": "A-10601", "status": "processing", "placed": "2025-03-09", "email": "priya.k@example.net",
                "items": [{"sku": "GR-BURR-1", "name": "Conical burr grinder", "quantity": 1, "price": 129.00}],
                "shipping": 0.0, "total": 129.00, "carrier": None, "tracking_number": None,
                "charges": [{"date": "2025-03-09", "amount": 129.00}, {"date": "2025-03-09", "amount": 129.00}]},
}

TRACKING = {
    "1Z84X2E70391552046": {"carrier": "UPS", "status": "in transit, delayed", "events": [
        {"time": "2025-03-03 18:40", "place": "Denver, CO", "event": "Picked up"},
        {"time": "2025-03-05 02:15", "place": "Salt Lake City, UT", "event": "Departed facility"},
        {"time": "2025-03-06 21:05", "place": "Sacramento, CA", "event": "Delayed: severe weather"}],
        "estimated_delivery": "2025-03-11"},
    "7749 1182 0032": {"carrier": "FedEx", "status": "delivered", "events": [
        {"time": "2025-03-08 13:22", "place": "Austin, TX", "event": "Delivered, left at front door"}]},
}

STOCK = {("FP-1200", "Denver"): (0, "2025-03-20"), ("FP-1200", "Columbus"): (14, None),
         ("GR-BURR-1", "Denver"): (3, None), ("GR-BURR-1", "Columbus"): (0, "2025-04-02")}

POLICIES = [
    ("damaged", "Damaged or defective items: report within 30 days of delivery; we refund the item's price or send a "
                "replacement, and the customer does not need to return the item."),
    ("return", "Returns: unopened equipment may be returned within 30 days of delivery for a full refund. Opened "
               "coffee and tea cannot be returned unless they are damaged or were sent in error."),
    ("cancel", "Cancellations: an order can be cancelled free of charge while its status is 'processing'; once it "
               "has shipped it must be returned instead."),
    ("late", "Late deliveries: when a parcel arrives more than two days after the promised date, we refund the "
             "shipping charge on request."),
    ("charge", "Duplicate charges: a second identical charge on the same day is an error; refund it in full (it "
               "counts toward the 200.00 USD limit) and apologise."),
]

REQUESTS = [
    "Hi, my order A-10442 was supposed to arrive on Friday and it still isn't here. Where is it?",
    "Order A-10518 came yesterday but one of the two mugs in the mug set was cracked. Can I get my money back for "
    "the set?",
    "Do you have the 12-cup French press (FP-1200) in stock in Denver? I'd like to pick one up next week.",
    "I was charged twice for order A-10601 on the same day. Please fix this.",
    "Can I still cancel order A-10601? I found a grinder locally.",
    "I opened a bag of your Ethiopia beans and don't like the taste. Can I return it?",
]

# How many opening turns of each request the playbook says must act (a tool call, tool_choice "required"), as the
# rules above lay them out: the order first, then tracking (a late parcel), a refund and its confirmation email (a
# damaged item, a double charge), the stock (a product question) or the policy (a cancellation, a return). The
# model picks which tool; the turns after these are "auto", where it answers the customer.
FORCED_TURNS = [2, 3, 1, 3, 2, 1]


def tool_choice(episode: int, turn: int) -> str:
    """The `tool_choice` of an episode's turn (both from 0): "required" while the playbook needs an action, then
    "auto"."""
    return "required" if turn < FORCED_TURNS[episode % len(FORCED_TURNS)] else "auto"


def lookup_order(order_id: str) -> JSON:
    return ORDERS.get(order_id.strip().upper(), {"error": f"no order with id {order_id!r}"})


def track_shipment(carrier: str, tracking_number: str) -> JSON:
    found = TRACKING.get(tracking_number.strip())
    if found is None or found["carrier"] != carrier:
        return {"error": f"no {carrier} parcel with tracking number {tracking_number!r}"}
    return found


def check_inventory(sku: str, warehouse: str) -> JSON:
    units, restock = STOCK.get((sku.strip().upper(), warehouse), (None, None))
    if units is None:
        return {"error": f"unknown SKU {sku!r}"}
    return {"sku": sku, "warehouse": warehouse, "units": units, "next_restock": restock}


def search_policy(query: str) -> JSON:
    words = query.lower()
    hits = [text for key, text in POLICIES if key in words] or [text for _, text in POLICIES[:2]]
    return {"results": hits}


def issue_refund(order_id: str, amount: float, reason: str) -> JSON:
    order = ORDERS.get(order_id.strip().upper())
    if order is None:
        return {"error": f"no order with id {order_id!r}"}
    if amount > order["total"]:
        return {"error": f"the refund {amount:.2f} exceeds the order total {order['total']:.2f}"}
    return {"refund_id": f"RF-{order['order_id'][2:]}-{int(round(amount * 100))}", "order_id": order["order_id"],
            "amount": round(amount, 2), "reason": reason, "status": "issued"}


def send_email(to: str, subject: str, body: str) -> JSON:
    return {"status": "sent", "to": to}


IMPLEMENTATIONS: dict[str, Callable[..., JSON]] = {
    "lookup_order": lookup_order, "track_shipment": track_shipment, "check_inventory": check_inventory,
    "search_policy": search_policy, "issue_refund": issue_refund, "send_email": send_email,
}


def call_tool(name: str, arguments: JSON) -> JSON:
    """The tool's answer to a call (a valid call: a bound tool, arguments matching its schema)."""
    return IMPLEMENTATIONS[name](**arguments)
