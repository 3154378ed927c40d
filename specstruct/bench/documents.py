"""The document scenario's data: one- to two-page documents (1,000-3,000 tokens) and the record to extract from each.

Typed extraction from a real document is almost all prefill: the answer is a few hundred tokens, the prompt ten times
that. The documents (data/documents/*.md) are written as their kind is in practice: a commercial lease excerpt, a
hospital discharge summary, an incident post-mortem, a product recall notice, a job offer letter and an earnings-call
transcript. Every field of each record is stated in its document (dates as the document writes them).

    for name, model, text in documents(): ...
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from pydantic import BaseModel, Field


class Lease(BaseModel):
    landlord: str
    tenant: str
    premises_address: str
    suite: str
    rentable_square_feet: int
    commencement_date: str
    expiration_date: str
    term_months: int
    monthly_base_rent: float
    annual_increase_percent: float
    security_deposit: float
    renewal_options: int
    renewal_term_years: int
    permitted_use: str = Field(description="a few words")
    governing_law_state: str


class Medication(BaseModel):
    name: str
    dose: str
    frequency: str


class FollowUp(BaseModel):
    clinician: str
    date: str


class DischargeSummary(BaseModel):
    patient_name: str
    medical_record_number: str
    admission_date: str
    discharge_date: str
    attending_physician: str
    principal_diagnosis: str
    secondary_diagnoses: list[str]
    allergies: list[str]
    discharge_medications: list[Medication]
    follow_up: list[FollowUp]


class ActionItem(BaseModel):
    action: str = Field(description="a short summary")
    owner: str
    due: str


class PostMortem(BaseModel):
    incident_id: str
    severity: str
    incident_commander: str
    impact_start_utc: str
    impact_end_utc: str
    duration_minutes: int
    services_affected: list[str]
    failed_payment_attempts: int
    root_cause: str = Field(description="one sentence")
    detected_by: str
    action_items: list[ActionItem]


class Recall(BaseModel):
    recall_number: str
    recall_date: str
    product: str
    manufacturer: str
    model_numbers: list[str]
    units_us: int
    units_canada: int
    hazard: str
    incidents_reported: int
    injuries_reported: int
    retailers: list[str]
    sold_from: str
    sold_until: str
    remedy: str
    consumer_phone: str


class JobOffer(BaseModel):
    candidate: str
    company: str
    position: str
    manager: str
    start_date: str
    office_city: str
    base_salary: float
    currency: str
    target_bonus_percent: float
    share_options: int
    vesting_years: int
    relocation_allowance: float
    holiday_days: int
    probation_months: int
    offer_expires: str


class Segment(BaseModel):
    name: str
    revenue_millions: float
    growth_percent: float


class EarningsCall(BaseModel):
    company: str
    ticker: str
    quarter: str
    ceo: str
    cfo: str
    revenue_millions: float
    revenue_growth_percent: float
    gross_margin_percent: float
    gaap_diluted_eps: float
    adjusted_diluted_eps: float
    segments: list[Segment]
    backlog_billions: float
    next_quarter_revenue_low_millions: float
    next_quarter_revenue_high_millions: float
    quarterly_dividend: float


# (file in data/documents, record type), in the order the scenario runs them
DOCUMENTS: list[tuple[str, type[BaseModel]]] = [
    ("commercial_lease", Lease),
    ("discharge_summary", DischargeSummary),
    ("incident_postmortem", PostMortem),
    ("product_recall", Recall),
    ("job_offer", JobOffer),
    ("earnings_call", EarningsCall),
]


@lru_cache(maxsize=None)
def document_text(name: str) -> str:
    """A document's text, read from the installed package."""
    return resources.files("specstruct.bench").joinpath("data", "documents", f"{name}.md").read_text(encoding="utf-8")


def documents(limit: int | None = None) -> list[tuple[str, type[BaseModel], str]]:
    """(name, record type, text) for the first `limit` documents (all by default)."""
    return [(name, model, document_text(name)) for name, model in DOCUMENTS[:limit]]


def document_prompt(model: type[BaseModel], text: str) -> str:
    return (f"Extract a {model.__name__} record from the document below. Copy names, numbers and dates as the "
            "document states them; do not invent values.\n\n"
            f"<document>\n{text.strip()}\n</document>")
