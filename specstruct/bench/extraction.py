"""Typed extraction workloads: realistic passages and the Pydantic models to extract into.

Extraction is the structured-output job where speculation should shine: most of the answer is JSON
punctuation and keys (forced by the grammar) or spans copied from the passage (found by prompt lookup).
Every value a model should extract appears verbatim in its passage, as in real extraction.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class Person(BaseModel):
    name: str
    age: int | None = None
    occupation: str
    city: str
    email: str | None = None


class LineItem(BaseModel):
    description: str
    quantity: int
    unit_price: float


class Invoice(BaseModel):
    invoice_number: str
    vendor: str
    customer: str
    issue_date: str = Field(description="ISO date, YYYY-MM-DD")
    items: list[LineItem]
    total: float
    currency: str


class Event(BaseModel):
    title: str
    date: str = Field(description="ISO date, YYYY-MM-DD")
    start_time: str = Field(description="24-hour time, HH:MM")
    venue: str
    city: str
    organizer: str
    speakers: list[str]


class Contact(BaseModel):
    name: str
    company: str
    phone: str
    email: str


class Meeting(BaseModel):
    subject: str
    attendees: list[Contact]
    date: str = Field(description="ISO date, YYYY-MM-DD")
    location: str


PASSAGES: list[tuple[str, type[BaseModel], str]] = [
    (
        "person-hopper",
        Person,
        "Grace Hopper, 85, was a computer scientist and United States Navy rear admiral who lived in "
        "Arlington. Colleagues wrote to her at grace.hopper@navy.example.mil about the COBOL standard.",
    ),
    (
        "person-okafor",
        Person,
        "Dr. Chinwe Okafor is a pediatric surgeon at Lagos University Teaching Hospital. The 47-year-old "
        "lives in Lagos and answers patient questions at c.okafor@luth.example.ng on Fridays.",
    ),
    (
        "person-lindqvist",
        Person,
        "Erik Lindqvist, a 31-year-old marine biologist based in Gothenburg, spends most summers counting "
        "harbour porpoises in the Kattegat. He does not publish an email address.",
    ),
    (
        "invoice-acme",
        Invoice,
        "INVOICE INV-2024-0193\nFrom: Acme Office Supplies Ltd.\nBill to: Northwind Traders\n"
        "Date: 2024-03-15\n\n3 x Ergonomic chair @ 249.00\n10 x A4 paper ream @ 4.50\n"
        "2 x Standing desk @ 399.99\n\nTotal due: 1592.98 EUR",
    ),
    (
        "invoice-cloud",
        Invoice,
        "Bluefin Cloud Hosting - invoice BF-88213, issued 2023-11-01 to Riverbend Analytics.\n"
        "Line items: 1 x Dedicated server (monthly) at 180.00; 4 x Extra IPv4 address at 2.50; "
        "500 x Backup storage GB at 0.02.\nAmount payable: 200.00 USD.",
    ),
    (
        "invoice-bakery",
        Invoice,
        "Receipt no. 5567 from Le Petit Four bakery for Hotel Belvedere, dated 2024-06-02: "
        "40 croissants at 1.20 each, 12 baguettes at 1.10 each, 6 fruit tarts at 14.50 each. "
        "Total 148.20 CHF.",
    ),
    (
        "event-pycon",
        Event,
        "PyData Berlin 2024 opens on 2024-04-22 at 09:30 in the bcc Berlin Congress Center, Berlin. "
        "The conference is organised by NumFOCUS and features keynotes by Ines Montani and "
        "Wes McKinney.",
    ),
    (
        "event-concert",
        Event,
        "The Helsinki Philharmonic Orchestra presents 'Sibelius at Dusk' on 2025-01-18, doors at 19:00, "
        "in the Helsinki Music Centre, Helsinki. Soloists: Pekka Kuusisto and Elina Vähälä.",
    ),
    (
        "event-meetup",
        Event,
        "Rust Lisboa meetup #12 - 2024-09-05, starting 18:30 at the LX Factory, Lisbon. Hosted by "
        "Rust Lisboa; talks from Ana Ferreira (async runtimes) and Tiago Silva (embedded Rust).",
    ),
    (
        "meeting-vendors",
        Meeting,
        "Subject: Q3 vendor review. On 2024-07-09 we met in conference room 4B with Maria Gonzalez "
        "(Globex Corporation, +1 555 0142, maria.gonzalez@globex.example.com) and Kenji Sato "
        "(Initech, +81 3 5555 0199, k.sato@initech.example.jp).",
    ),
]


def extraction_prompt(model: type[BaseModel], passage: str) -> str:
    """The user message: what to extract, then the passage (so prompt lookup can find copied spans)."""
    return (
        f"Extract the {model.__name__.lower()} described in the text below as JSON. Copy names, numbers "
        f"and dates exactly as written; use null for anything missing.\n\nText:\n{passage}"
    )
